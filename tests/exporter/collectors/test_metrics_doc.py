"""docs/metrics.md against the real exposition of the simulated daemon: every exported family is documented, with
its type and labels, and every documented family is exported."""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon_process import DaemonProcess
from tests.support.paths import REPO

pytestmark = pytest.mark.e2e

DOC = REPO / "docs" / "metrics.md"

# Documented families allowed to be missing from the exposition (components not in this build): none.
NOT_YET_MERGED: set[str] = set()

# profiling series need two GPM samples, so they appear from the second sampling cycle on
COMPLETE_MARKERS = (
    "xpu_topology_up 1.0",
    "xpu_pod_gpu_allocated{",
    "xpu_faults_journal_seq",
    "xpu_mig_sm_active_ratio{",
)

ROW = re.compile(r"^\|\s*`(xpu_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|[^|]*\|([^|]*)\|")


def documented() -> dict[str, tuple[str, set[str]]]:
    out: dict[str, tuple[str, set[str]]] = {}
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            name, kind, labels = m.group(1), m.group(2), m.group(3)
            assert name not in out, f"{name} documented twice"
            label_set = {x.strip() for x in labels.strip().split(",") if x.strip()}
            out[name] = (kind, label_set)
    return out


@pytest.fixture(scope="module")
def exposition(tmp_path_factory: pytest.TempPathFactory) -> str:
    with DaemonProcess(tmp_path_factory.mktemp("doc")) as d:
        for args in (("mode", "4", "tdm"), ("create", "--gpu", "4", "--compute", "30", "--memory", "2GiB")):
            out = d.xpuctl("partitions", *args)
            assert out.returncode == 0, out.stderr  # partition series exist only while partitions do
        # some families appear after the first cycle: topology is collected once sampling runs, pods once the
        # kubelet client has refreshed; wait for a complete page rather than document a half-started daemon
        deadline = time.monotonic() + 30
        while True:
            text = d.metrics()
            if all(marker in text for marker in COMPLETE_MARKERS) or time.monotonic() > deadline:
                return text
            time.sleep(0.2)


def exported(text: str) -> dict[str, tuple[str, set[str]]]:
    out: dict[str, tuple[str, set[str]]] = {}
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))
    labels: dict[str, set[str]] = {name: set() for name in types}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in labels:
                labels[s.name].update(s.labels)
    for name, kind in types.items():
        if kind == "gauge" and name.endswith("_info"):
            kind = "info"
        out[name] = (kind, labels[name])
    return out


def test_every_exported_family_is_documented(exposition: str) -> None:
    missing = sorted(set(exported(exposition)) - set(documented()))
    assert not missing, f"exported but not in docs/metrics.md: {missing}"


def test_every_documented_family_is_exported(exposition: str) -> None:
    absent = sorted(set(documented()) - set(exported(exposition)) - NOT_YET_MERGED)
    assert not absent, f"in docs/metrics.md but not exported: {absent}"


def test_documented_types_and_labels_match(exposition: str) -> None:
    """A label documented as ``name?`` is optional: series carry it only when its value is not empty."""
    docs = documented()
    for name, (kind, labels) in exported(exposition).items():
        doc_kind, doc_labels = docs[name]
        assert doc_kind == kind, f"{name}: documented as {doc_kind}, exported as {kind}"
        required = {label for label in doc_labels if not label.endswith("?")}
        optional = {label.rstrip("?") for label in doc_labels if label.endswith("?")}
        if labels:  # a family without samples right now cannot show its labels
            assert required <= labels <= required | optional, (
                f"{name}: documented labels {sorted(doc_labels)}, exported {sorted(labels)}"
            )


def test_the_not_yet_merged_list_only_names_documented_families() -> None:
    assert sorted(NOT_YET_MERGED - set(documented())) == []
