"""xpu-device-plugin: the kubelet device plugin for xpu-healthd (see docs/kubernetes.md)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence

import structlog

from container.core.logs import configure_logging
from container.deviceplugin.config import ConfigError, PluginConfig, build_parser, load
from container.deviceplugin.plugin import Plugin


async def serve(config: PluginConfig) -> None:
    plugin = Plugin(config)  # made on the running loop: its gRPC channels belong to it
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    structlog.get_logger("deviceplugin").info(
        "starting",
        healthd=plugin.config.healthd_socket,
        admin=plugin.config.admin_address,
        kubelet_dir=str(plugin.config.kubelet_dir),
        domain=plugin.config.domain,
    )
    await plugin.run(stop)
    structlog.get_logger("deviceplugin").info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load(args)
    except ConfigError as exc:
        print(f"xpu-device-plugin: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
