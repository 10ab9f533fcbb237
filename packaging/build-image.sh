#!/usr/bin/env bash
# Build the container image xpu-runtime-kit:<version> (the version in pyproject.toml, which is also the chart's
# appVersion and so the tag its default values name): a minimal Debian root with the project's .deb installed, in
# podman's image storage. Nothing is pulled from a container registry: the root is the debootstrapped tree of
# packaging/debian_tree.py (cached; the .deb's systemd-nspawn test boots the same one), the .deb is installed into a
# copy of it with systemd-nspawn (no systemd running: the package's postinst only enables the unit), and the result
# is imported with `podman import`.
#
#   packaging/build-image.sh            -> podman image xpu-runtime-kit:<version> (prints its name)
#
# XPU_DEB=FILE uses a built .deb (else packaging/build-deb.sh builds one); PODMAN="podman --root DIR ..." selects
# podman's storage (the tests use a private one). Needs root (systemd-nspawn, rootful podman), debootstrap,
# systemd-container and podman. docs/kubernetes.md says what the image holds and how to push it.
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
VERSION=$("$PYTHON" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' \
  "$ROOT/pyproject.toml")
IMAGE=xpu-runtime-kit:$VERSION
read -ra PODMAN <<<"${PODMAN:-podman}"
log() { echo "build-image: $*" >&2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/xpu-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
started=$SECONDS

DEB=${XPU_DEB:-}
if [ -z "$DEB" ]; then
  log "building the .deb"
  DEB=$("$ROOT/packaging/build-deb.sh" "$WORK/deb" | tail -1)
fi
DEB=$(readlink -f "$DEB")

TREE=$("$PYTHON" "$ROOT/packaging/debian_tree.py")
log "root file system: a copy of $TREE"
cp -a --reflink=auto "$TREE" "$WORK/root"

log "installing $(basename "$DEB")"
NSPAWN=(systemd-nspawn --quiet --directory="$WORK/root" --pipe --bind-ro="$DEB:/xpu-image/xpu.deb")
NSPAWN+=(--setenv=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
[ -d /run/systemd/system ] || NSPAWN+=(--keep-unit --register=no)  # no machined to register with
"${NSPAWN[@]}" /bin/sh -ec '
  dpkg -i /xpu-image/xpu.deb >/dev/null
  xpu-healthd --version >/dev/null && xpu-device-plugin --help >/dev/null && xpu-dra-driver --help >/dev/null
  # what a container never uses: documentation (licences stay), manuals, caches, logs, the machine id
  find /usr/share/doc -type f ! -name copyright ! -path "*/xpu-runtime-kit/*" -delete
  find /usr/share/doc -type d -empty -delete
  rm -rf /usr/share/man/* /usr/share/info/* /var/cache/apt/* /var/lib/apt/lists/* /var/cache/debconf/*-old
  find /var/log -type f -delete
  : >/etc/machine-id
'

log "importing $IMAGE"
tar --numeric-owner --xattrs --acls -C "$WORK/root" \
  --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* --exclude=./run/* --exclude=./tmp/* --exclude=./xpu-image \
  -cf - . |
  "${PODMAN[@]}" import --quiet \
    --change 'CMD ["xpu-healthd", "--config", "/etc/xpu-runtime-kit/healthd.toml"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'EXPOSE 9410/tcp' \
    --change "LABEL org.opencontainers.image.title=xpu-runtime-kit" \
    --change "LABEL org.opencontainers.image.version=$VERSION" \
    --change "LABEL org.opencontainers.image.licenses=Apache-2.0" \
    --change "LABEL org.opencontainers.image.description=xpu-healthd and xpu-device-plugin on Debian 12" \
    --message "xpu-runtime-kit $VERSION: Debian $(cat "$WORK/root/etc/debian_version") with $(basename "$DEB")" \
    - "$IMAGE" >/dev/null
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
log "built $IMAGE ($((size / 1048576)) MiB) in $((SECONDS - started)) s"
echo "$IMAGE"
