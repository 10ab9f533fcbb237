"""xpu-cdi-hook, run as the OCI runtime runs it: the installed script, the container state on stdin, a bundle with
config.json; update-ldcache with the host's ldconfig building the container's cache from stand-in driver libraries,
create-symlinks, and enable-cuda-compat against stand-in cuda-compat libraries (tests/healthd/partition/standins.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from healthd.partition.cdi_hook import CONF_NAME, HookError, container_root
from healthd.partition.driverlibs import builtin_hook_path
from tests.healthd.partition.standins import LIBRARIES, build_busybox_rootfs, build_compat_library, build_driver_tree

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


# ----- create-symlinks and enable-cuda-compat (and how update-ldcache ranks the compat folder) ----------------

HOST = "580.95.05"  # the host driver of these tests (standins.VERSION)
LIBRARY_SONAME = {real: soname for soname, real in LIBRARIES.items()}
NEWER = {"format": 1, "CUDA version": "13.1", "driver": [535, 550, 570, 575, 580, 590], "device": [1, 2, 7, 8, 9]}


def run_verb(state: object, *args: str) -> subprocess.CompletedProcess[str]:
    hook = builtin_hook_path()
    assert hook is not None
    return subprocess.run(
        [hook, *args], input=json.dumps(state), capture_output=True, text=True, timeout=60, check=False
    )


def image_with_compat(tmp_path: Path, version: str, note: dict[str, object] | None) -> Path:
    """A busybox image with cuda-compat's layout: /usr/local/cuda -> cuda-13.1, its compat/libcuda.so.<version>."""
    rootfs = build_busybox_rootfs(tmp_path / "rootfs")
    compat = rootfs / "usr/local/cuda-13.1/compat"
    compat.mkdir(parents=True)
    build_compat_library(compat / f"libcuda.so.{version}", note)
    (rootfs / "usr/local/cuda").symlink_to("cuda-13.1")
    return rootfs


@needs_root
def test_create_symlinks_makes_the_libcuda_link_inside_the_root(tmp_path: Path) -> None:
    rootfs = build_busybox_rootfs(tmp_path / "rootfs")
    lib = rootfs / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so").write_text("a file the image left there")
    state = state_of(bundle(tmp_path, str(rootfs)))
    links = ["--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"]
    links += ["--link", "libnvidia-ml.so.1::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so"]
    links += ["--link", "libfoo.so.1::/opt/made/here/libfoo.so"]
    for _ in range(2):  # a second run finds them made and changes nothing
        result = run_verb(state, "create-symlinks", *links)
        assert result.returncode == 0, result.stderr
    assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(lib / "libnvidia-ml.so") == "libnvidia-ml.so.1", "what was there is replaced"
    assert os.readlink(rootfs / "opt/made/here/libfoo.so") == "libfoo.so.1"
    assert (rootfs / "opt/made/here").stat().st_mode & 0o777 == 0o755
    assert not [p for p in lib.iterdir() if "xpu-cdi-hook" in p.name], "no temporary link left"


@needs_root
def test_create_symlinks_cannot_be_sent_to_the_host(tmp_path: Path) -> None:
    outside = tmp_path / "host-lib"
    outside.mkdir()
    rootfs = build_busybox_rootfs(tmp_path / "rootfs")
    (rootfs / "usr/lib").symlink_to(outside)  # absolute: the host's directory without the chroot
    result = run_verb(
        state_of(bundle(tmp_path, str(rootfs))), "create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"
    )
    assert result.returncode == 0, result.stderr
    assert list(outside.iterdir()) == []
    assert os.readlink(rootfs / str(outside).lstrip("/") / "libcuda.so") == "libcuda.so.1"


def test_create_symlinks_refuses_a_malformed_link(tmp_path: Path) -> None:
    result = run_verb({"bundle": str(tmp_path)}, "create-symlinks", "--link", "no-separator")
    assert result.returncode == 1 and "TARGET::LINK" in result.stderr


@pytest.mark.parametrize(
    ("version", "note", "used"),
    [
        ("590.44.01", NEWER, True),  # newer, and made for the host's branch (580 listed)
        ("575.57.08", {**NEWER, "driver": [535, 550, 570, 575]}, False),  # older than the host's driver
        ("590.44.01", {**NEWER, "driver": [535, 550, 570, 575, 590]}, False),  # 580 not among its branches
        ("590.44.01", None, True),  # no note: a higher major is enough
        ("580.126.09", None, False),  # no note, same major: not used
    ],
)
@needs_root
def test_enable_cuda_compat_follows_the_toolkits_rule(
    tmp_path: Path, version: str, note: dict[str, object] | None, used: bool
) -> None:
    rootfs = image_with_compat(tmp_path, version, note)
    result = run_verb(state_of(bundle(tmp_path, str(rootfs))), "enable-cuda-compat", "--host-driver-version", HOST)
    assert result.returncode == 0, result.stderr
    conf = rootfs / "etc/ld.so.conf.d/00-compat-xpu-runtime-kit.conf"
    if used:
        assert conf.read_text() == "/usr/local/cuda-13.1/compat\n", "the folder as resolved inside the image"
        assert conf.stat().st_mode & 0o777 == 0o644
    else:
        assert not conf.exists()


@needs_root
def test_enable_cuda_compat_leaves_images_without_one_compat_library_alone(tmp_path: Path) -> None:
    rootfs = image_with_compat(tmp_path, "590.44.01", NEWER)
    build_compat_library(rootfs / "usr/local/cuda/compat/libcuda.so.595.10.01", NEWER)  # two: which one?
    plain = build_busybox_rootfs(tmp_path / "plain")
    for root in (rootfs, plain):
        result = run_verb(state_of(bundle(tmp_path / root.name, str(root))), "enable-cuda-compat",
                          "--host-driver-version", HOST)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert not (root / "etc/ld.so.conf.d/00-compat-xpu-runtime-kit.conf").exists()
    bad = run_verb({"bundle": str(tmp_path)}, "enable-cuda-compat", "--host-driver-version", "latest")
    assert bad.returncode == 1 and "--host-driver-version" in bad.stderr


@needs_root
def test_the_compat_libcuda_is_the_one_the_container_loads(tmp_path: Path) -> None:
    """The three hooks in the spec's order on an image with newer compat libraries: the cache lists the compat
    libcuda.so.1 before the mounted driver's, so the loader takes it; and libcuda.so points at libcuda.so.1."""
    tree = build_driver_tree(tmp_path / "host")
    rootfs = image_with_compat(tmp_path, "590.44.01", NEWER)
    inside = rootfs / str(tree.lib_dir).lstrip("/")
    inside.mkdir(parents=True)
    for lib in tree.lib_dir.glob("*.so.5*"):  # the runtime's bind mounts, at their soname paths
        (inside / LIBRARY_SONAME[lib.name]).write_bytes(lib.read_bytes())
    state = state_of(bundle(tmp_path, str(rootfs)))
    for args in (
        ["create-symlinks", "--link", f"libcuda.so.1::{tree.lib_dir}/libcuda.so"],
        ["enable-cuda-compat", "--host-driver-version", HOST],
        ["update-ldcache", "--folder", str(tree.lib_dir)],
    ):
        result = run_verb(state, *args)
        assert result.returncode == 0, (args, result.stderr)
    listing = subprocess.run(
        ["ldconfig", "-p", "-C", str(rootfs / "etc/ld.so.cache")], capture_output=True, text=True, check=True
    ).stdout
    libcuda = [line.split("=> ")[1] for line in listing.splitlines() if line.strip().startswith("libcuda.so.1 ")]
    assert libcuda[0] == "/usr/local/cuda-13.1/compat/libcuda.so.1", listing
    assert f"{tree.lib_dir}/libcuda.so.1" in libcuda
    assert os.readlink(inside / "libcuda.so") == "libcuda.so.1"


def one_partition_hook(partition: str) -> dict[str, object]:
    hook = builtin_hook_path()
    return {"path": hook, "args": ["xpu-cdi-hook", "one-partition", "--partition", partition]}


@pytest.mark.parametrize("asked", [["p-aaa"], ["p-aaa", "p-aaa"], ["p-aaa", "p-bbb"], ["p-aaa", "p-bbb", "p-ccc"]])
def test_one_partition_refuses_a_second_partition(tmp_path: Path, asked: list[str]) -> None:
    b = tmp_path / "bundle"
    b.mkdir()
    other = {"path": "/bin/true", "args": ["true", "--partition", "p-zzz"]}  # not ours: not counted
    config = {"root": {"path": "rootfs"}, "hooks": {"createContainer": [other, *map(one_partition_hook, asked)]}}
    (b / "config.json").write_text(json.dumps(config))
    done = run_verb(state_of(b), "one-partition", "--partition", asked[0])
    distinct = sorted(set(asked))
    if len(distinct) == 1:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"xpu-cdi-hook: this container asks for {len(distinct)} partitions ({', '.join(distinct)}): give a "
            "container one partition; each sets CUDA_VISIBLE_DEVICES (and a TDM one its MPS variables), so one would "
            "override the other's"
        ]
