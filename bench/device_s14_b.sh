#!/usr/bin/env bash
# Session 14. MODE=ab: ds_early (the dS^T store ahead of the dV GEMM, a knob, off) against the
# default at issue 18's and 20's backward shapes, in one process with the reference FA4
# (bench/bwd_order.py --variants: each variant's gradients checked against the reference's before
# it is timed; interleaved rounds). Prediction (session 13's profile: 6% of the hd128 causal
# stall samples at the fence and barrier after the dS^T stores): +1-3% at hd128.
# MODE=tests: the backward GPU tests (as device_s13_b.sh's MODE=tests), the warp-uniform
# descriptors' and ds_early's first run on a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin "s14_b_${MODE:-ab}"
device_env "$work/env.log"
if [ "${MODE:-ab}" = tests ]; then
  TAILN=8 step tests "${TESTS_S:-400}" python3 -m pytest -q -n 15 -p no:cacheprovider \
    tests/fa4/test_bwd_gpu.py tests/fa4/test_bwd_cluster_gpu.py tests/fa4/test_bwd_feat_gpu.py \
    tests/fa4/test_bwd_gqa_loop_gpu.py tests/fa4/test_varlen_bwd_gpu.py
  exit 0
fi
if [ "${MODE:-ab}" = hd64 ]; then
  # ds_early now the hd64 default: against it off, non-deterministic and deterministic; then the
  # backward GPU tests that run hd64 defaults (test_bwd_gpu, 'loop' and 'atomic' t128 GQA).
  for det in "" --det; do
    TAILN=6 step "hd64$det" 150 python3 bench/bwd_order.py --orders default --rounds 2 $det \
      --variants '[{"ds_early": false}]' --shapes llama3.2-1b-8k,gpt2-1k,hd64-8k --out "$work/hd64$det.json"
  done
  TAILN=6 step tests64 "${TESTS_S:-300}" python3 -m pytest -q -n 15 -p no:cacheprovider \
    tests/fa4/test_bwd_gpu.py tests/fa4/test_bwd_gqa_loop_gpu.py
  exit 0
fi
SHAPES=${SHAPES:-varlen-causal,window,causal-8k,noncausal-8k,llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k}
TAILN=14 step "ab${RUN:-1}" "${AB_S:-300}" python3 bench/bwd_order.py --orders default --rounds 2 \
  --variants '[{"ds_early": true}]' --shapes "$SHAPES" --out "$work/ab${RUN:-1}.json"
