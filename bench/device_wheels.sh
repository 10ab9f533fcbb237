#!/usr/bin/env bash
# Download, here, the wheels bench/device_check.sh carries to the GPU machine, into .whl/ (gitignored), or into
# $XPU_WHEELS_DIR. Nothing can be fetched there, so each wheel is named with its version and taken with --no-deps,
# for the machine's CPython 3.12 on manylinux x86_64 (pure-Python wheels wherever the project allows).
#
# The machine's image already has grpcio, protobuf, prometheus-client, nvidia-ml-py, PyYAML, psutil, pytest,
# pytest-timeout, hypothesis and torch (the device tool's package list). The check's first step
# (bench/check_setup.py) installs a carried wheel only where the machine lacks that distribution or has an older
# version than the wheel, so:
#   - MISSING are installed there every time: what xpu-healthd and the check import that the image lacks;
#   - FLOORS are installed only when the image's own is older than the version this project needs: the package
#     list names no versions, and healthd/api/v1/*_pb2.py (protobuf 7.35.1) and the grpcio add-ons (grpcio
#     1.85.1) refuse an older runtime.
# Not carried, on purpose: bcrypt (imported only when /metrics basic auth is configured), systemd-python (only
# under systemd; the check runs the daemon without it), PyYAML (on the image; read only with a web config file).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
DEST=${XPU_WHEELS_DIR:-.whl}
mkdir -p "$DEST"
if [ "$DEST" = .whl ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || grep -qx '/.whl/' .gitignore || echo '/.whl/' >> .git/info/exclude
fi

MISSING=(
  structlog==26.1.0                 # the daemon's logging
  grpcio-health-checking==1.85.1    # grpc.health.v1, served by the daemon
  grpcio-reflection==1.85.1         # server reflection, served by the daemon
  grpcio-status==1.85.1             # rich error details
  googleapis-common-protos==1.76.0  # google.rpc, needed by grpcio-status
  nvitop==1.7.2                     # the peers step: nvitop-exporter beside xpu-healthd
  nvitop-exporter==1.7.2
)
FLOORS=(
  grpcio==1.85.1
  protobuf==7.35.1
  nvidia-ml-py==12.570.86
  prometheus-client==0.20.0
)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$DEST" "${MISSING[@]}" "${FLOORS[@]}"

# One version of each distribution: two of the same name stop the whole install on the device.
dupes=$(ls "$DEST"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dupes" ]; then
  echo "device_wheels: more than one wheel of: $dupes (remove the old ones from $DEST)" >&2
  exit 1
fi
du -sh "$DEST"
ls -1 "$DEST"
