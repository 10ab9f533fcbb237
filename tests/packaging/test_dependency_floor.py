"""The lowest nvidia-ml-py that pyproject.toml admits really works with the NVML backend.

A separate virtualenv gets exactly the floor version and nothing else of its own; the project's other dependencies
come from the development venv behind it (a .pth file), so the pynvml imported there is the floor's. In it, the
NVML backend is imported and its tests over the H200 capture fake run: the read-only Backend contract and the
translation checks (tests/exporter/backends/test_nvml_capture.py).

Why 12.570.86: it is the first release with every pynvml constant exporter/backends/nvml/ uses. Checked against
PyPI: 12.535.161 lacks NVML_ERROR_INVALID_STATE, 12.550.89 and 12.555.43 lack NVML_VALUE_TYPE_UNSIGNED_SHORT,
12.560.30 lacks NVML_FI_DEV_GET_GPU_RECOVERY_ACTION. Needs the package index (pip), as the .deb build does.
"""

from __future__ import annotations

import re
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.servicehelpers import REPO

pytestmark = pytest.mark.timeout(600)


def floor_version() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if re.match(r"nvidia-ml-py\b", d)]
    match = re.fullmatch(r"nvidia-ml-py\s*>=\s*([0-9.]+)", spec.split(";")[0].strip())
    assert match, f"the nvidia-ml-py requirement must be a plain floor (>=X), got {spec!r}"
    return match.group(1)


def run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)
    assert done.returncode == 0, (
        f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


@pytest.fixture(scope="module")
def floor_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("floor") / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            f"nvidia-ml-py=={floor_version()}",
        ]
    )
    (own,) = run([str(python), "-c", "import site; print(*site.getsitepackages())"]).stdout.split()
    behind = ", ".join(repr(p) for p in site.getsitepackages())
    (Path(own) / "zz-development-venv.pth").write_text(f"import site; list(map(site.addsitedir, ({behind},)))\n")
    return python


def test_floor_is_installed_and_shadows_the_development_version(floor_python: Path) -> None:
    probe = "import importlib.metadata as m, pynvml; print(m.version('nvidia-ml-py')); print(pynvml.__file__)"
    version, path = run([str(floor_python), "-c", probe]).stdout.split()
    assert version == floor_version()
    assert Path(path).is_relative_to(floor_python.parent.parent)


def test_backend_imports_and_passes_its_capture_tests_on_the_floor(floor_python: Path) -> None:
    run([str(floor_python), "-c", "import exporter.backends.nvml"])
    done = run(
        [
            str(floor_python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/exporter/backends/test_nvml_capture.py",
        ]
    )
    assert re.search(r"\b\d+ passed\b", done.stdout) and " failed" not in done.stdout, done.stdout[-2000:]
