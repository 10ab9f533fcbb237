"""[health]: one table per registered probe, read by the settings each probe module declares."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthd.daemon.config import ConfigError, parse_config
from healthd.findings import Action
from healthd.probes import PROBES, HealthSettings, ProbeHost, default_probes, parse_health
from healthd.probes.configuration import ConfigurationProbe
from tests.support.probe_node import Node, codes


def test_empty_section_gives_the_defaults() -> None:
    assert parse_health({}) == HealthSettings()
    assert parse_config({}).health == HealthSettings()


def test_every_registered_probe_has_a_section_and_is_built() -> None:
    sections = [m.SECTION for m in PROBES]
    assert len(sections) == len(set(sections))
    probes = default_probes(HealthSettings(), ProbeHost())
    assert len(probes) == len(PROBES)
    assert len({p.name for p in probes}) == len(probes)


def test_full_section(h200x8: Node) -> None:
    s = parse_health(
        {
            "ecc": {"correctable_rate_per_hour": 50, "uncorrectable_remap_warn": 100},
            "nvlink": {"crc_per_second_fail": 10},
            "memory_leak": {"orphan_min_mib": 512, "orphan_samples": 3},
            "driver": {"hang_after_seconds": 60},
            "lost_cards": {"expected_gpus": 8},
            "configuration": {"compute_mode": "exclusive_process", "persistence_mode": "any", "ecc": "any"},
            "clocks": {"active_ratio": 0.5},
            "pcie": {"consecutive_samples": 6},
            "xid": {"merge_window_seconds": 30, "overrides": {"94": {"action": "none", "severity": "info"}}},
        }
    )
    assert s.probe("ecc").correctable_rate_per_hour == 50
    assert s.probe("memory_leak").orphan_min_mib == 512
    assert s.probe("lost_cards").expected_gpus == 8
    assert s.probe("driver").hang_after_seconds == 60
    assert s.probe("clocks").active_ratio == 0.5
    assert s.probe("pcie").consecutive_samples == 6
    assert s.xid.merge_window_seconds == 30
    assert s.xid.overrides[94].action is Action.NONE
    configuration = [p for p in default_probes(s, ProbeHost()) if isinstance(p, ConfigurationProbe)]
    assert len(configuration) == 1
    # the simulated cards run compute mode default and one has persistence off: "any" leaves that unchecked
    assert codes(configuration[0].evaluate(h200x8.tick(), 0)) == {"compute_mode_unexpected"}


def test_paths_live_in_host_not_health() -> None:
    with pytest.raises(ConfigError, match=r"^health.proc_root: unknown option"):
        parse_health({"proc_root": "/host/proc"})
    assert str(parse_config({"host": {"proc_root": "/host/proc"}}).host.proc_root) == "/host/proc"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"ecc": {"correctable_rate_per_hour": 0}}, "health.ecc.correctable_rate_per_hour: must be > 0"),
        ({"ecc": {"correctable_rate_per_hour": "many"}}, "health.ecc.correctable_rate_per_hour: expected a number"),
        ({"ecc": {"colour": 1}}, "health.ecc.colour: unknown option"),
        ({"ecc": 3}, "health.ecc: expected a table"),
        ({"bogus": 1}, "health.bogus: unknown option"),
        ({"lost_cards": {"expected_gpus": -1}}, "health.lost_cards.expected_gpus: must be at least 0"),
        ({"lost_cards": {"expected_gpus": True}}, "health.lost_cards.expected_gpus: expected an integer"),
        ({"configuration": {"compute_mode": "fast"}}, "health.configuration.compute_mode: must be one of"),
        ({"clocks": {"active_ratio": 1.5}}, "health.clocks.active_ratio: must be at most 1"),
        (
            {"configuration": {"pending_grace_seconds": float("nan")}},
            "health.configuration.pending_grace_seconds: must be a finite",
        ),
        ({"xid": {"overrides": {"13": {"action": "pray"}}}}, "health.xid.overrides.13.action: must be one of"),
        ({"xid": {"overrides": []}}, "health.xid.overrides: expected a table"),
    ],
)
def test_errors_name_the_option(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_health(table)
    assert str(err.value).startswith(message)


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_keys = st.sampled_from([*(m.SECTION for m in PROBES), "xid"]) | st.text(max_size=10)
_options = st.sampled_from(
    [
        "correctable_rate_per_hour",
        "correctable_window_seconds",
        "uncorrectable_remap_warn",
        "crc_per_second_fail",
        "error_hold_seconds",
        "orphan_min_mib",
        "growth_window_seconds",
        "hang_after_seconds",
        "expected_gpus",
        "compute_mode",
        "persistence_mode",
        "pending_grace_seconds",
        "window_seconds",
        "active_ratio",
        "consecutive_samples",
        "merge_window_seconds",
        "overrides",
    ]
) | st.text(max_size=25)


@given(st.dictionaries(_keys, st.dictionaries(_options, _values, max_size=3), max_size=3))
def test_any_table_is_accepted_or_a_config_error(table: dict[str, Any]) -> None:
    error = None
    try:
        parse_health(table)
    except ConfigError as exc:
        error = str(exc)
    assert error is None or error.startswith("health.")
