#!/usr/bin/env bash
# Build a self-contained xpu-runtime-kit .deb: its own virtualenv under /opt/xpu-runtime-kit (the project wheel and
# every dependency, built with Debian's python3), the systemd units, the default config (a conffile), the "xpu" group
# (sysusers.d) and maintainer scripts that work on a live system and in a throwaway root (DPKG_ROOT).
#
#   packaging/build-deb.sh [OUTDIR]        -> OUTDIR/xpu-runtime-kit_<version>_<arch>.deb (default: dist/)
#
# Needs: python3 with venv (Debian's: the .deb depends on the same Python minor version), dpkg-deb, gcc,
# pkg-config and libsystemd-dev (systemd-python is compiled), and network access for pip (or PIP_FIND_LINKS /
# PIP_INDEX_URL pointing at a mirror). Runs as any user: file ownership in the package is set to root:root.
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
OUT=$(mkdir -p "${1:-$ROOT/dist}" && cd "${1:-$ROOT/dist}" && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
PREFIX=/opt/xpu-runtime-kit
PKG=xpu-runtime-kit

VERSION=$("$PYTHON" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' \
  "$ROOT/pyproject.toml")
ARCH=$(dpkg --print-architecture)
PYMINOR=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYNEXT=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1] + 1}")')

WORK=$(mktemp -d "${TMPDIR:-/tmp}/xpu-deb.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/root
VENV=$STAGE$PREFIX
log() { echo "build-deb: $*" >&2; }

# 1. the virtualenv, built in the staging root and made path-independent below
log "virtualenv with $("$PYTHON" --version) in $VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade "pip>=23"
log "building the project wheel"
"$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$WORK/wheels" "$ROOT"
log "installing the wheel and its dependencies"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile "$WORK"/wheels/*.whl
"$VENV/bin/python" -m pip uninstall -q -y pip setuptools wheel >/dev/null 2>&1 || true
rm -f "$VENV"/bin/activate* "$VENV"/bin/pip* "$VENV"/bin/Activate.ps1

# 2. relocate: scripts' shebangs and pyvenv.cfg name the final prefix, not the staging one
for f in "$VENV"/bin/*; do
  [ -f "$f" ] && [ ! -L "$f" ] && head -c 2 "$f" | grep -q '#!' && sed -i "1s|^#!.*/bin/python[0-9.]*\$|#!$PREFIX/bin/python|" "$f"
done
sed -i "s|$VENV|$PREFIX|g" "$VENV/pyvenv.cfg"
find "$VENV" -name '__pycache__' -prune -exec rm -rf {} +
# bytecode compiled for the final path (tracebacks show /opt/...), so the read-only /opt needs no writes at run time
"$VENV/bin/python" -m compileall -q -j 0 -s "$STAGE" -p / "$VENV/lib" >/dev/null
if grep -rIl --exclude-dir=__pycache__ "$STAGE" "$VENV" >"$WORK/leaks"; then
  log "staging path left in: $(head -5 "$WORK/leaks" | tr '\n' ' ')"
  exit 1
fi

# 3. the rest of the tree
for unit in xpu-healthd.service xpu-nvidia-modprobe.service; do
  install -D -m 0644 "$ROOT/packaging/systemd/$unit" "$STAGE/usr/lib/systemd/system/$unit"
done
install -D -m 0755 "$ROOT/packaging/libexec/xpu-nvidia-device-nodes" "$STAGE$PREFIX/libexec/xpu-nvidia-device-nodes"
install -D -m 0644 "$ROOT/packaging/deb/sysusers.conf" "$STAGE/usr/lib/sysusers.d/xpu-runtime-kit.conf"
install -D -m 0644 "$ROOT/packaging/healthd.toml" "$STAGE/etc/xpu-runtime-kit/healthd.toml"
install -D -m 0644 "$ROOT/docs/operations.md" "$STAGE$PREFIX/share/doc/operations.md"
install -D -m 0644 "$ROOT/packaging/deb/copyright" "$STAGE/usr/share/doc/$PKG/copyright"
# Grafana dashboards (and their provisioning file), Prometheus alert rules and the Alertmanager example, for the
# monitoring side to pick up (README "Dashboards and alerts")
SHARE=$STAGE/usr/share/$PKG
for dashboard in "$ROOT"/dashboards/*.json; do
  install -D -m 0644 "$dashboard" "$SHARE/dashboards/$(basename "$dashboard")"
done
install -D -m 0644 "$ROOT/dashboards/provisioning/xpu-runtime-kit.yml" "$SHARE/dashboards/provisioning/xpu-runtime-kit.yml"
install -D -m 0644 "$ROOT/alerts/xpu-healthd.rules.yml" "$SHARE/alerts/xpu-healthd.rules.yml"
install -D -m 0644 "$ROOT/alerts/alertmanager.example.yml" "$SHARE/alerts/alertmanager.example.yml"
mkdir -p "$STAGE/usr/bin"
ln -s "$PREFIX/bin/xpu-healthd" "$STAGE/usr/bin/xpu-healthd"
ln -s "$PREFIX/bin/xpuctl" "$STAGE/usr/bin/xpuctl"
ln -s "$PREFIX/bin/xpu-device-plugin" "$STAGE/usr/bin/xpu-device-plugin"  # the Kubernetes image runs it (docs/kubernetes.md)

# 4. control files
mkdir -p "$STAGE/DEBIAN"
SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
cat >"$STAGE/DEBIAN/control" <<CONTROL
Package: $PKG
Version: $VERSION
Architecture: $ARCH
Maintainer: xpu-runtime-kit maintainers <xpu-runtime-kit@localhost>
Installed-Size: $SIZE
Depends: python3 (>= $PYMINOR), python3 (<< $PYNEXT), libsystemd0, adduser | systemd
Recommends: systemd
Section: admin
Priority: optional
Description: GPU node daemon: metrics, health probes with a fault stream, GPU partitioning
 xpu-healthd exports card, MIG, pod and process metrics to Prometheus, runs
 non-intrusive health probes and publishes faults over gRPC, and serves a GPU
 partitioning API (MPS quotas, dynamic MIG). Self-contained: its Python
 dependencies live in a virtualenv under /opt/xpu-runtime-kit.
CONTROL
echo "/etc/xpu-runtime-kit/healthd.toml" >"$STAGE/DEBIAN/conffiles"
for script in postinst prerm postrm; do
  install -m 0755 "$ROOT/packaging/deb/$script" "$STAGE/DEBIAN/$script"
done

DEB=$OUT/${PKG}_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz -z6 --build "$STAGE" "$DEB" >/dev/null
log "built $DEB ($(du -h "$DEB" | cut -f1))"
echo "$DEB"
