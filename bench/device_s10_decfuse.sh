#!/usr/bin/env bash
# Session 10, helper "decfuse" (issue 19, B1/32k >= 2.5 TB/s): the decode GPU tests (each combine:
# kernel, pdl, fused; repeated calls and CUDA-graph replays of the self-resetting tickets), then
# bench/bench_decode.py at batch 1 and 4 x KV 8k/32k/128k: the default (fused for one token), each
# combine at the auto split count and over a split sweep, the reference FA4 in the same process,
# TB/s and ratios, and whether B1/B4 x 32k/128k reach 2.5 TB/s (the COMBINE and SUMMARY lines).
# Then bench/decode_profile.py per combine at 1x32k and 4x32k (decode vs combine kernel vs gap).
# Writes two files under $OUT: decfuse_tests.log and decfuse_bench.log. Wall: ~2.5 + ~1.5 + ~0.5 minutes
# (limits 170 + 130 + 45 s).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s10_decfuse}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
git log --oneline -1 > "$out/decfuse_tests.log" 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader >> "$out/decfuse_tests.log" 2>&1
t=$SECONDS
timeout 170 python3 -m pytest -q -x -n 8 -p no:cacheprovider tests/fa4/test_decode_gpu.py 2>&1 | tail -60 | tee -a "$out/decfuse_tests.log"
echo "tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$out/decfuse_tests.log"
t=$SECONDS
timeout 130 python3 bench/bench_decode.py --batches 1,4 --kv 8192,32768,131072 --sweep 8,12,16,24,32 \
  --combines kernel,pdl,fused --combine-sweep 8,12,16,24 2>&1 | tee "$out/decfuse_bench.log"
echo "bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$out/decfuse_bench.log"
# Where the time goes per combine (torch.profiler: decode vs combine kernel vs the GPU gap).
t=$SECONDS
timeout 45 python3 bench/decode_profile.py --shapes 1x32768,4x32768 --configs "auto;kernel;pdl;fused" \
  --sweep64 "" 2>&1 | tee -a "$out/decfuse_bench.log"
echo "profile rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$out/decfuse_bench.log"
