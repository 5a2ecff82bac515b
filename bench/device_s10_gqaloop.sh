#!/usr/bin/env bash
# Session 10, helper gqaloop (issue 20, backward under GQA): gqa_reduce 'loop', one CTA per
# (key tile, K/V head, batch) walking the group's query heads, dK/dV stored once. On the H200,
# under 4 minutes:
#  1. tests/fa4/test_bwd_gqa_loop_gpu.py: 'loop' against fp32 autograd (FlashAttention's error
#     rule) at GQA 2/4/7/8, causal and not, Sq != Sk, odd seqlens, fp16, window + softcap + sink +
#     dLSE, other knobs, hd96-256, deterministic bitwise over 10 runs; spread over 8 pytest
#     workers when xdist is there (the time is the kernels' compiles).
#  2. bench/bench_gqa_loop.py: backward TFLOP/s of 'atomic' vs 'loop' (TMA and direct dK/dV
#     stores) vs the reference FA4 (autograd through flash_attn.cute.flash_attn_func), do_bench
#     median, non-deterministic and deterministic, at Llama-3-8B 8k, Qwen2.5-7B 4k B2,
#     Sq 2k/Sk 8k H64/KV8, Sq 128/Sk 8k B8 (all causal, hd128).
# Everything lands in $OUT/s10_gqaloop.tar (env.log, tests.log, bench.log, bench.json).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s10_gqaloop}"
mkdir -p "$out"
work=$(mktemp -d)
finish() { tar -C "$work" -cf "$out/s10_gqaloop.tar" . ; echo "wrote $out/s10_gqaloop.tar"; }
trap finish EXIT

python3 -c "import torch, cutlass; print('device:', torch.cuda.get_device_name(), 'torch', torch.__version__); \
import fa4, flash_attn.cute as r; print('fa4 from', fa4.__file__, '| reference from', r.__file__)" 2>&1 | tee "$work/env.log"
git log --oneline -3 2>/dev/null | tee -a "$work/env.log"

workers=""
python3 -c "import xdist" 2>/dev/null && workers="-n 8"
echo "\$ python3 -m pytest -q -x $workers tests/fa4/test_bwd_gqa_loop_gpu.py"
t=$SECONDS
timeout 130 python3 -m pytest -q -x $workers -p no:cacheprovider tests/fa4/test_bwd_gqa_loop_gpu.py 2>&1 | tee "$work/tests.log"
echo "[tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]" | tee -a "$work/tests.log"

echo "\$ python3 bench/bench_gqa_loop.py --out bench.json"
t=$SECONDS
timeout 110 python3 bench/bench_gqa_loop.py --out "$work/bench.json" 2>&1 | tee "$work/bench.log"
echo "[bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]" | tee -a "$work/bench.log"
