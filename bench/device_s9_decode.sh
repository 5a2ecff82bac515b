#!/usr/bin/env bash
# Session 9, helper "decode" (issue 19): the decode kernel's GPU tests, then ours vs the reference FA4
# (flash_attn.cute.flash_attn_varlen_func with page_table/seqused_k) and a device-to-device copy in
# one process: batch 1/4/16/64 x KV 8k/32k/128k, one token, pages of 256, GQA 32/8, hd128, bf16;
# ours at num_splits auto and 1 and a split sweep at batch 1 and 4; host cost per call.
# Writes two files under $OUT: decode_tests.log and decode_bench.log. Wall: ~2 + ~2 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s9_decode}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > "$out/decode_tests.log" 2>&1
t=$SECONDS
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/fa4/test_decode_gpu.py 2>&1 | tail -60 | tee -a "$out/decode_tests.log"
echo "tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$out/decode_tests.log"
t=$SECONDS
timeout 170 python3 bench/bench_decode.py 2>&1 | tee "$out/decode_bench.log"
echo "bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$out/decode_bench.log"
