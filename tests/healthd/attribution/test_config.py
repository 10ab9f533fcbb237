"""[attribution] config section: defaults, validation messages that name the option, and the switches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.backends.simulated import SimulatedBackend
from healthd.attribution import component as attribution
from healthd.attribution.component import AttributionSettings
from healthd.daemon.config import Config, ConfigError, parse_config
from tests.support.node import node_on


def test_defaults() -> None:
    a = parse_config({}).attribution
    assert a == AttributionSettings()
    assert a.process_metrics
    assert a.pod_metrics


def test_full_section_is_read() -> None:
    config = parse_config(
        {
            "attribution": {
                "process_metrics": False,
                "pod_metrics": True,
                "max_processes_per_gpu": 16,
                "refresh_interval_seconds": 30,
            },
            "host": {
                "proc_root": "/host/proc",
                "pod_logs_root": "/host/var/log",
                "kubelet_socket": "/host/kubelet/pod-resources/kubelet.sock",
            },
        }
    )
    assert config.attribution == AttributionSettings(False, True, 16, 30.0)
    assert config.host.proc_root == Path("/host/proc")
    assert config.host.pod_logs_root == Path("/host/var/log")
    assert config.host.kubelet_socket == Path("/host/kubelet/pod-resources/kubelet.sock")


def test_node_paths_are_host_settings() -> None:
    with pytest.raises(ConfigError, match=r"^attribution.proc_root: unknown option"):
        parse_config({"attribution": {"proc_root": "/host/proc"}})
    host = parse_config({}).host
    assert host.proc_root == Path("/proc")
    assert host.kubelet_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"procroot": "/proc"}, "attribution.procroot: unknown option"),
        ({"process_metrics": "yes"}, "attribution.process_metrics: expected true or false"),
        ({"max_processes_per_gpu": 0}, "attribution.max_processes_per_gpu: must be between 1 and 10000"),
        ({"max_processes_per_gpu": True}, "attribution.max_processes_per_gpu"),
        ({"max_processes_per_gpu": 2.5}, "attribution.max_processes_per_gpu"),
        ({"refresh_interval_seconds": 0}, "attribution.refresh_interval_seconds: must be between"),
    ],
)
def test_bad_values_name_the_option(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"attribution": section})
    assert str(err.value).startswith(message)


def test_section_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match=r"^attribution: expected a table"):
        parse_config({"attribution": 3})


@given(
    st.dictionaries(
        st.sampled_from(["max_processes_per_gpu", "refresh_interval_seconds", "process_metrics"]),
        st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=10), st.booleans()),
    )
)
def test_any_value_is_accepted_or_rejected_cleanly(section: dict[str, Any]) -> None:
    message = ""
    try:
        parse_config({"attribution": section})
    except ConfigError as exc:
        message = str(exc)
    assert message == "" or message.startswith("attribution.")


@pytest.mark.parametrize(
    ("process", "pod", "names"),
    [(True, True, ["process", "pod"]), (False, True, ["pod"]), (True, False, ["process"]), (False, False, [])],
)
def test_switches_choose_the_collectors(tmp_path: Path, process: bool, pod: bool, names: list[str]) -> None:
    settings = AttributionSettings(process_metrics=process, pod_metrics=pod)
    node = node_on(SimulatedBackend.from_name("h200x1"), tmp_path / "state", Config(attribution=settings))
    part = attribution.build(node)
    assert [c.name for c in part.collectors()] == names
    assert part.enabled == (process or pod)
    assert ("attribution" in [s.name for s in node.sampler.subscriber_stats()]) == part.enabled
    node.sampler.stop()
