"""Bad or odd input to attribution: kubelet device ids, log directory names, simulated pod parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.attribution.attributor import Attributor
from exporter.attribution.kubelet import DeviceAllocation, PodResourcesView
from exporter.attribution.podlogs import PodLogIndex
from exporter.attribution.resolver import ProcResolver
from exporter.backends.simulated import SimulatedBackend
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot

BACKEND = SimulatedBackend.from_name("h200x8")
_SAMPLER = Sampler(BACKEND, SamplerSettings(interval_seconds=60))
SNAPSHOT: Snapshot = _SAMPLER.run_once()
_SAMPLER.stop()
KNOWN = [c.uuid for c in BACKEND.scenario.cards] + [i.uuid for g in SNAPSHOT.gpus for i in g.mig_instances]


class _FixedKubelet:
    def __init__(self, allocations: list[DeviceAllocation]) -> None:
        self._view = PodResourcesView(state="ok", allocations=tuple(allocations), last_success=1.0)

    def view(self) -> PodResourcesView:
        return self._view


device_ids = st.one_of(
    st.sampled_from(KNOWN),
    st.builds(lambda u, n: f"{u}::{n}", st.sampled_from(KNOWN), st.integers(0, 99)),
    st.text(max_size=40),
    st.sampled_from([f"nvidia{i}" for i in range(10)]),
)


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(device_ids, max_size=30))
def test_any_device_ids_are_mapped_or_counted_unmatched(
    ids: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("empty")
    allocations = [DeviceAllocation("ns", f"p{i}", "c", "nvidia.com/gpu", d) for i, d in enumerate(ids)]
    attributor = Attributor(ProcResolver(root), pod_index=PodLogIndex(root), kubelet=_FixedKubelet(allocations))  # type: ignore[arg-type]
    result = attributor.update(SNAPSHOT)
    assert len(result.allocations) + result.unmatched_device_ids == len(ids)
    minors = {f"nvidia{i}" for i in range(len(BACKEND.scenario.cards))}
    for a in result.allocations:
        base = a.device_id.split("::")[0]
        assert base in KNOWN or base in minors
        card = SNAPSHOT.gpu(a.gpu)
        assert card is not None
        assert a.uuid == card.uuid


@settings(max_examples=60, deadline=None)
@given(names=st.lists(st.text(alphabet="abc_-.0123456789f", min_size=1, max_size=90), max_size=12))
def test_log_index_ignores_names_it_does_not_understand(
    names: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("log")
    for sub in ("pods", "containers"):
        (root / sub).mkdir()
        for n in names:
            if n not in (".", ".."):
                (root / sub / n).mkdir(exist_ok=True)
    index = PodLogIndex(root)
    index.refresh()  # must not raise
    for n in names:
        parts = n.split("_")
        if len(parts) == 3 and n not in (".", ".."):
            pod = index.pod(parts[2])
            assert pod is not None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"pid": "1", "pod": "Bad_Name"}, "parameter 'pod' must be a lowercase DNS label"),
        ({"pid": "1", "pod": "ok", "namespace": "x" * 64}, "parameter 'namespace' must be a lowercase DNS label"),
        ({"pid": "1", "pod": "ok", "container": ""}, "parameter 'container' must be a lowercase DNS label"),
        ({"pid": "1", "namespace": "ns"}, "parameters 'namespace' and 'container' need 'pod'"),
    ],
)
def test_process_start_rejects_bad_pod_parameters(params: dict[str, str], message: str) -> None:
    backend = SimulatedBackend.from_name("h200x1")
    with pytest.raises(ValueError, match="^" + message):
        backend.inject("process_start", 0, params)
    assert all(w.pid != 1 for w in backend.workloads())


def test_process_start_with_pod_defaults(tmp_path: Path) -> None:
    backend = SimulatedBackend.from_name("h200x1")
    backend.inject("process_start", 0, {"pid": "5", "pod": "solo"})
    (w,) = [w for w in backend.workloads() if w.pid == 5]
    assert w.pod is not None
    assert (w.pod.namespace, w.pod.pod, w.pod.container) == ("default", "solo", "main")
