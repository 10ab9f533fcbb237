#!/usr/bin/env bash
# The device check: every piece of real-GPU evidence in one run of at most 6 minutes (--quick: 3), on an NVIDIA
# machine. Reads only: it never changes MIG mode, clocks, power limit, compute mode or persistence mode and never
# resets a card (it records those settings before and after).
#
# Here, once:   bench/device_wheels.sh          (the packages the device machine lacks, into .whl/)
# Device tool:  run(command="bash bench/device_check.sh", carry=[".whl"], timeout_s=420)
#               (--quick: timeout_s=240; both leave a minute beyond the check's own budget)
# Elsewhere:    OUT=/tmp/xpu-check bash bench/device_check.sh   (any NVIDIA machine with Python 3.11+ and torch)
# No GPU:       bash bench/device_check.sh --rehearse          (the same steps on the simulated node)
#
# Steps, in order of value, each killed at its own limit (bench/check_plan.py): setup (carried wheels, machine,
# the unit's DeviceAllow=), the backend contract suite on real NVML, the daemon on real NVML for 60 s (metrics,
# health, faults, a partition made and removed through the API), GPM, XID registration, MPS start timing, the TDM
# experiment (isolated and shared, a uid-1000 client), NVML overhead, matmul loss, peers. $OUT gets four files,
# rewritten after every step: summary.txt, summary.json, results.tar.gz (every step's logs and JSON), console.log.
# The last lines printed are the summary. Exit 0: every step ok and the card's settings unchanged.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
export PYTHONUNBUFFERED=1
exec python3 bench/device_check.py --out "${OUT:-$PWD/.device/out}" "$@"
