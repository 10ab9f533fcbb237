"""The .deb under test: the one .ci/run built (XPU_DEB), or one built now with packaging/build-deb.sh."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from servicehelpers import REPO


def deb_under_test(out: Path) -> Path:
    if prebuilt := os.environ.get("XPU_DEB"):  # .ci/run builds it once and keeps it as the artifact
        return Path(prebuilt).resolve()
    result = subprocess.run(
        [str(REPO / "packaging" / "build-deb.sh"), str(out)], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = out.glob("xpu-runtime-kit_*.deb")
    return path
