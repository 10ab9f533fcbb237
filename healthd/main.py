"""xpu-healthd: wire the backend, sampler, HTTP endpoint and gRPC server together and run until signalled."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog
from prometheus_client.registry import CollectorRegistry

from exporter.backends.select import choose_backend
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import Collector, SnapshotExporter, default_collectors
from exporter.collectors.dcgm_compat import DcgmCompatCollector
from exporter.exposition import ExpositionCache
from exporter.http import Health, MetricsHTTPServer, parse_listen_address
from exporter.sampler import Sampler, SamplerConfig
from exporter.status_page import render_status_page
from exporter.version import VERSION
from healthd.attribution import AttributionStack
from healthd.config import DEFAULT_CONFIG_PATH, Config, ConfigError, load_config, with_overrides
from healthd.faults import service as health_service
from healthd.faults.engine import FaultEngine
from healthd.faults.journal import Journal
from healthd.faults.runtime import JOURNAL_FILE, FaultRuntime
from healthd.lifecycle import Lifecycle
from healthd.logs import configure_logging
from healthd.partition.planner import topology_aware
from healthd.partition.wiring import Partitions
from healthd.probes import default_probes, xid_watcher
from healthd.probes.runner import ProbeRunner
from healthd.server import GrpcServer, Service
from healthd.simulation import SimulationService
from healthd.status_rows import status_providers
from healthd.systemd import Notifier
from healthd.topology_wiring import build_topology
from healthd.transport import check_transport, is_tcp, load_grpc_tls, load_metrics_web_config, socket_group_id

log = structlog.get_logger("main")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpu-healthd", description="GPU node daemon: metrics, health, partitions.")
    p.add_argument("--config", type=Path, help=f"TOML config file (e.g. {DEFAULT_CONFIG_PATH})")
    p.add_argument(
        "--simulate",
        nargs="?",
        const="h200x8",
        metavar="SCENARIO",
        help="run on a simulated node: h200x8 (default), h200x8-busy (400 processes in 100 pods), h200x1, "
        "or a scenario file",
    )
    p.add_argument("--metrics-listen", metavar="ADDR", help="HTTP address for /metrics (default :9410)")
    p.add_argument(
        "--grpc-listen", metavar="ADDR", action="append", help="gRPC address, unix:PATH or HOST:PORT (repeatable)"
    )
    p.add_argument("--state-dir", type=Path, metavar="DIR", help="state directory (default /var/lib/xpu-runtime-kit)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--check-config", action="store_true", help="validate the configuration and exit")
    p.add_argument("--version", action="version", version=f"xpu-healthd {VERSION}")
    return p


def resolve_config(args: argparse.Namespace) -> Config:
    config = load_config(args.config)
    return with_overrides(
        config,
        simulate=args.simulate,
        metrics_listen=args.metrics_listen,
        grpc_listen=tuple(args.grpc_listen) if args.grpc_listen else None,
        state_dir=args.state_dir,
        log_level=args.log_level,
    )


def snapshot_health(sampler: Sampler, stale_after: float) -> Health:
    snap = sampler.latest()
    if snap is None:
        return Health(False, "no sample yet")
    if not snap.backend_up:
        return Health(False, f"GPU backend down: {snap.backend_error}")
    age = time.time() - snap.taken_at
    if age > stale_after:
        return Health(False, f"samples are stale: last one {age:.1f}s ago (limit {stale_after:.1f}s)")
    stuck = [g.index for g in snap.gpus if not g.fresh]
    return Health(True, "ok" + (f"; GPUs not answering: {stuck}" if stuck else ""))


def build_collectors(config: Config, last_xid: Callable[[], Mapping[int, int]] | None = None) -> list[Collector]:
    collectors = default_collectors()
    if config.exporter.dcgm_compat:  # dcgm-exporter names; Hostname as dcgm-exporter sets it in Kubernetes
        collectors.append(DcgmCompatCollector(os.environ.get("NODE_NAME") or socket.gethostname(), last_xid))
    return collectors


def last_xid_per_gpu(engine: FaultEngine) -> Callable[[], Mapping[int, int]]:
    """The XID of each card's most recent active XID fault, for dcgm-exporter's DCGM_FI_DEV_XID_ERRORS."""

    def read() -> Mapping[int, int]:
        latest: dict[int, tuple[float, int]] = {}
        for fault in engine.active_faults():
            xid = fault.evidence.get("xid", "")
            if fault.gpu is None or not fault.code.startswith("xid_") or not xid.isdigit():
                continue
            if fault.gpu.index not in latest or fault.last_seen >= latest[fault.gpu.index][0]:
                latest[fault.gpu.index] = (fault.last_seen, int(xid))
        return {gpu: xid for gpu, (_, xid) in latest.items()}

    return read


class Daemon:
    """Owns the components; start() brings them up in order, stop() takes them down in reverse."""

    def __init__(self, config: Config, *, allow_fallback: bool) -> None:
        self.config = config
        choice = choose_backend(config.simulate, allow_fallback=allow_fallback)
        self.backend = choice.backend
        self.backend_reason = choice.reason
        s = config.sampler
        self.sampler = Sampler(self.backend, SamplerConfig(s.interval_seconds, s.call_deadline_seconds))
        self.topology = build_topology(config, self.backend, self.sampler)
        self.attribution = AttributionStack(config.attribution, self.backend, self.sampler, config.state_dir)
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.fault_runtime = FaultRuntime(Journal(config.state_dir / JOURNAL_FILE), config.faults, config.hook)
        self.faults = self.fault_runtime.engine  # the probes' sink: report(ProbeReport), event(Finding)
        simulated = isinstance(self.backend, SimulatedBackend)
        self.probes = ProbeRunner(
            default_probes(config.health, state_dir=config.state_dir, simulated=simulated), self.faults, time.time
        )
        self.sampler.subscribe(self.probes.on_snapshot)
        self.xid = xid_watcher(config.health, self.backend, self.faults, self.sampler.latest, simulated=simulated)
        self.partitions = (
            Partitions(
                config.partitions,
                self.backend,
                config.state_dir,
                main_socket=_first_unix_socket(config),
                pod_exists=self.attribution.kubelet.pod_exists,
                order_any=topology_aware(self.topology.first_card),
            )
            if config.partitions.enabled
            else None
        )
        self.registry = CollectorRegistry(auto_describe=False)
        collectors = [
            *build_collectors(config, last_xid_per_gpu(self.faults)),
            *self.attribution.collectors(),
            *self.topology.collectors,
            self.fault_runtime.collector,
            *([self.partitions.collector] if self.partitions else []),
        ]
        self.registry.register(SnapshotExporter(self.sampler.latest, collectors))
        # /metrics is rendered once per Snapshot (after the probes and attribution subscribed above have seen it)
        self.exposition = ExpositionCache(
            self.registry,
            interval=s.interval_seconds,
            max_age=max(2 * s.interval_seconds, s.interval_seconds + 2 * s.call_deadline_seconds),
        )
        self.sampler.subscribe(self.exposition.publish)
        # health checks, faults and partitions on the status page
        self.status_providers = status_providers(self.faults, self.partitions.manager if self.partitions else None)
        stale_after = max(3 * s.interval_seconds, s.interval_seconds + 2 * s.call_deadline_seconds)
        self.http = MetricsHTTPServer(
            parse_listen_address(config.metrics_listen),
            self.exposition,
            health=lambda: snapshot_health(self.sampler, stale_after),
            landing=self.status_page,
            web_config=load_metrics_web_config(config.transport),
        )
        t = config.transport
        self.grpc = GrpcServer(
            config.grpc_addresses,
            [
                Service("xpu.runtime.v1.Simulation", SimulationService(self.backend), _add_simulation),
                *self.topology.services,
                Service(health_service.SERVICE_NAME, self.fault_runtime.service, health_service.add_to_server),
                *([self.partitions.read_service] if self.partitions else []),
            ],
            tls=load_grpc_tls(t, [a for a in config.grpc_addresses if is_tcp(a)]),
            socket_mode=t.grpc_socket_mode,
            socket_group=socket_group_id(t.grpc_socket_group),
        )

    def status_page(self) -> str:
        return render_status_page(
            self.sampler.latest(), providers=self.status_providers, hostname=socket.gethostname(), version=VERSION
        )

    async def start(self) -> None:
        log.info(
            "starting", version=VERSION, backend=self.backend.name, why=self.backend_reason, config=self.config.source
        )
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.attribution.start)
        self.sampler.start()
        await self.fault_runtime.start()
        self.http.start()
        log.info("metrics listening", address=self.config.metrics_listen, port=self.http.port, scheme=self.http.scheme)
        await self.grpc.start()
        await asyncio.to_thread(self.sampler.wait_first, 30.0)
        self.xid.start()
        self.topology.start()
        if self.partitions is not None:
            await self.partitions.start()

    async def stop(self) -> None:
        log.info("stopping")
        await self.grpc.stop()
        if self.partitions is not None:
            await self.partitions.stop()
        self.topology.stop()
        await asyncio.to_thread(self.http.stop)
        await asyncio.to_thread(self.xid.stop)  # before the backend closes: it waits on the driver's event set
        await asyncio.to_thread(self.sampler.stop)
        await asyncio.to_thread(self.attribution.stop)
        await self.fault_runtime.stop()
        self.backend.close()
        log.info("stopped")


def _first_unix_socket(config: Config) -> Path | None:
    return next((Path(a[len("unix:") :]) for a in config.grpc_addresses if a.startswith("unix:")), None)


def _add_simulation(servicer: object, server: object) -> None:
    from healthd.api.v1 import simulation_pb2_grpc

    simulation_pb2_grpc.add_SimulationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


async def run(config: Config, *, allow_fallback: bool, reload_config: Callable[[], Config] | None = None) -> int:
    daemon = Daemon(config, allow_fallback=allow_fallback)
    return await Lifecycle(daemon, Notifier(), reload_config=reload_config).serve()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = resolve_config(args)
        check_transport(config)
    except ConfigError as exc:
        print(f"xpu-healthd: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(f"configuration OK ({config.source})")
        return 0
    configure_logging(config.log_level)
    try:
        return asyncio.run(run(config, allow_fallback=args.config is None, reload_config=lambda: resolve_config(args)))
    except ConfigError as exc:
        log.error("cannot start", error=str(exc))
        return 2
    except OSError as exc:
        log.error("cannot start", error=str(exc))
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
