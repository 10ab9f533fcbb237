"""dcgm-exporter compatible series: names, units and labels of dcgm-exporter's defaults, from the same Snapshot."""

from __future__ import annotations

import functools
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from exporter.attribution.attributor import Allocation, Attribution
from exporter.backends.simulated import SimulatedBackend
from exporter.collectors import SnapshotExporter, default_collectors
from exporter.collectors.dcgm_compat import DcgmCompatCollector
from exporter.sampler import Sampler, SamplerSettings
from exporter.snapshot import Snapshot
from healthd.daemon.cards import CardMetrics
from healthd.daemon.config import ConfigError, parse_config
from tests.support.clock import FakeClock

# dcgm-exporter's active default counters (etc/default-counters.csv) that we provide
DEFAULTS_PROVIDED = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
}  # fmt: skip
# all but DCGM_FI_DEV_VGPU_LICENSE_STATUS (vGPU only: absent on bare metal) and DCGM_FI_DEV_XID_ERRORS (the daemon's)
PROFILING = (
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
)  # fmt: skip
LINKS = ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES",
         "DCGM_FI_PROF_NVLINK_RX_BYTES")  # fmt: skip
LABELS = {"gpu", "UUID", "device", "modelName", "hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION"}
# the tests below check the 4.8 line's names; tests/exporter/collectors/test_dcgm_versions.py the 4.10 line's
Dcgm48 = functools.partial(DcgmCompatCollector, version="4.8")


@pytest.fixture
def snapshot(sim: SimulatedBackend, clock: FakeClock) -> Snapshot:
    s = Sampler(sim, SamplerSettings(interval_seconds=1.0, call_deadline_seconds=2.0), clock=clock)
    s.run_once()
    clock.advance(10)
    snap = s.run_once()
    s.stop()
    return snap


def render(snapshot: Snapshot, collectors: list[object]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(lambda: snapshot, collectors, clock=lambda: snapshot.taken_at))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


@functools.lru_cache(maxsize=8)
def series(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parsed once per exposition: the tests look up many series in the same text."""
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def dcgm_series(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [s for s in series(text) if s[0].startswith("DCGM_")]


def one(text: str, name: str, gpu: str, **extra: str) -> float:
    found = [v for n, ls, v in series(text) if n == name and ls.get("gpu") == gpu and extra.items() <= ls.items()
             and ("GPU_I_ID" in ls) == ("GPU_I_ID" in extra)]  # fmt: skip
    assert len(found) == 1, (name, gpu, found)
    return found[0]


def test_default_names_and_labels(snapshot: Snapshot) -> None:
    text = render(snapshot, [Dcgm48("node-a")])
    names = {n for n, _, _ in series(text)}
    assert names >= DEFAULTS_PROVIDED
    for _, labels, _ in dcgm_series(text):
        assert set(labels) >= LABELS
        assert labels["hostname"] == "node-a" and labels["device"].startswith("nvidia")
        assert "Hostname" not in labels
        assert labels["DCGM_FI_DRIVER_VERSION"] == "580.159.04" and labels["modelName"] == "NVIDIA H200"


def test_units_follow_dcgm_and_agree_with_xpu_metrics(snapshot: Snapshot) -> None:
    text = render(snapshot, [*default_collectors(), Dcgm48("node-a")])
    g = "0"
    assert one(text, "DCGM_FI_DEV_SM_CLOCK", g) == one(text, "xpu_gpu_sm_clock_hertz", g) / 1e6
    assert one(text, "DCGM_FI_DEV_FB_USED", g) == one(text, "xpu_gpu_memory_used_bytes", g) / 2**20
    assert one(text, "DCGM_FI_DEV_GPU_UTIL", g) == pytest.approx(one(text, "xpu_gpu_utilization_ratio", g) * 100)
    energy_mj = one(text, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", g)
    assert energy_mj == pytest.approx(one(text, "xpu_gpu_energy_joules_total", g) * 1000)
    assert one(text, "DCGM_FI_DEV_GPU_TEMP", g) == one(text, "xpu_gpu_temperature_celsius", g)
    assert one(text, "DCGM_FI_DEV_POWER_USAGE", g) == one(text, "xpu_gpu_power_watts", g)


def test_counters_keep_dcgm_names_without_total(snapshot: Snapshot) -> None:
    text = render(snapshot, [Dcgm48("node-a")])
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION untyped" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text


def test_mig_devices_get_instance_labels(snapshot: Snapshot) -> None:
    text = render(snapshot, [Dcgm48("node-a")])
    mig = [(n, ls) for n, ls, _ in series(text) if "GPU_I_ID" in ls]
    assert {n for n, _ in mig} == {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", *PROFILING}
    assert {ls["GPU_I_PROFILE"] for _, ls in mig} == {"3g.71gb", "2g.35gb"}
    # utilization is not defined per card while MIG is on: omitted, as dcgm-exporter does
    assert not [ls for n, ls, _ in series(text) if n == "DCGM_FI_DEV_GPU_UTIL" and ls["gpu"] in ("6", "7")]


def test_stuck_card_has_no_values(sim: SimulatedBackend, clock: FakeClock) -> None:
    s = Sampler(sim, SamplerSettings(interval_seconds=1.0, call_deadline_seconds=2.0), clock=clock)
    s.run_once()
    sim.inject("gpu_lost", 2)
    snap = s.run_once()
    s.stop()
    text = render(snap, [Dcgm48("node-a")])
    assert not [ls for _, ls, _ in dcgm_series(text) if ls["gpu"] == "2"]
    assert [ls for _, ls, _ in dcgm_series(text) if ls["gpu"] == "1"]


def test_last_xid_provider(snapshot: Snapshot) -> None:
    text = render(snapshot, [Dcgm48("node-a", last_xid=lambda: {3: 79})])
    assert one(text, "DCGM_FI_DEV_XID_ERRORS", "3") == 79
    assert one(text, "DCGM_FI_DEV_XID_ERRORS", "0") == 0
    assert "DCGM_FI_DEV_XID_ERRORS" not in render(snapshot, [Dcgm48("node-a")])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")
def test_exposition_passes_promtool_parsing(snapshot: Snapshot) -> None:
    text = render(snapshot, [*default_collectors(), Dcgm48("node-a")])
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    # dcgm-exporter's names break Prometheus naming conventions on purpose (that is the point); only parse errors
    # would break scraping
    assert "error while linting" not in result.stderr + result.stdout
    assert "text format parsing error" not in result.stderr + result.stdout


def test_config_option(tmp_path: Path) -> None:
    assert parse_config({}).exporter.dcgm_compat is False
    assert parse_config({}).exporter.dcgm_hostname_label == "hostname"
    old = parse_config({"exporter": {"dcgm_compat": True, "dcgm_hostname_label": "Hostname"}})
    assert old.exporter.dcgm_hostname_label == "Hostname"
    with pytest.raises(ConfigError, match=r"^exporter\.dcgm_hostname_label: must be one of"):
        parse_config({"exporter": {"dcgm_hostname_label": "host"}})
    on = parse_config({"exporter": {"dcgm_compat": True}})
    assert any(c.name == "dcgm_compat" for c in CardMetrics(on.exporter).collectors())
    assert not any(c.name == "dcgm_compat" for c in CardMetrics(parse_config({}).exporter).collectors())
    with pytest.raises(ConfigError, match=r"^exporter\.dcgm_compat: expected true or false"):
        parse_config({"exporter": {"dcgm_compat": "yes"}})
    with pytest.raises(ConfigError, match=r"^exporter\.colour: unknown option"):
        parse_config({"exporter": {"colour": 1}})


@pytest.mark.e2e
def test_daemon_reports_the_last_xid_in_dcgm_form(tmp_path: Path) -> None:
    """DCGM_FI_DEV_XID_ERRORS carries the last XID the daemon's fault pipeline saw on each card."""
    from tests.support.daemon_process import DaemonProcess
    from tests.support.waiting import wait_until

    with DaemonProcess(tmp_path, extra_config='[exporter]\ndcgm_compat = true\ndcgm_compat_version = "4.8"\n') as d:
        assert d.xpuctl("simulate", "inject", "xid", "--gpu", "2", "code=48").returncode == 0
        assert d.xpuctl("simulate", "inject", "xid", "--gpu", "2", "code=79").returncode == 0

        def last_xid() -> dict[str, float]:
            out = {}
            for family in text_string_to_metric_families(d.metrics()):
                for s in family.samples:
                    if s.name == "DCGM_FI_DEV_XID_ERRORS":
                        out[s.labels["gpu"]] = s.value
            return out if out.get("2") == 79 else {}

        seen = wait_until(last_xid, "XID 79 on GPU 2 in DCGM form", 20, step=0.1)
        assert seen["0"] == 0, "a card without XIDs reports 0, as dcgm-exporter does"


# --- profiling, codecs, NVLink, pods, host-name label -------------------------------------------------------------


def test_profiling_fields_for_every_card_and_mig_instance(snapshot: Snapshot) -> None:
    text = render(snapshot, [*default_collectors(), Dcgm48("node-a")])
    for gpu in snapshot.gpus:
        g = str(gpu.index)
        assert one(text, "DCGM_FI_PROF_SM_ACTIVE", g) == one(text, "xpu_gpu_sm_active_ratio", g)
        assert one(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", g) == one(
            text, "xpu_gpu_tensor_active_ratio", g, pipe="any"
        )
        assert one(text, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", g) == one(text, "xpu_gpu_pipe_active_ratio", g, pipe="fp16")
        for name in (*PROFILING, *LINKS):
            one(text, name, g)  # exactly one series per card
        assert one(text, "DCGM_FI_PROF_PCIE_RX_BYTES", g) == one(text, "xpu_gpu_pcie_receive_bytes_per_second", g)
        for m in gpu.mig_instances:
            gi = str(m.gpu_instance_id)
            for name in PROFILING:
                one(text, name, g, GPU_I_ID=gi, GPU_I_PROFILE=m.profile_name)
            assert one(text, "DCGM_FI_PROF_DRAM_ACTIVE", g, GPU_I_ID=gi) == one(
                text, "xpu_mig_dram_active_ratio", g, gpu_instance_id=gi
            )


def test_codec_utilization_and_nvlink_total(snapshot: Snapshot) -> None:
    text = render(snapshot, [*default_collectors(), Dcgm48("node-a")])
    assert one(text, "DCGM_FI_DEV_ENC_UTIL", "0") == one(text, "xpu_gpu_encoder_utilization_ratio", "0") * 100
    assert one(text, "DCGM_FI_DEV_DEC_UTIL", "0") == one(text, "xpu_gpu_decoder_utilization_ratio", "0") * 100
    tx = one(text, "xpu_gpu_nvlink_transmit_bytes_per_second", "1")
    rx = one(text, "xpu_gpu_nvlink_receive_bytes_per_second", "1")
    assert tx > 0
    # DCGM's own arithmetic: NVML's KiB per second over 1000, truncated (DcgmCacheManager ReadAndCacheNvLinkBandwidth)
    assert one(text, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "1") == math.trunc((tx + rx) / 1024 / 1000)
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" not in text, "vGPU licensing does not exist on bare metal"


def test_profiling_absent_before_the_first_interval(sim: SimulatedBackend, clock: FakeClock) -> None:
    s = Sampler(sim, SamplerSettings(interval_seconds=1.0, call_deadline_seconds=2.0), clock=clock)
    first = s.run_once()
    s.stop()
    names = {n for n, _, _ in series(render(first, [Dcgm48("node-a")]))}
    assert not names & {*PROFILING, "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}
    assert "DCGM_FI_DEV_SM_CLOCK" in names


def test_hostname_label_for_older_dcgm_exporter_releases(snapshot: Snapshot) -> None:
    text = render(snapshot, [Dcgm48("node-a", hostname_label="Hostname")])
    for _, labels, _ in dcgm_series(text):
        assert labels["Hostname"] == "node-a" and "hostname" not in labels
    with pytest.raises(ValueError, match="hostname_label"):
        Dcgm48("node-a", hostname_label="HOSTNAME")


def _allocation(pod: str, container: str, gpu: int, uuid: str, gi: str = "", replica: str = "") -> Allocation:
    resource = "nvidia.com/mig-3g.71gb" if gi else "nvidia.com/gpu"
    return Allocation("ml", pod, container, resource, uuid + replica, gpu, uuid, gi)


def test_pod_labels_one_series_per_pod_on_a_shared_card(snapshot: Snapshot) -> None:
    uuid4, uuid7 = snapshot.gpus[4].uuid, snapshot.gpus[7].uuid
    gi = str(snapshot.gpus[7].mig_instances[0].gpu_instance_id)
    allocations = (
        _allocation("infer-a", "server", 4, uuid4, replica="::1"),
        _allocation("infer-b", "server", 4, uuid4, replica="::2"),
        _allocation("infer-b", "server", 4, uuid4, replica="::3"),  # two replicas, one container: one series
        _allocation("train-0", "trainer", 0, snapshot.gpus[0].uuid),
        _allocation("mig-job", "worker", 7, uuid7, gi=gi),
    )
    attribution = Attribution(seq=snapshot.seq, processes=(), allocations=allocations, kubelet=None,
                              unmatched_device_ids=0)  # fmt: skip
    text = render(snapshot, [Dcgm48("node-a", attribution=lambda: attribution)])
    used = [(ls, v) for n, ls, v in series(text) if n == "DCGM_FI_DEV_FB_USED" and ls["gpu"] == "4"]
    assert sorted(ls["pod"] for ls, _ in used) == ["infer-a", "infer-b"], "one series per pod sharing the card"
    assert len({v for _, v in used}) == 1, "each pod's series carries the card's value"
    assert all(ls["namespace"] == "ml" and ls["container"] == "server" for ls, _ in used)
    assert one(text, "DCGM_FI_DEV_SM_CLOCK", "0", pod="train-0", container="trainer") > 0
    free = [ls for n, ls, _ in series(text) if n == "DCGM_FI_DEV_SM_CLOCK" and ls["gpu"] == "2"]
    assert len(free) == 1 and "pod" not in free[0], "a card no pod holds keeps one series without pod labels"
    mig_series = [ls for n, ls, _ in series(text) if n == "DCGM_FI_PROF_SM_ACTIVE" and ls.get("GPU_I_ID") == gi]
    assert [ls["pod"] for ls in mig_series] == ["mig-job"]
    other_gi = [ls for n, ls, _ in series(text) if n == "DCGM_FI_PROF_SM_ACTIVE" and ls.get("GPU_I_ID") not in
                (None, gi) and ls["gpu"] == "7"]  # fmt: skip
    assert other_gi and all("pod" not in ls for ls in other_gi)
    card7 = [ls for n, ls, _ in series(text) if n == "DCGM_FI_PROF_SM_ACTIVE" and ls["gpu"] == "7" and
             "GPU_I_ID" not in ls]  # fmt: skip
    assert len(card7) == 1 and "pod" not in card7[0], "a MIG instance's pod does not label the whole card"
