#!/usr/bin/env bash
# Session 10, GPU start 3, call 3 (same machine after bench/device_s10_e.sh): the backward's
# gqa_reduce 'loop' (bench/device_s10_gqaloop.sh: tests, then atomic vs loop vs the reference at
# four GQA shapes); the second run of issue 18's feature benches (bench/bench_feat.py forward,
# bench/check_bwd_feat.py backward, same process as the reference). Files under $OUT:
# s10_gqaloop.tar, feat.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-bench/logs/s10_f}"
mkdir -p "$out"
bash bench/device_s10_gqaloop.sh
{
  t=$SECONDS; timeout 100 python3 bench/bench_feat.py 2>&1 | grep -v Warning; echo "bench_feat rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s"
  t=$SECONDS; timeout 70 python3 bench/check_bwd_feat.py 2>&1 | grep -v Warning; echo "check_bwd_feat rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s"
} > "$out/feat.log" 2>&1
