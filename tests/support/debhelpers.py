"""The .deb under test: the one .ci/run built (XPU_DEB), or one built now with packaging/build-deb.sh, once per
test session (tests/packaging/test_deb.py and tests/packaging/test_deb_nspawn.py share it)."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.servicehelpers import REPO


def deb_under_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if prebuilt := os.environ.get("XPU_DEB"):  # .ci/run builds it once and keeps it as the artifact
        return Path(prebuilt).resolve()
    out = tmp_path_factory.getbasetemp() / "deb-under-test"
    out.mkdir(exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built := sorted(out.glob("xpu-runtime-kit_*.deb")):
            return built[0]
        result = subprocess.run(
            [str(REPO / "packaging" / "build-deb.sh"), str(out)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        (path,) = out.glob("xpu-runtime-kit_*.deb")
        return path
