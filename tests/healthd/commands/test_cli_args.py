"""What xpuctl parses before anything is sent: KEY=VALUE fault parameters, -o/--json, and a bare `xpuctl`."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from healthd.cli import build_parser, main
from healthd.commands.simulate import _params

KEY = st.text(st.characters(codec="ascii", exclude_characters="="), min_size=1, max_size=12)
VALUE = st.text(st.characters(codec="utf-8"), max_size=20)


@given(st.dictionaries(KEY, VALUE, max_size=6))
def test_key_value_pairs_round_trip(pairs: dict[str, str]) -> None:
    assert _params([f"{k}={v}" for k, v in pairs.items()]) == pairs  # a value may itself hold "="


@given(st.text(st.characters(codec="utf-8", exclude_characters="="), max_size=12))
def test_a_pair_without_a_key_or_an_equals_sign_is_refused(text: str) -> None:
    for bad in (text, f"={text}"):
        with pytest.raises(ValueError, match="expected KEY=VALUE"):
            _params([bad])


@pytest.mark.parametrize("argv", [["health", "--json"], ["health", "-o", "json"], ["faults", "list", "--output=json"]])
def test_json_is_asked_for_in_either_habit(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).output == "json"
    assert build_parser().parse_args(argv[:1] if argv[0] == "health" else argv[:2]).output == "table"


def test_bare_xpuctl_prints_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: xpuctl") and "gpus" in err and "health" in err


def test_hook_serve_refuses_a_program_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before anything listens: a missing ./swap-node.sh would fail every fault with exit 127."""
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\n")
    for program, why in ((str(tmp_path / "swap-node.sh"), "does not exist"), (str(script), "is not executable")):
        argv = ["hook", "serve", "--listen", f"unix:{tmp_path / 'h.sock'}", "--exec", f"{program} --now"]
        assert main([*argv, "--state", str(tmp_path / "h.sqlite")]) == 2
        assert capsys.readouterr().err.strip() == f"xpuctl: --exec: {program} {why}"
        assert not (tmp_path / "h.sock").exists()
