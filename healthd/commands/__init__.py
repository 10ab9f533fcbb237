"""xpuctl subcommands, one module each; each has ``register(subparsers)``. Adding one is one line here."""

from __future__ import annotations

from healthd.commands import alert_webhook, faults, health, hook, partitions, simulate, topology, web

COMMANDS = (simulate, faults, health, hook, partitions, topology, alert_webhook, web)
