"""The benchmark suite's own machinery: node generator, /proc readers, module registry, table printer.

These check that the suite measures what it says (right node, right process, right rows); they never time anything.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import time
import tomllib
import types
from pathlib import Path

import pytest

from bench import attribution_bench, fault_latency_bench, nvml_overhead, partition_bench, run_all
from bench.common import BenchArgs, Row, SkipBench, percentile, proc_cpu_seconds, proc_status_kib
from bench.nvml_overhead import CallRecorder, replay
from bench.scenarios import scaled, scaled_data, to_toml, write_scenario
from exporter.backends.scenario import load_scenario, parse_scenario
from exporter.backends.simulated import SimulatedBackend


@pytest.mark.parametrize("gpus", [1, 8, 16, 64])
def test_scaled_node_has_unique_identities(gpus: int) -> None:
    s = scaled(gpus, 3)
    assert len(s.cards) == gpus
    assert len({c.uuid for c in s.cards}) == gpus
    assert len({c.pci_bus_id for c in s.cards}) == gpus
    assert len({c.serial for c in s.cards}) == gpus
    assert len({p.pid for p in s.processes}) == 3 * gpus
    assert all(sum(1 for p in s.processes if p.gpu == i) == 3 for i in range(gpus))


def test_scaled_node_repeats_the_h200x8_layout() -> None:
    template = load_scenario("h200x8")
    s = scaled(16)
    for i, card in enumerate(s.cards):
        assert card.mig_enabled == template.cards[i % 8].mig_enabled
    assert sorted((m.gpu, m.profile_id) for m in s.mig_instances) == sorted(
        (m.gpu + block, m.profile_id) for block in (0, 8) for m in template.mig_instances
    )
    assert s.mig_profiles == template.mig_profiles
    assert s.memory_total_bytes == template.memory_total_bytes


def test_scaled_node_runs_on_the_simulated_backend() -> None:
    sim = SimulatedBackend(scaled(16, 5))
    sim.open()
    assert sim.device_count() == 16
    uuids = {sim.device_info(i).uuid for i in range(16)}
    assert len(uuids) == 16
    assert all(len(sim.processes(i)) == 5 for i in range(16))
    mig_uuids = [m.uuid for i in range(16) for m in sim.mig_instances(i)]
    assert len(mig_uuids) == 4 and len(set(mig_uuids)) == 4


def test_scenario_file_round_trips_through_toml(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "node.toml", 8, 2)
    assert parse_scenario(tomllib.loads(path.read_text())) == scaled(8, 2)
    assert load_scenario(str(path)).cards == scaled(8, 2).cards


def test_to_toml_escapes_strings() -> None:
    data = {"node": {"name": 'a "quoted" \\ name', "flag": False, "ratio": 0.5, "pair": [[1, 2]]}}
    assert tomllib.loads(to_toml(data)) == data


@pytest.mark.parametrize(("gpus", "procs"), [(0, 0), (1, -1)])
def test_scaled_rejects_impossible_nodes(gpus: int, procs: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        scaled_data(gpus, procs)


SPIN_THEN_WAIT = """
import sys, time
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
sys.stdin.read()
"""


def test_proc_readers_see_a_busy_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", SPIN_THEN_WAIT], stdin=subprocess.PIPE)
    try:
        # the child spins for 0.3 s of CPU, then blocks on stdin; poll until /proc shows that CPU time
        for _ in range(2000):
            if proc_cpu_seconds(child.pid) >= 0.29:
                break
            time.sleep(0.01)
        assert proc_cpu_seconds(child.pid) >= 0.29
        assert proc_cpu_seconds(child.pid) < 5.0  # it is blocked now: it does not keep counting
        assert proc_status_kib(child.pid, "VmRSS") > 1000
        with pytest.raises(KeyError):
            proc_status_kib(child.pid, "NoSuchKey")
    finally:
        child.kill()
        child.wait()
        assert child.stdin is not None
        child.stdin.close()


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0


def test_registry_reports_absent_skipped_and_failed_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "fakebench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good_bench.py").write_text(
        "from bench.common import Row\nNAME = 'good'\n"
        "def run(args):\n    return [Row('latency p50', 'ms', 1.5, gpus=g) for g in args.gpu_counts]\n"
    )
    (pkg / "skip_bench.py").write_text(
        "from bench.common import SkipBench\ndef run(args):\n    raise SkipBench('needs a GPU')\n"
    )
    (pkg / "broken_bench.py").write_text("def run(args):\n    raise RuntimeError('boom')\n")
    (pkg / "baddep_bench.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = BenchArgs(gpu_counts=(1, 8))
    good = run_all.run_module("fakebench.good_bench", "what", args)
    assert good.status == "ok" and [r.gpus for r in good.rows] == [1, 8]
    assert run_all.run_module("fakebench.absent_bench", "what", args).status == "absent"
    assert run_all.run_module("fakebench.skip_bench", "what", args).detail == "needs a GPU"
    assert run_all.run_module("fakebench.broken_bench", "what", args).status == "failed"
    # a bench module that exists but misses a dependency is a failure, not "absent"
    assert run_all.run_module("fakebench.baddep_bench", "what", args).status == "failed"
    assert issubclass(SkipBench, Exception)


def test_table_puts_gpu_counts_in_columns_and_processes_per_gpu_in_rows() -> None:
    rows = (
        Row("scrape p50", "ms", 1.0, gpus=1, processes=0),
        Row("scrape p50", "ms", 9.0, gpus=8, processes=0),
        Row("scrape p50", "ms", 2.0, gpus=1, processes=10),
        Row("scrape p50", "ms", 20.0, gpus=8, processes=80),
        Row("node total", "", 3.0),
    )
    table = run_all.format_table([run_all.Outcome("m", "metrics", "what", rows)])
    lines = table.splitlines()
    assert "1 GPU" in lines[0] and "8 GPUs" in lines[0] and "node" in lines[0]
    flat = [line.split() for line in lines if line.startswith("scrape p50")]
    assert flat[0][2:7] == ["0/gpu", "-", "|", "1.00", "9.00"]
    assert flat[1][2:7] == ["10/gpu", "-", "|", "2.00", "20"]
    absent = run_all.format_table([run_all.Outcome("m", "partition", "what", status="absent", detail="not here")])
    assert "ABSENT - not here" in absent


def test_call_recorder_keeps_top_level_calls_and_restores_the_module() -> None:
    fake = types.ModuleType("fake_nvml")

    class FakeError(Exception):
        pass

    seen: list[str] = []

    def nvml_inner(x: int) -> int:
        seen.append(f"inner{x}")
        return x

    def nvml_outer(x: int) -> int:
        seen.append(f"outer{x}")
        return fake.nvml_inner(x) + 1

    def nvml_fails() -> None:
        seen.append("fails")
        raise FakeError

    fake.nvml_inner, fake.nvml_outer, fake.nvml_fails = nvml_inner, nvml_outer, nvml_fails
    fake.NVML_CONSTANT = 7
    recorder = CallRecorder(fake)
    with recorder.recording() as calls:
        assert fake.nvml_outer(1) == 2
        fake.nvml_inner(5)
        with pytest.raises(FakeError):
            fake.nvml_fails()
    assert [(c.name, c.args) for c in calls] == [("nvml_outer", (1,)), ("nvml_inner", (5,)), ("nvml_fails", ())]
    assert fake.nvml_outer is nvml_outer and fake.nvml_inner is nvml_inner  # restored
    seen.clear()
    replay(calls, FakeError)  # the same calls again, errors caught as the backend catches them
    assert seen == ["outer1", "inner1", "inner5", "fails"]


def test_nvml_overhead_skips_without_a_driver() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        with pytest.raises(SkipBench, match="driver"):
            nvml_overhead.measure(1)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present: bench/nvml_overhead.py measures for real there")


def test_call_recorder_keeps_signatures_the_backend_inspects() -> None:
    fake = types.ModuleType("fake_nvml")

    def nvml_list(device: int, profile: int, items: list[int], count: list[int]) -> None:
        return None

    fake.nvml_list = nvml_list
    with CallRecorder(fake).recording():
        assert list(inspect.signature(fake.nvml_list).parameters) == ["device", "profile", "items", "count"]


@pytest.mark.parametrize(("module", "what"), run_all.MODULES)
def test_every_listed_module_is_present_with_the_bench_interface(module: str, what: str) -> None:
    mod = run_all.import_bench(module)
    assert mod is not None, f"{module} is listed but not in the tree"
    assert module.rsplit(".", 1)[-1].removesuffix("_bench") == mod.NAME  # what --only selects
    assert list(inspect.signature(mod.run).parameters) == ["args"]


@pytest.mark.parametrize("mod", [fault_latency_bench, partition_bench, attribution_bench])
def test_standalone_scripts_keep_their_command_line(mod: types.ModuleType) -> None:
    assert callable(mod.main)
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    assert exc.value.code == 0


@pytest.mark.e2e
def test_fault_latency_rows_follow_every_xid_to_subscriber_and_hook(capsys: pytest.CaptureFixture[str]) -> None:
    # 30 asked of a 1-GPU node: only the 26 distinct (GPU, XID) pairs can become new faults
    s = fault_latency_bench.measure(30, "xid", gpus=1)
    assert len(s.to_subscriber) == len(s.to_hook) == len(s.commit) == len(fault_latency_bench.action_xids()) == 26
    assert min(s.to_subscriber) > 0 and min(s.to_hook) > 0
    rows = fault_latency_bench.rows(s)
    assert {r.gpus for r in rows} == {1} and all(r.unit == "ms" and r.value > 0 for r in rows)
    assert fault_latency_bench.main(["--count", "2", "--gpus", "2"]) == 0
    assert "XID -> hook command running" in capsys.readouterr().out


@pytest.mark.e2e
def test_partition_rows_have_mig_only_where_the_node_has_a_mig_card() -> None:
    small = partition_bench.rows(partition_bench.measure(1, rounds=2, clients=2))
    assert not any(r.metric.startswith("MIG") for r in small)
    s = partition_bench.measure(8, rounds=2, clients=2)
    assert len(s.tdm_create) == len(s.mig_create) == 2 and s.tdm_cards == 4
    assert len(s.concurrent_create) == len(s.concurrent_delete) == 2  # 2 clients x max(1, 2 // 4) rounds
    rows = partition_bench.rows(s)
    assert {r.gpus for r in rows} == {8}
    assert {"TDM create p99 (1 client)", "MIG delete p50 (1 client)", "TDM create p50 (2 clients)"} <= {
        r.metric for r in rows
    }


def test_attribution_rows_count_the_processes_and_pods_attributed(capsys: pytest.CaptureFixture[str]) -> None:
    s = attribution_bench.measure(8, 40, 10, renders=2, cycles=2)
    assert (s.gpus, s.processes, s.pods, s.unattributed) == (8, 40, 10, 0)
    assert s.body_full > s.body_plain
    rows = attribution_bench.rows(s)
    assert {(r.gpus, r.processes, r.pods) for r in rows} == {(8, 40, 10)}
    empty = attribution_bench.measure(1, 0, 0, renders=2, cycles=2)
    assert (empty.processes, empty.pods) == (0, 0)
    assert attribution_bench.main(["--gpus", "1", "--processes", "8", "--pods", "2", "--renders", "2"]) == 0
    assert "1 GPUs, 8 GPU processes, 2 pods" in capsys.readouterr().out


def test_attribution_places_pods_on_whole_cards_only() -> None:
    sim = SimulatedBackend(scaled(8))
    attribution_bench.place(sim, 40, 10)
    work = sim.workloads()
    assert len(work) == 40 and len({(w.pod.namespace, w.pod.pod) for w in work if w.pod}) == 10
    mig_cards = {i for i, c in enumerate(sim.scenario.cards) if c.mig_enabled}
    assert mig_cards and not any(w.gpu in mig_cards for w in work)
    assert all(len({w.gpu for w in work if w.pod and w.pod.pod == p}) == 1 for p in {w.pod.pod for w in work if w.pod})


def test_scrape_bench_splits_a_body_by_what_each_series_describes() -> None:
    from bench.scrape_bench import composition

    text = (
        "# HELP xpu_gpu_up Up.\n# TYPE xpu_gpu_up gauge\n"
        'xpu_gpu_up{gpu="0",uuid="GPU-a"} 1.0\n'
        'xpu_process_sm_utilization_ratio{pid="7",pod="p",uuid="GPU-a"} 0.5\n'
        'xpu_pod_gpu_processes{namespace="n",pod="p",uuid="GPU-a"} 1.0\n'
        'xpu_health_check_status{check="x",gpu="",status="ok",uuid=""} 1.0\n'
        "xpu_gpus 1.0\n"
        'xpu_backend_info{backend="pid=\\"1\\""} 1.0\n'
    )
    c = composition(text)
    assert c.series == {"card": 2, "process": 1, "pod": 1, "node": 2}
    assert sum(c.bytes.values()) == c.total_bytes == len(text)
    assert c.bytes["card"] == len("# HELP xpu_gpu_up Up.\n# TYPE xpu_gpu_up gauge\n") + len(
        'xpu_gpu_up{gpu="0",uuid="GPU-a"} 1.0\n'
    ) + len('xpu_health_check_status{check="x",gpu="",status="ok",uuid=""} 1.0\n')


def test_cycle_latency_places_each_probe_at_its_phase_after_card_0s_sample() -> None:
    from bench.cycle_latency_bench import Probes, phase

    probes = Probes("this", card0_sampled=1000.0, interval=5.0)
    assert phase(probes, 1000.3) == pytest.approx(0.3)
    assert phase(probes, 999.95) == pytest.approx(-0.05)  # the fan-out just before the sample
    assert phase(probes, 1004.5) == pytest.approx(-0.5)  # the next cycle's, half a second before its sample
    assert phase(probes, 1010.2) == pytest.approx(0.2)  # cycles later, the same phase
