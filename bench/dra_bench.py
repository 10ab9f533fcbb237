"""xpu-dra-driver: NodePrepareResources latency per claim shape, and fault -> taint / resolve -> untaint latency.

Starts a simulated 8-card xpu-healthd, the driver as a process, the Kubernetes API server stand-in
(tests/support/kube_api.py) and the kubelet DRA double (tests/support/kubelet_dra.py, the real v1 protos on unix
sockets). Times, from the kubelet side, one claim per NodePrepareResources call (each a new claim, unprepared
between rounds, so every prepare does its work):
- a whole card (the claim is read from the API server; no partition);
- a TDM share of 10 % and 1Gi (CreatePartition with the quotas from consumedCapacity);
- a MIG 1g.18gb at an allocated placement (CreatePartition at that placement);
and, with the driver's poll set to an hour so only the fault stream can be the cause:
- an injected XID 79 until the card's device carries the fault taint in the API server;
- the operator's ResolveFault until the taint is gone.
Every figure includes the stand-in API server's own time (a Python http.server that deep-copies its store; the
schema validation the tests run on every write is off here): most of a republish is spent there, not in the
driver. A change rewrites every slice of the pool under a new generation, as the resourceslice controller does.

    python3 bench/dra_bench.py [--rounds 30]
    python3 -m bench --only dra
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(REPO))

from bench.common import BenchArgs, Row, percentile  # noqa: E402
from healthd.api.v1 import health_pb2 as hpb  # noqa: E402
from healthd.api.v1 import health_pb2_grpc as hpb_grpc  # noqa: E402
from healthd.api.v1 import partitions_pb2 as ppb  # noqa: E402
from healthd.api.v1 import simulation_pb2 as spb  # noqa: E402
from healthd.api.v1 import simulation_pb2_grpc as spb_grpc  # noqa: E402

NAME = "dra"
LIMIT_SECONDS = 30.0
MERGE_WINDOW = "[health.xid]\nmerge_window_seconds = 0.001\n"  # every XID a new fault, a moment after the last
POD = ("bench", "0f0e0d0c-0000-4000-8000-00000000b001")


@dataclass
class Samples:
    prepare_card: list[float] = field(default_factory=list)
    prepare_tdm: list[float] = field(default_factory=list)
    prepare_mig: list[float] = field(default_factory=list)
    tainted: list[float] = field(default_factory=list)
    untainted: list[float] = field(default_factory=list)


def _until(condition: Callable[[], object], what: str) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > LIMIT_SECONDS:
            raise RuntimeError(f"{what}: not within {LIMIT_SECONDS}s")
        time.sleep(0.002)
    return time.monotonic() - start


def measure(rounds: int, work_dir: Path) -> Samples:
    from tests.support import dra_allocations as alloc
    from tests.support.dra_stack import DRIVER, NODE, dra_stack
    from tests.support.kubelet_dra import Claim

    s = Samples()
    modes = {"1": ppb.PARTITION_MODE_TDM, "6": ppb.PARTITION_MODE_MIG}
    with (
        tempfile.TemporaryDirectory(dir=work_dir, prefix="xdra-bench-") as tmp,
        dra_stack(
            Path(tmp), driver_config="refresh_seconds = 3600\n", modes=modes, daemon_extra=MERGE_WINDOW, validate=False
        ) as st,
    ):
        _until(st.register, "registration")
        _until(lambda: {"gpu-0", "gpu-1-tdm", "gpu-6-mig-1g-18gb-6"} <= set(st.devices()), "slices")

        def timed_prepare(claim: dict[str, Any], into: list[float]) -> None:
            made = st.api.add("resourceclaims", claim, namespace="bench")
            ref = Claim("bench", made["metadata"]["uid"], made["metadata"]["name"])
            t0 = time.perf_counter()
            st.kubelet.prepare(DRIVER, [ref])
            into.append(time.perf_counter() - t0)
            st.kubelet.unprepare(DRIVER, [ref])
            st.api.delete("resourceclaims", ref.name, namespace="bench")

        for i in range(rounds):
            timed_prepare(alloc.whole_card(f"card-{i}", "bench", NODE, f"gpu-{i % 6 if i % 6 != 1 else 0}", POD),
                          s.prepare_card)  # fmt: skip
            timed_prepare(
                alloc.tdm_share(f"tdm-{i}", "bench", NODE, "gpu-1-tdm", POD, compute="10", memory="1Gi"), s.prepare_tdm
            )
            timed_prepare(alloc.mig_partition(f"mig-{i}", "bench", NODE, f"gpu-6-mig-1g-18gb-{i % 7}", POD),
                          s.prepare_mig)  # fmt: skip
        with grpc.insecure_channel(st.daemon.address) as main, grpc.insecure_channel(st.admin) as admin:
            simulation = spb_grpc.SimulationStub(admin)  # type: ignore[no-untyped-call]  # inject: admin only
            health = hpb_grpc.HealthStub(main)  # type: ignore[no-untyped-call]
            health_admin = hpb_grpc.HealthStub(admin)  # type: ignore[no-untyped-call]
            for i in range(rounds):
                gpu = (2, 3, 4, 5)[i % 4]
                device = f"gpu-{gpu}"
                simulation.InjectFault(spb.InjectFaultRequest(kind="xid", gpu=gpu, params={"code": "79"}), timeout=10)
                s.tainted.append(_until(lambda d=device: st.devices()[d].get("taints"), f"{device} tainted"))
                active = health.ListFaults(
                    hpb.ListFaultsRequest(gpu=str(gpu), state=hpb.FAULT_STATE_ACTIVE), timeout=10
                ).faults
                t0 = time.monotonic()
                for f in active:
                    health_admin.ResolveFault(hpb.ResolveFaultRequest(id=f.id, reason="bench"), timeout=10)
                _until(lambda d=device: not st.devices()[d].get("taints"), f"{device} untainted")
                s.untainted.append(time.monotonic() - t0)
    return s


def rows(s: Samples) -> list[Row]:
    out = []
    for metric, values in (
        ("DRA prepare, 1 whole card", s.prepare_card),
        ("DRA prepare, 1 TDM share (creates it)", s.prepare_tdm),
        ("DRA prepare, 1 MIG 1g.18gb (creates it)", s.prepare_mig),
        ("XID 79 -> device taint in the API server", s.tainted),
        ("ResolveFault -> taint removed", s.untainted),
    ):
        ms = [v * 1000 for v in values]
        out.append(Row(f"{metric} p50", "ms", percentile(ms, 0.5), gpus=8, note=f"n={len(ms)}"))
        out.append(Row(f"{metric} p99", "ms", percentile(ms, 0.99), gpus=8))
    return out


def run(args: BenchArgs) -> list[Row]:
    return rows(measure(10 if args.quick else 30, args.work_dir))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    opts = ap.parse_args(argv)
    for row in rows(measure(opts.rounds, Path(tempfile.gettempdir()))):
        print(f"{row.metric:48} {row.value:9.2f} {row.unit:4} {row.note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
