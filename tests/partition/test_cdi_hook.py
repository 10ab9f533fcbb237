"""xpu-cdi-hook update-ldcache, run as the OCI runtime runs it: the installed script, the container state on stdin,
a bundle with config.json, and the host's ldconfig building the container's cache from stand-in driver libraries."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from healthd.partition.cdi_hook import CONF_NAME, HookError, container_root
from healthd.partition.driverlibs import builtin_hook_path
from tests.partition.standins import build_busybox_rootfs, build_driver_tree

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the hook chroots into the container root: needs root")


def bundle(tmp_path: Path, root: str) -> Path:
    b = tmp_path / "bundle"
    b.mkdir()
    (b / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": root}}))
    return b


def run_hook(state: object, *folders: str) -> subprocess.CompletedProcess[str]:
    hook = builtin_hook_path()
    assert hook is not None
    args = [hook, "update-ldcache"]
    for f in folders:
        args += ["--folder", f]
    stdin = state if isinstance(state, str) else json.dumps(state)
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=60, check=False)


def state_of(b: Path) -> dict[str, object]:
    return {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": os.getpid(), "bundle": str(b)}


def test_root_comes_from_the_bundle(tmp_path: Path) -> None:
    b = bundle(tmp_path, "rootfs")  # relative: under the bundle
    (b / "rootfs").mkdir()
    assert container_root(state_of(b)) == b / "rootfs"
    with pytest.raises(HookError, match="no bundle"):
        container_root({"id": "x"})
    with pytest.raises(HookError, match="cannot read"):
        container_root({"bundle": str(tmp_path / "nope")})


def test_bad_input_fails_with_one_line() -> None:
    result = run_hook("not json", "/usr/lib")
    assert result.returncode == 1
    assert result.stderr.startswith("xpu-cdi-hook: the OCI state on stdin is not JSON")
    assert result.stderr.count("\n") == 1
    result = run_hook({"bundle": "/nonexistent/bundle"}, "/usr/lib")
    assert result.returncode == 1
    assert "cannot read /nonexistent/bundle/config.json" in result.stderr


@needs_root
def test_cache_and_loader_config_are_built_inside_the_root(tmp_path: Path) -> None:
    tree = build_driver_tree(tmp_path / "host")
    rootfs = build_busybox_rootfs(tmp_path / "rootfs")
    (rootfs / "etc" / "ld.so.conf.d").mkdir()
    # the runtime has bind-mounted the libraries at their soname paths inside the root by now
    inside = rootfs / str(tree.lib_dir).lstrip("/")
    inside.mkdir(parents=True)
    for lib in tree.lib_dir.glob("*.so.5*"):
        (inside / lib.name).write_bytes(lib.read_bytes())
    result = run_hook(state_of(bundle(tmp_path, str(rootfs))), str(tree.lib_dir))
    assert result.returncode == 0, result.stderr
    assert (rootfs / "etc" / "ld.so.conf.d" / CONF_NAME).read_text() == f"{tree.lib_dir}\n"
    cache = (rootfs / "etc" / "ld.so.cache").read_bytes()
    for soname in (b"libcuda.so.1", b"libnvidia-ml.so.1", b"libnvidia-nvvm.so.4"):
        assert soname in cache
    assert (inside / "libcuda.so.1").is_symlink()  # ldconfig made the soname link inside the root
    assert not (tree.lib_dir / CONF_NAME).exists()


@needs_root
def test_a_planted_symlink_cannot_send_writes_to_the_host(tmp_path: Path) -> None:
    outside = tmp_path / "host-etc"
    (outside / "ld.so.conf.d").mkdir(parents=True)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "etc").symlink_to(outside)  # absolute: would be the host's directory without the chroot
    result = run_hook(state_of(bundle(tmp_path, str(rootfs))), "/usr/lib")
    assert result.returncode == 0, result.stderr
    assert list((outside / "ld.so.conf.d").iterdir()) == []
    assert not (outside / "ld.so.cache").exists()


@needs_root
def test_an_image_without_etc_is_left_alone(tmp_path: Path) -> None:
    rootfs = tmp_path / "distroless"
    (rootfs / "app").mkdir(parents=True)
    result = run_hook(state_of(bundle(tmp_path, str(rootfs))), "/usr/lib")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in rootfs.iterdir()) == ["app"]
