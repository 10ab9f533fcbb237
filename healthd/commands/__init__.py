"""xpuctl subcommands, one module each; each has ``register(subparsers)``. Adding one is one line here."""

from __future__ import annotations

from healthd.commands import partitions, simulate

COMMANDS = (simulate, partitions)
