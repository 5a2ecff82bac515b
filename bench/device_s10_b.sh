#!/usr/bin/env bash
# Session 10, GPU start 1, call 3: where a small-batch decode call's time goes (bench/decode_profile.py),
# then the decode tuner's first GPU run (bench/device_s9_dectune.sh). Files under $OUT: profile.log, dectune.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-bench/logs/s10_b}"
mkdir -p "$out"
timeout 150 python3 bench/decode_profile.py 2>&1 | tee "$out/profile.log"
bash bench/device_s9_dectune.sh
