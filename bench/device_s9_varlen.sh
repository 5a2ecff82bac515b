#!/usr/bin/env bash
# Session 9, helper "varlen" (issue 18, packed varlen forward): the GPU tests of the varlen forward,
# then ours vs the reference FA4's flash_attn_varlen_func at the issue's varlen shape
# (bench/bench_varlen.py). ONE tar under $OUT: s9_varlen.tar with tests.log, bench.log, bench.json.
# Wall time budget: under 3 minutes (tests ~2 incl. compiles, bench ~40 s).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s9_varlen}"
mkdir -p "$out/s9_varlen"
r="$out/s9_varlen"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FA4_LOOKUP_LOCAL_DB=0
unset FA4_TUNING_URL
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$r/tests.log" 2>&1
t=$SECONDS
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/fa4/test_varlen_gpu.py tests/fa4/test_varlen_host.py \
  2>&1 | tee -a "$r/tests.log"
echo "tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$r/tests.log"
t=$SECONDS
timeout 50 python3 bench/bench_varlen.py --out "$r/bench.json" 2>&1 | tee "$r/bench.log"
echo "bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$r/bench.log"
tar -C "$out" -cf "$out/s9_varlen.tar" s9_varlen && rm -rf "$r"
