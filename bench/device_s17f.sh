#!/usr/bin/env bash
# Ran once at 683724b (bench/RESULTS.md, session 17): change (2) was taken out again in 2a719bc; on
# later commits this script measures the kernels without it.
# Session 17, third device round, two backward changes (each compile-checked clean):
# (1) the GQA dK/dV postprocess issues the loads of 8 passes before their stores (SASS
#     LLLLLLLLSSSSSSSS). Prediction: Llama-3-8B's dK/dV postprocess 47.2 us (session 16) -> ~30 us,
#     +0.7% on the whole non-deterministic backward.
# (2) deterministic GQA 'atomic': the dK and the dV adds take turns on two counters a key tile, so
#     the next head of a group adds dK while this one adds dV (the chain of a group finishing
#     together: 2G -> G + 1 add times). Prediction: Llama-3-8B deterministic +3-4% (ours det /
#     ref det 0.980 in session 16), Llama-3.2-1B and Qwen2.5-7B alike; MHA unchanged.
# Correctness first: every GQA backward (dense, later head dims, varlen, loop against atomic) and
# the deterministic bitwise tests.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s17f
device_env "$work/env.log"
TAILN=6 step tests 140 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
  tests/fa4/test_varlen_bwd_gpu.py tests/fa4/test_bwd_gqa_loop_gpu.py \
  -k "grads_match or gqa or matches_atomic or deterministic or compact"
G=llama3-8b-8k,qwen2.5-7b-4k,llama3.2-1b-8k
TAILN=14 step split1 60 python3 bench/kernel_split.py --shapes $G --calls 10 --out "$work/split1.json"
for run in 1 2; do
  TAILN=10 step "det_ratio$run" 60 python3 bench/det_ratio.py --rounds 2 --shapes $G --out "$work/det_ratio$run.json"
done
TAILN=8 step det_vs_ref 80 python3 bench/bwd_order.py --orders default --rounds 2 --det --shapes $G \
  --out "$work/det_vs_ref.json"
