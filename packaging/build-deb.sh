#!/usr/bin/env bash
# Build a self-contained xpu-runtime-kit .deb: its own virtualenv under /opt/xpu-runtime-kit (the project wheel and
# every dependency, built with Debian's python3), the systemd units, the default config (a conffile), the "xpu" group
# (sysusers.d) and maintainer scripts that work on a live system and in a throwaway root (DPKG_ROOT).
#
#   packaging/build-deb.sh [OUTDIR]        -> OUTDIR/xpu-runtime-kit_<version>_<arch>.deb (default: dist/)
#
# Needs: python3 with venv (Debian's: the .deb depends on the same Python minor version), dpkg-deb, dpkg-shlibdeps
# (dpkg-dev), gcc, binutils (strip), pkg-config and libsystemd-dev (systemd-python is compiled), and network access
# for pip (or PIP_FIND_LINKS / PIP_INDEX_URL pointing at a mirror). Runs as any user: file ownership in the package
# is set to root:root.
#
# Every wheel is built or fetched for the target interpreter in this run: pip's cache is off (a wheel another Python
# compiled earlier, e.g. one with RUNPATH into a pyenv prefix, must not be reused), systemd-python (sdist only) is
# always compiled here (never taken from PIP_FIND_LINKS), and an ELF file whose RUNPATH/RPATH points anywhere but
# inside the package ($ORIGIN) fails the build.
# The package is checked by tests/packaging/test_deb_lintian.py (lintian, and no path of the build machine inside).
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
OUT=$(mkdir -p "${1:-$ROOT/dist}" && cd "${1:-$ROOT/dist}" && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
PREFIX=/opt/xpu-runtime-kit
PKG=xpu-runtime-kit
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

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

# 1. the virtualenv, built in the staging root and made path-independent below; the dra extra (the Kubernetes
# client) because the package ships xpu-dra-driver too
log "virtualenv with $("$PYTHON" --version) in $VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade "pip>=23"
log "wheels for $("$VENV/bin/python" -c 'import sys; print(sys.implementation.cache_tag)') (the project and every dependency)"
# --no-binary: systemd-python has no portable wheel, so any binary one is someone else's local build
"$VENV/bin/python" -m pip wheel -q --no-binary systemd-python -w "$WORK/wheels" "$ROOT[dra]"
log "installing the wheels"
"$VENV/bin/python" -m pip install -q --no-compile --no-index --find-links "$WORK/wheels" "xpu-runtime-kit[dra]"
"$VENV/bin/python" -m pip uninstall -q -y pip setuptools wheel >/dev/null 2>&1 || true
rm -f "$VENV"/bin/activate* "$VENV"/bin/pip* "$VENV"/bin/Activate.ps1
# compiled extensions: no symbols (lintian unstripped-binary-or-object), and no search path outside themselves
find "$VENV" -name '*.so' -type f -exec strip --strip-unneeded --remove-section=.comment {} +
while IFS= read -r -d '' lib; do
  if paths=$(readelf -d "$lib" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p') && [ -n "$paths" ]; then
    for dir in ${paths//:/ }; do
      case $dir in '$ORIGIN'*) ;; *) log "$lib: RUNPATH/RPATH $dir is outside the package"; exit 1 ;; esac
    done
  fi
done < <(find "$VENV" -name '*.so' -type f -print0)
# the wheels' data files keep the build's mode bits; only ELF objects and the bin/ scripts are executables
find "$VENV/lib" -type f -perm /111 ! -name '*.so' -exec chmod a-x {} +
rmdir "$VENV/include/python$PYMINOR" "$VENV/include" 2>/dev/null || true

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
ln -s "$PREFIX/bin/xpu-dra-driver" "$STAGE/usr/bin/xpu-dra-driver"  # the image's DRA mode (docs/kubernetes.md)

# 4. documentation Debian policy asks for: the copyright file, the changelog (gzip -n: no timestamp, reproducible)
DOC=$STAGE/usr/share/doc/$PKG
install -D -m 0644 "$ROOT/packaging/deb/copyright" "$DOC/copyright"
CHANGELOG_VERSION=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' "$ROOT/packaging/deb/changelog")
if [ "$CHANGELOG_VERSION" != "$VERSION" ]; then
  log "packaging/deb/changelog starts with version $CHANGELOG_VERSION, pyproject.toml says $VERSION: add an entry"
  exit 1
fi
gzip -9n <"$ROOT/packaging/deb/changelog" >"$DOC/changelog.gz"
chmod 0644 "$DOC/changelog.gz"
install -D -m 0644 "$ROOT/packaging/deb/lintian-overrides" "$STAGE/usr/share/lintian/overrides/$PKG"

# 5. control files. Depends: what the venv's compiled extensions link against (dpkg-shlibdeps reads their ELF
# NEEDED entries and maps each library to the Debian package that ships it, libc6 included), plus Python itself.
MAINTAINER=$("$PYTHON" -c 'import tomllib,sys; m=tomllib.load(open(sys.argv[1],"rb"))["project"]["maintainers"][0]
print(m["name"] + " <" + m["email"] + ">")' "$ROOT/pyproject.toml")
mkdir -p "$WORK/shlibs/debian" "$STAGE/DEBIAN"
printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$PKG" "$PKG" >"$WORK/shlibs/debian/control"
mapfile -d '' ELF_FILES < <(find "$STAGE" -name '*.so' -type f -print0)
SHLIBS=$(cd "$WORK/shlibs" && dpkg-shlibdeps -O --ignore-missing-info -e"${ELF_FILES[@]}" 2>"$WORK/shlibdeps.log" |
  sed -n 's/^shlibs:Depends=//p') || { cat "$WORK/shlibdeps.log" >&2; exit 1; }
case $SHLIBS in *libc6*) ;; *) log "dpkg-shlibdeps found no libc6 dependency: $SHLIBS"; exit 1 ;; esac
SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
cat >"$STAGE/DEBIAN/control" <<CONTROL
Package: $PKG
Version: $VERSION
Architecture: $ARCH
Maintainer: $MAINTAINER
Installed-Size: $SIZE
Depends: $SHLIBS, python3 (>= $PYMINOR), python3 (<< $PYNEXT), adduser | systemd
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
# md5sums of every shipped file but the conffiles (dpkg keeps their sums itself), as dh_md5sums writes it
(cd "$STAGE" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
  grep -zv -x -F -f <(sed 's|^/||' "$STAGE/DEBIAN/conffiles") | xargs -0 md5sum) >"$STAGE/DEBIAN/md5sums"
chmod 0644 "$STAGE/DEBIAN/md5sums"

DEB=$OUT/${PKG}_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz -z6 --build "$STAGE" "$DEB" >/dev/null
log "built $DEB ($(du -h "$DEB" | cut -f1))"
echo "$DEB"
