"""The built .deb as Debian's tools judge it: lintian reports no error, every override says why, and no path of the
machine that built it is inside (a RUNPATH into another interpreter's prefix, the checkout, the build directory).

lintian is Debian's (``./dev test`` installs it). With XPU_DEB set (CI) a missing lintian is a failure, elsewhere a
skip. The package's own build also refuses a foreign RUNPATH (packaging/build-deb.sh); this test reads the finished
file, so it holds whatever produced it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.debhelpers import deb_under_test
from tests.support.servicehelpers import REPO

pytestmark = pytest.mark.deb

OVERRIDES = REPO / "packaging" / "deb" / "lintian-overrides"
ELF_MAGIC = b"\x7fELF"
# a path component exactly: "/root" followed by "/" or the end of a string, never "/usr/share/grpc/roots.pem"
ROOT_HOME = re.compile(rb"(?<![\w.-])/root(?=/|[\x00\"' \n:]|$)")
# Rust panic locations that a binary wheel from PyPI carries (pydantic-core, which the Kubernetes client needs, is
# built by maturin on a manylinux image whose crate registry is /root/.cargo): the path of the machine that built
# that wheel, not of this one. Forgiven only in files of a distribution installed from a manylinux wheel.
UPSTREAM_CRATE_PATH = re.compile(rb"/root/\.cargo/registry/src/[\w.-]+/")


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        message = f"{name} is not installed (./dev test installs it)"
        if os.environ.get("XPU_DEB"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _tool("dpkg-deb")
    return deb_under_test(tmp_path_factory)


@pytest.fixture(scope="module")
def unpacked(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("deb-contents")
    subprocess.run(["dpkg-deb", "-R", str(deb), str(root)], check=True, timeout=120)
    return root


def test_lintian_reports_no_error(deb: Path) -> None:
    lintian = _tool("lintian")
    done = subprocess.run(
        [lintian, "--pedantic", "--display-info", "--fail-on", "error", str(deb)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    tags = [line for line in done.stdout.splitlines() if re.match(r"^[EWIPX]: ", line)]
    counts = {kind: sum(t.startswith(f"{kind}:") for t in tags) for kind in "EWIP"}
    print(f"lintian: {counts}")
    errors = [t for t in tags if t.startswith("E:")]
    assert not errors, "\n".join(errors)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_every_lintian_override_is_justified_and_installed(unpacked: Path) -> None:
    """Each paragraph of the file: comment lines saying why, then the overrides they justify."""
    paragraphs = [p.splitlines() for p in OVERRIDES.read_text().split("\n\n")]
    overrides = 0
    for lines in paragraphs:
        comments = [line for line in lines if line.startswith("#")]
        tags = [line for line in lines if line.strip() and not line.startswith("#")]
        assert all(t.startswith("xpu-runtime-kit: ") for t in tags), tags
        assert not tags or (comments and lines.index(tags[0]) > lines.index(comments[-1])), f"unexplained: {tags}"
        overrides += len(tags)
    assert overrides > 0
    installed = unpacked / "usr/share/lintian/overrides/xpu-runtime-kit"
    assert installed.read_text() == OVERRIDES.read_text()


def test_control_data_names_a_maintainer_libc_and_checksums(unpacked: Path) -> None:
    control = dict(re.findall(r"^([A-Za-z-]+): (.*)$", (unpacked / "DEBIAN/control").read_text(), flags=re.MULTILINE))
    assert not control["Maintainer"].endswith("@localhost>"), control["Maintainer"]
    assert re.search(r"\blibc6 \(>= [0-9.]+\)", control["Depends"]), control["Depends"]
    assert "libsystemd0" in control["Depends"]  # systemd-python's extensions link it
    sums = dict(line.split(maxsplit=1)[::-1] for line in (unpacked / "DEBIAN/md5sums").read_text().splitlines())
    shipped = {str(p.relative_to(unpacked)) for p in unpacked.rglob("*") if p.is_file() and not p.is_symlink()} - {
        str(p.relative_to(unpacked)) for p in (unpacked / "DEBIAN").iterdir()
    }
    conffiles = {line.lstrip("/") for line in (unpacked / "DEBIAN/conffiles").read_text().split()}
    assert set(sums) == shipped - conffiles
    assert (unpacked / "usr/share/doc/xpu-runtime-kit/changelog.gz").is_file()


def _build_machine_paths() -> list[bytes]:
    paths = {str(REPO), str(REPO / ".venv"), str(Path.home() / ".cache" / "pip"), "/.pyenv/", "xpu-deb."}
    if Path.home() != Path("/root"):
        paths.add(str(Path.home()))
    return sorted(p.encode() for p in paths)


def _from_manylinux_wheels(unpacked: Path) -> set[Path]:
    """The files of every distribution in the package that was installed from a manylinux wheel (built elsewhere)."""
    files: set[Path] = set()
    for wheel in unpacked.rglob("*.dist-info/WHEEL"):
        if not re.search(r"^Tag: .*-(many|musl)linux", wheel.read_text(), flags=re.MULTILINE):
            continue
        site = wheel.parent.parent
        for row in (wheel.parent / "RECORD").read_text().splitlines():
            if row:
                files.add((site / row.split(",", 1)[0]).resolve())
    return files


def test_no_path_of_the_build_machine_is_inside(unpacked: Path) -> None:
    """Every file's bytes (text and binary), and every ELF object's RUNPATH/RPATH."""
    readelf = _tool("readelf")
    needles = _build_machine_paths()
    built_elsewhere = _from_manylinux_wheels(unpacked)
    leaks: list[str] = []
    elf_files = 0
    for path in sorted(p for p in unpacked.rglob("*") if p.is_file() and not p.is_symlink()):
        where = path.relative_to(unpacked)
        data = path.read_bytes()
        leaks += [f"{where}: {n.decode()}" for n in needles if n in data]
        if path.resolve() in built_elsewhere:
            data = UPSTREAM_CRATE_PATH.sub(b"", data)
        if ROOT_HOME.search(data):
            leaks.append(f"{where}: /root")
        if data.startswith(ELF_MAGIC):
            elf_files += 1
            dynamic = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True, check=True).stdout
            for kind, value in re.findall(r"\((RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.*)\]", dynamic):
                leaks += [f"{where}: {kind} {d}" for d in value.split(":") if not d.startswith("$ORIGIN")]
    assert elf_files > 0, "no compiled extension in the package: the scan looked at nothing that matters"
    assert not leaks, "\n".join(leaks)
