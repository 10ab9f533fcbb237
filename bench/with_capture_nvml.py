"""Run a bench script with pynvml answering from the real H200 capture: the rehearsal's stand-in for a card.

The device check's NVML steps (GPM, XID registration, NVML overhead) call pynvml themselves. In the rehearsal
(bench/device_check.py --rehearse) they run through this, over tests/support/nvml_capture_fake.py: the same
NvmlBackend and pynvml code paths, answering what one NVIDIA H200 answered (no NVLink, MIG off). It proves the
steps start and report on the device machine's package set; it proves nothing about a driver.

    python3 -m bench.with_capture_nvml SCRIPT [ARGS ...]
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python3 -m bench.with_capture_nvml SCRIPT [ARGS ...]")
    import pytest

    from tests.support.nvml_capture_fake import install

    install(pytest.MonkeyPatch())
    script = str(REPO / argv[0]) if not Path(argv[0]).is_absolute() else argv[0]
    sys.argv = [script, *argv[1:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
