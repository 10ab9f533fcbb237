"""xpuctl subcommands, one module each; each has ``register(subparsers)``. healthd/cli.py lists them."""
