"""xpu-dra-driver: the Kubernetes DRA driver gpu.xpu-runtime-kit.io for xpu-healthd (see docs/kubernetes.md).

Exit status: 0 after SIGTERM/SIGINT, 1 when kubelet refused the registration, 2 for a bad option or config file.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence

import structlog
from kubernetes import config as kube_config

from container.core.logs import configure_logging
from container.dra.config import ConfigError, DriverConfig, build_parser, load
from container.dra.driver import Driver, RegistrationRefusedError
from container.dra.kubeapi import KubeApi


async def serve(config: DriverConfig, kube: KubeApi) -> int:
    driver = Driver(config, kube)  # made on the running loop: its gRPC channels belong to it
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log = structlog.get_logger("dra")
    log.info(
        "starting",
        healthd=config.healthd_socket,
        admin=config.admin_address,
        node=config.node_name,
        registry_dir=str(config.registry_dir),
        plugin_dir=str(config.plugin_dir),
    )
    try:
        await driver.run(stop)
    except RegistrationRefusedError as exc:
        log.error("stopping: kubelet refused the registration", error=str(exc))
        return 1
    finally:
        kube.close()
    log.info("stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load(args)
    except ConfigError as exc:
        print(f"xpu-dra-driver: {exc}", file=sys.stderr)
        return 2
    try:
        kube = KubeApi.connect(config.node_name, config.kubeconfig)
    except (kube_config.ConfigException, OSError, ValueError) as exc:
        where = f"--kubeconfig {config.kubeconfig}" if config.kubeconfig else "in-cluster credentials"
        print(f"xpu-dra-driver: {where}: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    return asyncio.run(serve(config, kube))


if __name__ == "__main__":
    raise SystemExit(main())
