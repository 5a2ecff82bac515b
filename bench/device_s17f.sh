#!/usr/bin/env bash
# Session 17, third device round: the GQA dK/dV postprocess issuing the loads of 8 passes before
# their stores (fa4.sm90.bwd_prepost.BwdPostprocess.rows; compile-checked, SASS LLLLLLLLSSSSSSSS).
# Correctness first (every GQA 'atomic' backward runs it: the dense, later-head-dim and varlen GQA
# cases), then its time in the kernel split, twice. Prediction: Llama-3-8B's dK/dV postprocess
# 47.2 us (session 16) -> ~30 us, +0.7% on the whole backward; Qwen2.5-7B likewise.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s17f
device_env "$work/env.log"
TAILN=6 step post_tests 200 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
  tests/fa4/test_varlen_bwd_gpu.py tests/fa4/test_bwd_gqa_loop_gpu.py -k "grads_match or gqa or matches_atomic"
for run in 1 2; do
  TAILN=14 step "split$run" 100 python3 bench/kernel_split.py --shapes llama3-8b-8k,qwen2.5-7b-4k,llama3.2-1b-8k \
    --out "$work/split$run.json"
done
TAILN=8 step bwd_gqa 120 python3 bench/bwd_order.py --orders default --rounds 3 \
  --shapes llama3-8b-8k,qwen2.5-7b-4k,llama3.2-1b-8k --out "$work/bwd_gqa.json"
