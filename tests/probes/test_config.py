from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.backends.types import ComputeMode
from healthd.config import ConfigError
from healthd.faults.model import Action
from healthd.probes.config import ProbeSettings, parse_probe_settings


def test_empty_section_gives_the_defaults() -> None:
    assert parse_probe_settings({}) == ProbeSettings()


def test_full_section() -> None:
    s = parse_probe_settings(
        {
            "proc_root": "/host/proc",
            "sysfs_root": "/host/sys",
            "kmsg_path": "",
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
    assert (s.proc_root, s.sysfs_root, s.kmsg_path) == (Path("/host/proc"), Path("/host/sys"), None)
    assert s.ecc.correctable_rate_per_hour == 50
    assert s.memory_leak.orphan_min_bytes == 512 * 2**20
    assert s.expected_gpus == 8
    assert s.configuration.compute_mode is ComputeMode.EXCLUSIVE_PROCESS
    assert s.configuration.persistence_mode is None
    assert s.xid.merge_window_seconds == 30
    assert s.xid_overrides[94].action is Action.NONE


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"ecc": {"correctable_rate_per_hour": 0}}, "health.ecc.correctable_rate_per_hour: must be > 0"),
        ({"ecc": {"correctable_rate_per_hour": "many"}}, "health.ecc.correctable_rate_per_hour: expected a number"),
        ({"ecc": {"colour": 1}}, "health.ecc.colour: unknown option"),
        ({"ecc": 3}, "health.ecc: expected a table"),
        ({"bogus": 1}, "health.bogus: unknown option"),
        ({"proc_root": "relative"}, "health.proc_root: expected an absolute path"),
        ({"lost_cards": {"expected_gpus": 0}}, "health.lost_cards.expected_gpus: must be >= 1"),
        ({"lost_cards": {"expected_gpus": True}}, "health.lost_cards.expected_gpus: expected an integer"),
        ({"configuration": {"compute_mode": "fast"}}, "health.configuration.compute_mode: must be one of"),
        ({"clocks": {"active_ratio": 1.5}}, "health.clocks.active_ratio: must be <= 1"),
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
        parse_probe_settings(table)
    assert str(err.value).startswith(message)


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_keys = st.sampled_from(["ecc", "nvlink", "memory_leak", "driver", "lost_cards", "configuration", "clocks", "xid"])
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
        "merge_window_seconds",
        "overrides",
    ]
) | st.text(max_size=25)


@given(st.dictionaries(_keys, st.dictionaries(_options, _values, max_size=3), max_size=3))
def test_any_table_is_accepted_or_a_config_error(table: dict[str, Any]) -> None:
    error = None
    try:
        parse_probe_settings(table)
    except ConfigError as exc:
        error = str(exc)
    assert error is None or error.startswith("health.")
