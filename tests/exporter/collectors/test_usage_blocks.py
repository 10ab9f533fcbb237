"""The process and pod collectors' blocks (exporter/collectors/process.py, pod.py): over attributions that change
as a node's do (SM shares, memory, containers, cards, MIG instances, processes coming and going, more processes
than the per-card limit, -0.0 and NaN shares), the block-cached render is byte for byte what prometheus_client
writes, render after render; and a family whose lines did not change is the last render's lines, not new ones."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.attribution.attributor import Allocation, AttributedProcess, Attribution, Workload
from exporter.collectors import Collector
from exporter.collectors.pod import PodCollector
from exporter.collectors.process import ProcessCollector
from exporter.collectors.render import SnapshotRenderer
from exporter.encoding import Section
from exporter.snapshot import Snapshot
from tests.exporter.collectors.test_render import fast, reference

WORKLOADS = (
    Workload("ns", "train", "main"),
    Workload("ns", "train", "side"),
    Workload("ns", "serve", "main"),
    Workload("other", "train", "main"),
    Workload("ns", "batch", "main", job="77"),
    Workload(job="12"),
    Workload(),
)
SHARES = (None, 0.0, -0.0, 0.125, 0.5, 0.75, 0.3333333333333333, 2.0, float("nan"))
MEMORY = (None, 0, 1 << 20, 3 << 20, 2**60 + 1)

processes = st.builds(
    AttributedProcess,
    gpu=st.sampled_from((0, 1)),
    uuid=st.just(""),  # set from gpu below
    gpu_instance_id=st.sampled_from(("", "", "1", "2")),
    pid=st.sampled_from((100, 101, 102, 70000)),
    name=st.sampled_from(("python", 'odd "name"\\')),
    used_memory_bytes=st.sampled_from(MEMORY),
    sm_utilization_ratio=st.sampled_from(SHARES),
    workload=st.sampled_from(WORKLOADS),
    mps_server=st.booleans(),
)
allocations = st.builds(
    Allocation,
    namespace=st.just("ns"),
    pod=st.sampled_from(("train", "serve", "idle")),
    container=st.sampled_from(("main", "side")),
    resource_name=st.just("nvidia.com/gpu"),
    device_id=st.sampled_from(("GPU-0", "GPU-1")),
    gpu=st.just(0),
    uuid=st.sampled_from(("GPU-0", "GPU-1")),
    gpu_instance_id=st.just(""),
)


def _on_its_card(p: AttributedProcess) -> AttributedProcess:
    return p._replace(uuid=f"GPU-{p.gpu}")


@st.composite
def frames(draw: st.DrawFn) -> list[tuple[tuple[AttributedProcess, ...], tuple[Allocation, ...], int]]:
    """Attributions in a row (processes, allocations, the per-card limit): a process stays as it was (the same
    object, as the Attributor hands back), has its SM share or memory changed, goes, or a new one comes."""
    out: list[tuple[tuple[AttributedProcess, ...], tuple[Allocation, ...], int]] = []
    procs: list[AttributedProcess] = []
    allocs: tuple[Allocation, ...] = ()
    for _ in range(draw(st.integers(min_value=1, max_value=5))):
        nxt: list[AttributedProcess] = []
        for p in procs:
            what = draw(st.sampled_from(("same", "same", "share", "memory", "gone")))
            if what == "same":
                nxt.append(p)
            elif what == "share":
                nxt.append(p._replace(sm_utilization_ratio=draw(st.sampled_from(SHARES))))
            elif what == "memory":
                nxt.append(p._replace(used_memory_bytes=draw(st.sampled_from(MEMORY))))
        nxt += [_on_its_card(p) for p in draw(st.lists(processes, max_size=6))]
        procs = draw(st.permutations(nxt)) if draw(st.booleans()) else nxt
        if draw(st.booleans()):
            allocs = tuple(draw(st.lists(allocations, max_size=4)))
        out.append((tuple(procs), allocs, draw(st.sampled_from((1, 2, 64)))))
    return out


def _constant() -> float:
    return 0.0


class Source:
    def __init__(self) -> None:
        self.attribution: Attribution | None = None

    def __call__(self) -> Attribution | None:
        return self.attribution


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_process_and_pod_blocks_encode_as_prometheus_client_render_after_render(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    source = Source()
    process = ProcessCollector(source)
    collectors: list[Collector] = [process, PodCollector(source)]
    renderer = SnapshotRenderer(collectors, clock=lambda: 1.0, monotonic=_constant)
    for n, (procs, allocs, limit) in enumerate(data.draw(frames())):
        source.attribution = Attribution(n, procs, allocs, None, 0)
        process.max_per_gpu = limit
        fresh: list[Collector] = [ProcessCollector(source, max_per_gpu=limit), PodCollector(source)]  # no state
        assert fast(renderer, snapshot) == reference(snapshot, fresh, 1.0), f"render {n}"
        assert reference(snapshot, collectors, 1.0) == reference(snapshot, fresh, 1.0), f"render {n}"


def _runs(sections: Sequence[Section]) -> dict[str, tuple[Sequence[str], ...]]:
    return {s.text_header.split(" ", 3)[2]: s.runs for s in sections}


def test_only_the_families_whose_lines_changed_are_written_anew(snapshot: Snapshot) -> None:
    source = Source()
    renderer = SnapshotRenderer([ProcessCollector(source, max_per_gpu=2), PodCollector(source)], monotonic=_constant)
    procs = tuple(
        AttributedProcess(gpu, f"GPU-{gpu}", "", 100 + i, "python", (i + 1) << 20, 0.25, WORKLOADS[i % 3])
        for gpu in (0, 1)
        for i in range(4)
    )
    source.attribution = Attribution(1, procs, (), None, 0)
    first = _runs(renderer.render(snapshot).sections)
    moved = tuple(p._replace(sm_utilization_ratio=0.5) for p in procs)  # every share moves, nothing else
    source.attribution = Attribution(2, moved, (), None, 0)
    second = _runs(renderer.render(snapshot).sections)
    for kept in (
        "xpu_process_gpu_memory_used_bytes",
        "xpu_process_folded",
        "xpu_pod_gpu_memory_used_bytes",
        "xpu_pod_gpu_processes",
    ):
        assert len(second[kept]) == 2  # two cards' blocks, or two pods'
        assert all(a is b for a, b in zip(first[kept], second[kept], strict=True)), kept
    for written in ("xpu_process_sm_utilization_ratio", "xpu_pod_sm_utilization_ratio"):
        assert not any(a is b for a, b in zip(first[written], second[written], strict=True)), written
        assert all(line.endswith(" 0.5\n") or " 1.0\n" in line for run in second[written] for line in run)


def test_a_share_that_changes_sign_is_written_anew(snapshot: Snapshot) -> None:
    source = Source()
    collectors: list[Collector] = [ProcessCollector(source), PodCollector(source)]
    renderer = SnapshotRenderer(collectors, clock=lambda: 1.0, monotonic=_constant)
    p = AttributedProcess(0, "GPU-0", "", 100, "python", 1 << 20, 0.0, WORKLOADS[0])
    for n, share in enumerate((0.0, -0.0, -0.0, 0.0)):
        source.attribution = Attribution(n, (p._replace(sm_utilization_ratio=share),), (), None, 0)
        text, om = fast(renderer, snapshot)
        assert (text, om) == reference(snapshot, collectors, 1.0), f"render {n}"
        (line,) = [line for line in text.splitlines() if line.startswith(b"xpu_process_sm_utilization_ratio{")]
        assert line.endswith(f" {share}".encode()), f"render {n}"  # -0.0 prints as -0.0
