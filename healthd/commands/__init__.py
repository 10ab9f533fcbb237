"""xpuctl subcommands, one module each; each has ``register(subparsers)``. Adding one is one line here."""

from __future__ import annotations

from healthd.commands import faults, health, hook, simulate, topology

COMMANDS = (simulate, faults, health, hook, topology)
