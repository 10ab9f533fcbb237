"""packaging/libexec/xpu-nvidia-device-nodes, which xpu-nvidia-modprobe.service runs before xpu-healthd: one
`nvidia-modprobe -c=N` for the minor of every card in /proc/driver/nvidia/gpus, after `-u -c=0`.

The gpus directory is laid out as the kernel module writes it (tests/support/nvidia_gpus.py); nvidia-modprobe is a
stand-in that records its arguments. What this does not prove: that the real nvidia-modprobe makes the node (it is
NVIDIA's binary). tests/packaging/test_deb_nspawn.py runs the script under systemd, with a stand-in that also
creates the nodes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.nvidia_gpus import CARDS, write_gpus
from tests.support.servicehelpers import REPO

SCRIPT = REPO / "packaging" / "libexec" / "xpu-nvidia-device-nodes"


def fake_gpus(root: Path, cards: dict[str, int]) -> Path:
    return write_gpus(root / "gpus", cards)


def fake_modprobe(root: Path, fail_for: str = "") -> tuple[Path, Path]:
    log = root / "modprobe.log"
    exe = root / "nvidia-modprobe"
    exe.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$*" != "{fail_for}" ]\n')
    exe.chmod(0o755)
    return exe, log


def run(*args: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=30, check=False)


def test_every_listed_card_gets_its_node(tmp_path: Path) -> None:
    exe, log = fake_modprobe(tmp_path)
    done = run(exe, fake_gpus(tmp_path, CARDS))
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "-u -c=0", "the modules first: the gpus directory exists only once nvidia is loaded"
    assert sorted(calls[1:]) == sorted(f"-c={m}" for m in CARDS.values() if m != 0)
    assert len(calls) == len(CARDS), "minor 0 is not made twice"


def test_no_card_listed_still_loads_the_modules(tmp_path: Path) -> None:
    exe, log = fake_modprobe(tmp_path)
    done = run(exe, tmp_path / "no-such-dir")
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["-u -c=0"]


def test_a_failure_is_reported_and_the_other_cards_are_still_tried(tmp_path: Path) -> None:
    exe, log = fake_modprobe(tmp_path, fail_for="-c=3")
    gpus = fake_gpus(tmp_path, CARDS)
    (gpus / "0000:ff:00.0").mkdir()
    (gpus / "0000:ff:00.0" / "information").write_text("Model: \t\t NVIDIA H200\n")  # no minor line
    done = run(exe, gpus)
    assert done.returncode == 1
    assert "no device minor in" in done.stderr and "0000:ff:00.0" in done.stderr
    assert len(log.read_text().splitlines()) == len(CARDS), "every card is tried"
