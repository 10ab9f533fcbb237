"""The repository stands alone: no document, comment, scenario or test points at files outside it.

Notes that lived next to the repository while it was written (a shared research and fixtures directory) are in
neither the repository nor the .deb, so a reference to them is a dead end for every reader. The H200 capture the
code relies on lives in tests/fixtures/h200/ and is cited from there.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO

ROOT = REPO
SHARED = "shared"
# built from parts so that this file does not match itself
OUTSIDE = re.compile(
    "|".join(
        [
            rf"\.\./{SHARED}\b",
            rf"\b{SHARED}/(?:research|fixtures|design)\b",
            r"/work/(?:" + SHARED + r"|briefs|wt|main)\b",
            r"\bresearch §",
        ]
    )
)
TEXT_SUFFIXES = {".md", ".py", ".toml", ".proto", ".sh", ".yml", ".yaml", ".json", ".txt", ".cfg", ".service", ""}


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    files = [ROOT / name for name in out.decode().split("\0") if name]
    return [f for f in files if f.suffix in TEXT_SUFFIXES and f.is_file()]


def test_no_tracked_file_refers_to_a_path_outside_the_repository() -> None:
    offenders = []
    for path in tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert offenders == []


@pytest.mark.parametrize(
    "line",
    [
        f"see ../{SHARED}/research/health.md",
        f"({SHARED}/fixtures/h200/README.md)",
        f"/work/{SHARED}/x",
        "NVIDIA, research " + "§a",
    ],
)
def test_the_check_catches_each_form(line: str) -> None:
    assert OUTSIDE.search(line)


@pytest.mark.parametrize("line", ["tests/fixtures/h200/README.md", "a shared card", "shared/cache of the node"])
def test_the_check_leaves_ordinary_words_alone(line: str) -> None:
    assert not OUTSIDE.search(line)
