#!/usr/bin/env bash
# Session 9, helper "feat" (issue 18, forward): the GPU tests of the window / softcap / sink forward,
# then ours against the reference FA4 at the issue's shapes with the tanh FMA-split sweep
# (bench/bench_feat.py). Everything lands in ONE tar under $OUT: s9_feat.tar with tests.log,
# bench.log and bench.json. Wall time budget: ~5 minutes (tests ~3, bench ~2).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s9_feat}"
mkdir -p "$out/s9_feat"
r="$out/s9_feat"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FA4_LOOKUP_LOCAL_DB=0
unset FA4_TUNING_URL
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$r/tests.log" 2>&1
t=$SECONDS
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/fa4/test_fwd_features_gpu.py tests/fa4/test_softcap.py \
  2>&1 | tee -a "$r/tests.log"
echo "tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$r/tests.log"
t=$SECONDS
timeout 140 python3 bench/bench_feat.py --out "$r/bench.json" 2>&1 | tee "$r/bench.log"
echo "bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$r/bench.log"
tar -C "$out" -cf "$out/s9_feat.tar" s9_feat && rm -rf "$r"
