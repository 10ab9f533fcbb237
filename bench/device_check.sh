#!/usr/bin/env bash
# Real-GPU validation in one run of about 8 minutes (--quick: about 6) on an NVIDIA machine. Reads only: it never
# changes MIG mode, clocks, power limit, compute mode or persistence mode (it records them before and after).
#
# Here, once:   bench/device_wheels.sh              (structlog, grpcio add-ons, nvitop-exporter ... into .whl/)
# Device tool:  run(command="bash bench/device_check.sh", carry=[".whl"], timeout_s=540)
# Elsewhere:    OUT=/tmp/xpu-check bash bench/device_check.sh   (any NVIDIA machine with Python 3.12 and torch)
#
# Steps: the driver's device entries and nodes, and the packaged unit's DeviceAllow= list resolved against them
# (packaging/deviceallow.py: would systemd let the daemon open every GPU node?); MPS control daemon start timing
# (bench/mps_timing.py: private pipe directory, no card setting changed); XID event registration
# (bench/xid_registration.py); the backend contract suite on real NVML (pytest); the GPM check (bench/gpm_check.py:
# profiling support and one sample per card, GPM call latency); then bench/device_check.py: the daemon on the real
# backend for a minute, NVML overhead, bf16 matmul throughput with and without the daemon, and nvitop-exporter and
# nvidia-smi beside it; the TDM sharing experiment (bench/tdm_sharing.py). Results land in $OUT (device_results.json,
# summary.txt, deviceallow.txt, mps_timing.json, xid_registration.json, tdm_sharing.json, logs); the summary prints
# last.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
OUT=${OUT:-$PWD/.device/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/check.log") 2>&1
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device_check: installing the carried wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  echo "device_check: no .whl/ here: using the installed packages (run bench/device_wheels.sh first if imports fail)"
  export PYTHONPATH=$PWD
fi

echo "== machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,mig.mode.current,persistence_mode --format=csv || true
python3 - <<'EOF'
import importlib
for name in ("pynvml", "prometheus_client", "grpc", "google.protobuf", "structlog", "nvitop", "torch"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:<18} {getattr(mod, '__version__', '?'):<14} {getattr(mod, '__file__', '')}")
    except Exception as exc:
        print(f"{name:<18} MISSING ({exc})")
EOF

echo "== /proc/devices (NVIDIA entries) and /dev/nvidia*"
grep -i nvidia /proc/devices || echo "(no NVIDIA entries in /proc/devices)"
ls -l /dev/nvidia* 2>&1 || true
ls -l /proc/driver/nvidia-caps/ 2>&1 || true

echo "== the unit's DeviceAllow= resolved against them (packaging/systemd/xpu-healthd.service)"
python3 packaging/deviceallow.py | tee "$OUT/deviceallow.txt"
deviceallow_rc=${PIPESTATUS[0]}
[ "$deviceallow_rc" -eq 0 ] || echo "device_check: the unit would deny a GPU node (see DENIED above)"

echo "== MPS control daemon start (nvidia-cuda-mps-control -d as xpu-healthd starts it; no card setting changes)"
timeout 120 python3 -m bench.mps_timing --runs 3 --out "$OUT"
mps_rc=$?

echo "== XID event registration (reads only: event sets are made and freed, no card setting changes)"
# Which event types each card supports and accepts one by one, the daemon's XID/ECC mask registered and waited on,
# a second registration in a new set (as after a reset), the recovery-action field decoded by driver branch, and
# whether the parent card's process list answers. JSON in $OUT/xid_registration.json.
timeout 120 python3 bench/xid_registration.py --out "$OUT" 2>&1 | tee "$OUT/xid_registration.log"

echo "== TDM sharing experiment (MPS only, through the daemon's API; records the card's settings before and after)"
# Two partitions (30 %/2 GiB, 70 %/8 GiB) under each sharing policy: TFLOP/s alone and together, share error,
# a client asking for 100 %, an allocation past the cap, a client as uid 1000 (nvidia-smi M+C). About 3 minutes.
timeout 300 python3 bench/tdm_sharing.py --out "$OUT" 2>&1 | tee "$OUT/tdm_sharing.txt"
tdm_rc=${PIPESTATUS[0]}

echo "== contract tests on real NVML"
XPU_TEST_REAL_NVML=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/exporter/backends/test_backend_contract.py \
  2>&1 | tee "$OUT/pytest.log" | tail -25
contract_rc=${PIPESTATUS[0]}

echo "== GPM: support, one interval per card and MIG instance, call latency (bench/gpm_check.py)"
timeout 90 python3 bench/gpm_check.py --interval 1.0 --out "$OUT" 2>&1 | tee "$OUT/gpm.log" | tail -60
gpm_rc=${PIPESTATUS[0]}

echo "== device_check.py"
timeout 480 python3 bench/device_check.py --out "$OUT" --contract-rc "$contract_rc" "$@"
rc=$?
[ "$contract_rc" -eq 0 ] || rc=1
[ "$deviceallow_rc" -eq 0 ] || rc=1
[ "$mps_rc" -eq 0 ] || rc=1
[ "$gpm_rc" -eq 0 ] || rc=1
[ "$tdm_rc" -eq 0 ] || rc=1
echo "device_check: exit $rc (results in $OUT)"
exit $rc
