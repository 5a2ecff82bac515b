#!/usr/bin/env bash
# Session 10, GPU start 3, call 3 (same machine after bench/device_s10_e.sh): the backward's
# gqa_reduce 'loop' (bench/device_s10_gqaloop.sh: tests, then atomic vs loop vs the reference at
# four GQA shapes); the backward features' bench again (bench/check_bwd_feat.py; the kernel
# changed this session); the dense backward's GPU tests after the merges; the forward features'
# bench again (bench/bench_feat.py, its second run). Files under $OUT: s10_gqaloop.tar, feat.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-bench/logs/s10_f}"
mkdir -p "$out"
bash bench/device_s10_gqaloop.sh
{
  t=$SECONDS; timeout 70 python3 bench/check_bwd_feat.py 2>&1 | grep -v Warning; echo "check_bwd_feat rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s"
  t=$SECONDS; timeout 90 python3 -m pytest -q -x -n 12 -p no:cacheprovider tests/fa4/test_bwd_gpu.py 2>&1 | tail -4
  echo "test_bwd_gpu rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s"
  t=$SECONDS; timeout 100 python3 bench/bench_feat.py 2>&1 | grep -v Warning; echo "bench_feat rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s"
} > "$out/feat.log" 2>&1
