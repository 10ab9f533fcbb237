"""Optional libraries are imported only where a configured feature needs them, never when a module is imported.

Every module of the daemon, the exporter, the device plugin and the device check's steps is imported in a process
where the optional libraries cannot be imported (as on the GPU machine the device check runs on, which has no
bcrypt and no systemd-python): bcrypt (basic auth), PyYAML (a web config file), systemd-python (only under
systemd), torch (only in the GPU clients), nvitop (only the peers step runs it), cryptography (tests only).
A module-level import of any of them makes this test fail, naming the module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

OPTIONAL = ("bcrypt", "yaml", "systemd", "torch", "nvitop", "nvitop_exporter", "cryptography")
PACKAGES = ("exporter", "healthd", "container/deviceplugin")
DEVICE_CHECK = (
    "bench.device_check", "bench.check_plan", "bench.check_runner", "bench.check_pack", "bench.check_setup",
    "bench.device_report", "bench.check_daemon", "bench.check_throughput", "bench.check_peers", "bench.tdm_sharing",
    "bench.tdm_client", "bench.gpu_throughput", "bench.mps_timing", "bench.nvml_overhead", "bench.xid_registration",
    "bench.gpm_check", "bench.with_capture_nvml",
)  # fmt: skip

# Imports each module named on the command line with the optional libraries blocked; prints the ones that fail.
CHECKER = """
import importlib, importlib.abc, sys, traceback
blocked = set(sys.argv[1].split(","))
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (optional, blocked here)", name=name)
        return None
sys.meta_path.insert(0, Blocked())
failed = 0
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
    except Exception:
        failed += 1
        print(f"{module}: {traceback.format_exc().strip().splitlines()[-1]}")
sys.exit(1 if failed else 0)
"""


def modules(package: str) -> list[str]:
    names = []
    for path in sorted((REPO / package).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__main__":  # running it is not importing it
            continue
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def import_blocked(names: list[str], extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = [str(REPO), *([str(extra_path)] if extra_path else [])]
    code = f"import sys; sys.path[:0] = {path!r}\n" + CHECKER
    return subprocess.run([sys.executable, "-c", code, ",".join(OPTIONAL), *names], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


def test_no_module_imports_an_optional_library_when_imported() -> None:
    names = [m for package in PACKAGES for m in modules(package)] + list(DEVICE_CHECK)
    assert len(names) > 150  # the walk found the tree
    done = import_blocked(names)
    assert done.returncode == 0, f"modules that import an optional library when imported:\n{done.stdout}{done.stderr}"


def test_the_check_names_a_module_that_imports_one(tmp_path: Path) -> None:
    (tmp_path / "eager_yaml.py").write_text("import yaml\n")
    (tmp_path / "lazy_yaml.py").write_text("def load():\n    import yaml\n    return yaml\n")
    done = import_blocked(["lazy_yaml", "eager_yaml"], tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "eager_yaml: ModuleNotFoundError: No module named 'yaml' (optional, blocked here)"
    ]
