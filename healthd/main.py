"""xpu-healthd: wire the backend, sampler, HTTP endpoint and gRPC server together and run until signalled."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import structlog
from prometheus_client.registry import CollectorRegistry

from exporter.attribution.attributor import Attribution
from exporter.backends.errors import BackendError
from exporter.backends.guarded import GuardedBackend
from exporter.backends.lanes import DeadlineSettings, DeviceAccess
from exporter.backends.select import choose_backend
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import Collector, SnapshotExporter, default_collectors
from exporter.collectors.dcgm_compat import DcgmCompatCollector
from exporter.executor import in_daemon_thread
from exporter.health import stale_after
from exporter.http import BindError, Health, MetricsHTTPServer, parse_listen_address
from exporter.sampler import Sampler, SamplerConfig
from exporter.status_page import render_status_page
from exporter.version import VERSION
from healthd.attribution.wiring import AttributionStack
from healthd.config import DEFAULT_CONFIG_PATH, Config, ConfigError, load_config, with_overrides
from healthd.daemon.lifecycle import Lifecycle, LoopHook
from healthd.daemon.logs import configure_logging
from healthd.daemon.startup import (
    MOVABLE_STATE,
    StartupError,
    check_references,
    check_socket_dirs,
    check_state_dir,
    move_aside_state,
    option_names,
)
from healthd.daemon.state_files import CorruptStateError, StateFileError
from healthd.daemon.status import GrpcHealth, NodeHealth
from healthd.daemon.status_rows import status_providers
from healthd.daemon.systemd import Notifier
from healthd.faults import service as health_service
from healthd.faults.engine import FaultEngine
from healthd.faults.journal import Journal
from healthd.faults.out_of_service import gpus_out_of_service
from healthd.faults.runtime import JOURNAL_FILE, FaultRuntime
from healthd.partition.planner import topology_aware
from healthd.partition.wiring import Partitions
from healthd.probes import default_probes, xid_watcher
from healthd.probes.runner import ProbeRunner
from healthd.rpc.server import GrpcServer, Service
from healthd.rpc.transport import check_transport, is_tcp, load_grpc_tls, load_metrics_web_config, socket_group_id
from healthd.sim.service import SimulationService
from healthd.topology.wiring import build_topology

log = structlog.get_logger("main")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpu-healthd", description="GPU node daemon: metrics, health, partitions.")
    p.add_argument("--config", type=Path, help=f"TOML config file (e.g. {DEFAULT_CONFIG_PATH})")
    p.add_argument(
        "--simulate",
        nargs="?",
        const="h200x8",
        metavar="SCENARIO",
        help="run on a simulated node: h200x8 (default), h200x1, or a scenario file",
    )
    p.add_argument("--metrics-listen", metavar="ADDR", help="HTTP address for /metrics (default :9410)")
    p.add_argument(
        "--grpc-listen", metavar="ADDR", action="append", help="gRPC address, unix:PATH or HOST:PORT (repeatable)"
    )
    p.add_argument("--state-dir", type=Path, metavar="DIR", help="state directory (default /var/lib/xpu-runtime-kit)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--check-config", action="store_true", help="validate the configuration (addresses, scenario) and exit"
    )
    p.add_argument(
        "--move-aside",
        choices=MOVABLE_STATE,
        metavar="{faults,partitions}",
        help="rename a corrupt state file (faults.sqlite or partitions.sqlite) to <file>.corrupt-<time>, say what "
        "that drops, and exit; the daemon must be stopped",
    )
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


def build_collectors(
    config: Config,
    last_xid: Callable[[], Mapping[int, int]] | None = None,
    attribution: Callable[[], Attribution | None] | None = None,
) -> list[Collector]:
    collectors = default_collectors()
    if config.exporter.dcgm_compat:  # dcgm-exporter names; the host name as dcgm-exporter sets it in Kubernetes
        hostname = os.environ.get("NODE_NAME") or socket.gethostname()
        label = config.exporter.dcgm_hostname_label
        collectors.append(DcgmCompatCollector(hostname, last_xid, hostname_label=label, attribution=attribution))
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
        deadlines = DeadlineSettings(read_seconds=s.call_deadline_seconds, change_seconds=s.change_deadline_seconds)
        self.device = GuardedBackend(DeviceAccess(self.backend, deadlines))  # the only way to the driver
        self.sampler = Sampler(self.device, SamplerConfig(s.interval_seconds, s.call_deadline_seconds))
        self.topology = build_topology(config, self.device, self.sampler, self.gpus_out_of_service)
        self.attribution = AttributionStack(config.attribution, self.backend, self.sampler, config.state_dir)
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.fault_runtime = FaultRuntime(Journal(config.state_dir / JOURNAL_FILE), config.faults, config.hook)
        self.faults = self.fault_runtime.engine  # the probes' sink: report(ProbeReport), event(Finding)
        simulated = isinstance(self.backend, SimulatedBackend)
        self.probes = ProbeRunner(
            default_probes(config.health, state_dir=config.state_dir, simulated=simulated), self.faults, time.time
        )
        self.sampler.subscribe(self.probes.on_snapshot, "probes")
        self.xid = xid_watcher(config.health, self.device, self.faults, self.sampler.latest, simulated=simulated)
        self.partitions = (
            Partitions(
                config.partitions,
                self.device,
                config.state_dir,
                snapshot=self.sampler.latest,
                main_socket=_first_unix_socket(config),
                pod_exists=self.attribution.kubelet.pod_exists,
                device_holders=self.attribution.kubelet.device_holders,
                order_any=topology_aware(self.topology.first_card),
                out_of_service=self.gpus_out_of_service,
                admin_services=[
                    Service(health_service.SERVICE_NAME, self.fault_runtime.admin_service, health_service.add_to_server)
                ],
            )
            if config.partitions.enabled
            else None
        )
        self.node = NodeHealth(
            self.sampler.latest,
            self.device.access,
            stale_after(s.interval_seconds, s.call_deadline_seconds, self.sampler.config.open_deadline_seconds),
            backlogs=self._backlogs,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        collectors = [
            *build_collectors(config, last_xid_per_gpu(self.faults), self.attribution.attributor.latest),
            *self.attribution.collectors(),
            *self.topology.collectors,
            self.fault_runtime.collector,
            *([self.partitions.collector] if self.partitions else []),
        ]
        self.registry.register(SnapshotExporter(self.sampler.latest, collectors))
        # health checks, faults and partitions on the status page
        self.status_providers = status_providers(self.faults, self.partitions.manager if self.partitions else None)
        self.http = MetricsHTTPServer(
            parse_listen_address(config.metrics_listen),
            self.registry,
            health=self._healthz,
            landing=self.status_page,
            web_config=load_metrics_web_config(config.transport),
        )
        t = config.transport
        self.grpc = GrpcServer(
            config.grpc_addresses,
            [
                Service("xpu.runtime.v1.Simulation", SimulationService(self.backend.injector), _add_simulation),
                *self.topology.services,
                Service(health_service.SERVICE_NAME, self.fault_runtime.service, health_service.add_to_server),
                *([self.partitions.read_service] if self.partitions else []),
            ],
            tls=load_grpc_tls(t, [a for a in config.grpc_addresses if is_tcp(a)]),
            socket_mode=t.grpc_socket_mode,
            socket_group=socket_group_id(t.grpc_socket_group),
        )
        self.grpc_health = GrpcHealth(
            self.node,
            [self.grpc, *([self.partitions.admin_server] if self.partitions else [])],
            self._service_readiness(),
        )

    def _backlogs(self) -> dict[str, int]:
        return {
            "hook outbox": sum(self.fault_runtime.dispatcher.depth.values()),
            "journal": self.fault_runtime.io.backlog(),
        }

    def _service_readiness(self) -> dict[str, Callable[[], bool]]:
        ready: dict[str, Callable[[], bool]] = {health_service.SERVICE_NAME: lambda: True}
        if self.topology.refresher is not None:
            refresher = self.topology.refresher
            ready["xpu.runtime.v1.Topology"] = lambda: refresher.latest() is not None
        if self.partitions is not None:
            partitions = self.partitions
            ready["xpu.runtime.v1.Partitions"] = lambda: partitions.started
        return ready

    def _healthz(self) -> Health:
        status = self.node.status()
        return Health(status.serving, f"{status.level}: {status.summary}")

    def status_line(self) -> str:
        """One line for `systemctl status`: the node status and where the metrics are."""
        return f"{self.node.status().summary}; metrics {self.http.scheme} :{self.http.port}"

    def gpus_out_of_service(self) -> frozenset[int]:
        """Cards kept from new work (``any`` placement, PreferredAllocation): active faults of action reset_gpu or
        stronger, and cards whose driver calls are hung right now."""
        return gpus_out_of_service(self.faults.active_faults()) | frozenset(self.device.access.hung_cards())

    def status_page(self) -> str:
        return render_status_page(
            self.sampler.latest(),
            providers=self.status_providers,
            hostname=socket.gethostname(),
            version=VERSION,
            node=self.node.status(),
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
        self.grpc_health.start()

    async def stop(self, budget_seconds: float = 8.0) -> None:
        """Stop in reverse order within ``budget_seconds`` in all, whatever is hung; never wait on the driver."""
        log.info("stopping")
        end = time.monotonic() + budget_seconds

        def left(share: float) -> float:
            return max(0.1, min(share, end - time.monotonic()))

        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("grpc health", self.grpc_health.stop),
            ("grpc", lambda: self.grpc.stop(grace=left(2.0))),
            *([("partitions", self.partitions.stop)] if self.partitions is not None else []),
            ("topology", lambda: in_daemon_thread(self.topology.stop)),
            ("http", lambda: in_daemon_thread(self.http.stop)),
            ("xid watcher", lambda: in_daemon_thread(self.xid.stop, 1.0)),
            ("sampler", lambda: in_daemon_thread(self.sampler.stop, left(2.0))),
            ("attribution", lambda: in_daemon_thread(self.attribution.stop)),
            ("faults", lambda: self.fault_runtime.stop(flush_seconds=left(3.0))),
            ("driver", lambda: in_daemon_thread(self._close_driver)),
        ]
        for name, step in steps:
            try:
                await asyncio.wait_for(step(), left(3.0))
            except TimeoutError:
                log.warning("stop step did not finish in time; going on", step=name)
            except Exception:
                log.exception("stop step failed; going on", step=name)
        hung = self.device.access.shutdown(0.0)
        if hung:
            now = self.device.access.now()
            log.warning("exiting with driver calls that never returned", calls=[h.describe(now) for h in hung])
        log.info("stopped")

    def _close_driver(self) -> None:
        try:
            self.device.close()
        except BackendError as exc:
            log.warning("driver library not closed", error=str(exc))


def _first_unix_socket(config: Config) -> Path | None:
    return next((Path(a[len("unix:") :]) for a in config.grpc_addresses if a.startswith("unix:")), None)


def _add_simulation(servicer: object, server: object) -> None:
    from healthd.api.v1 import simulation_pb2_grpc

    simulation_pb2_grpc.add_SimulationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


async def run(
    config: Config,
    *,
    allow_fallback: bool,
    reload_config: Callable[[], Config] | None = None,
    loop_hooks: Sequence[LoopHook] = (),
) -> int:
    daemon = Daemon(config, allow_fallback=allow_fallback)
    return await Lifecycle(daemon, Notifier(), reload_config=reload_config, loop_hooks=loop_hooks).serve()


def main(argv: Sequence[str] | None = None, *, loop_hooks: Sequence[LoopHook] = ()) -> int:
    """Every start-up failure is one line on stderr naming the option, file or address, and exit status 2.

    ``loop_hooks`` are called with the running event loop before the daemon starts (tests only)."""
    args = build_parser().parse_args(argv)
    try:
        config = resolve_config(args)
        names = option_names(source=config.source, flags=_flags_given(args))
        if args.move_aside:
            print(move_aside_state(config.state_dir, args.move_aside, names))
            return 0
        check_references(config, names)
        check_transport(config)
        if args.check_config:
            print(f"configuration OK ({config.source})")
            return 0
        check_state_dir(config.state_dir, names)
        check_socket_dirs(config, names)
    except (ConfigError, StartupError, StateFileError) as exc:
        return _startup_failed(str(exc))
    configure_logging(config.log_level)
    try:
        return asyncio.run(
            run(
                config,
                allow_fallback=args.config is None,
                reload_config=lambda: resolve_config(args),
                loop_hooks=loop_hooks,
            )
        )
    except CorruptStateError as exc:
        again = " ".join([*_location_flags(args), "--move-aside", exc.kind])
        return _startup_failed(f"{exc} To start without it: xpu-healthd {again}, then start the daemon again.")
    except (ConfigError, StartupError, StateFileError) as exc:
        return _startup_failed(str(exc))
    except BindError as exc:
        return _startup_failed(f"{names.metrics_listen}: {exc}")
    except OSError as exc:  # the gRPC listener names its address; anything else the OS refused at start
        return _startup_failed(f"cannot start: {exc}")


def _startup_failed(message: str) -> int:
    print(f"xpu-healthd: {' '.join(message.split())}", file=sys.stderr)  # one line, whatever the message holds
    return 2


def _flags_given(args: argparse.Namespace) -> set[str]:
    flags = {"metrics_listen": args.metrics_listen, "grpc_listen": args.grpc_listen, "state_dir": args.state_dir}
    return {name for name, value in flags.items() if value is not None} | ({"simulate"} if args.simulate else set())


def _location_flags(args: argparse.Namespace) -> list[str]:
    """The flags that say where the state is, to repeat in a recovery command."""
    out = []
    if args.config is not None:
        out += ["--config", str(args.config)]
    if args.state_dir is not None:
        out += ["--state-dir", str(args.state_dir)]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
