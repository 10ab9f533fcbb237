"""Hostile configuration files and scenarios: each is one line on stderr and exit status 2, at once.

Run as the real program (``--check-config`` is what the unit's ``ExecStartPre=`` runs), each with a deadline: a
FIFO or ``/dev/zero`` given as ``--config`` used to block or eat memory until killed, which the deadline turns into
a failure rather than a hung test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from exporter.backends.scenario import MAX_GPUS

pytestmark = pytest.mark.e2e


def check_config(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "healthd", "--check-config", "--metrics-listen", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def one_line(out: subprocess.CompletedProcess[str], *must_name: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout[-1000:], out.stderr[-2000:])
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("xpu-healthd: "), out.stderr[-3000:]
    for text in must_name:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def test_a_fifo_as_config_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "healthd.toml"
    os.mkfifo(fifo)
    one_line(check_config("--config", str(fifo)), str(fifo), "not a regular file")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_config_is_refused_without_reading_it(device: str) -> None:
    one_line(check_config("--config", device), device, "not a regular file")


def test_a_huge_config_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * 500_000)  # 5 MB of comments
    one_line(check_config("--config", str(big)), str(big), "larger than")


def test_deeply_nested_toml_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    one_line(check_config("--config", str(deep)), str(deep), "nested too deeply")
    scenario = tmp_path / "deep-scenario.toml"
    scenario.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    one_line(check_config("--simulate", str(scenario)), str(scenario), "nested too deeply")


def builtin(name: str) -> str:
    return resources.files("exporter.scenarios").joinpath(f"{name}.toml").read_text()


def test_a_scenario_with_nan_fails_the_check_not_the_start(tmp_path: Path) -> None:
    scenario = tmp_path / "nan.toml"
    text = builtin("h200x1").replace("power_limit_watts = 700.0", "power_limit_watts = nan")
    assert "nan" in text
    scenario.write_text(text)
    one_line(check_config("--simulate", str(scenario)), "card.power_limit_watts", "not a finite number")


def test_a_scenario_with_too_many_gpus_is_refused(tmp_path: Path) -> None:
    text = builtin("h200x1")
    first, last = text.index("[[gpus]]"), text.index("[[mig_profiles]]")
    block = text[first:last]
    m = re.search(r'uuid = "(GPU-[^"]+)"', block)
    assert m is not None
    gpus = [block.replace(m.group(1), f"GPU-{i:08x}-1111-2222-3333-444444444444") for i in range(MAX_GPUS + 1)]
    scenario = tmp_path / "many.toml"
    scenario.write_text(text[:first] + "\n".join(gpus) + text[last:])
    one_line(check_config("--simulate", str(scenario)), f"at most {MAX_GPUS}")
