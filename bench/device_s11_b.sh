#!/usr/bin/env bash
# Session 11, GPU start 2 (after README command (1)): the new default launch order of the backward
# (fa4.sm90.bwd_config.default_launch_order) on the H200.
#  1. GPU tests of the backward whose default changed (dense, features, varlen), 12 xdist workers.
#  2. bench/bwd_order.py: the default against the old order (spt 1, swizzle 1) at every shape,
#     ours/ref; bench/bench_varlen.py (issue 18's varlen bar through its own script);
#     bench/check_bwd_feat.py (window, softcap, sink backward).
#  3. bench/hf_train.py --family gemma2 (softcap, alternating sliding layers) and gpt_oss (sinks).
# Logs under $OUT (one tar).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s11_b
workers=""
python3 -c "import xdist" 2>/dev/null && workers="-n 12"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  TAILN=6 step tests 170 python3 -m pytest -q $workers -p no:cacheprovider -rf tests/fa4/test_bwd_gpu.py \
    tests/fa4/test_bwd_feat_gpu.py tests/fa4/test_varlen_bwd_gpu.py tests/fa4/test_bwd_gqa_loop_gpu.py
fi
[ "${SKIP_ORDER:-0}" = 1 ] || TAILN=22 step order 280 python3 bench/bwd_order.py --orders default,1:1 --rounds 2 --shapes varlen-causal,varlen,window,sink,softcap,llama3-8b-8k,qwen2.5-7b-4k,causal-8k,llama3.2-1b-8k,gpt2-1k,hd64-8k,hd96-8k,hd192-8k,hd192v128-8k,hd256-8k,sq2k-sk8k,sq128-sk8k --out "$work/order.json"
if [ "${SKIP_HF:-0}" != 1 ]; then
  TAILN=6 step gemma2 120 python3 bench/hf_train.py --family gemma2 --steps 12
fi
if [ "${SKIP_DET:-0}" != 1 ]; then
  TAILN=10 step det 150 python3 bench/bwd_order.py --det --orders default,1:2,1:4,0:4 --rounds 2 \
    --shapes llama3-8b-8k,qwen2.5-7b-4k,causal-8k,llama3.2-1b-8k,sq2k-sk8k,varlen-causal --out "$work/det.json"
fi
