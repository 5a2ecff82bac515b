#!/usr/bin/env bash
# Next session, after README command (1) (`bash bench/device_main.sh`):
#  MODE=tests: what has not yet run on a GPU: packed varlen under torch.compile (session 14's
#    fa4::varlen_fwd / varlen_bwd; compiled vs eager bitwise, and right), then the forward, feature,
#    varlen and decode GPU suites on the session-14 tree (the backward suite ran in session 14).
#    First the host cost twice (session 14's device_guard: predicted fwd 20.7-21.7 -> ~18 us, fwd+bwd
#    a few us less; the peers in the same runs).
#  MODE=ab: the hd64 ds_early default's fourth and fifth samples and the hd128 shapes again
#    (bench/bwd_order.py --variants, both directions), deterministic included.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin "s15_a_${MODE:-tests}"
device_env "$work/env.log"
if [ "${MODE:-tests}" = tests ]; then
  for run in 1 2; do
    TAILN=5 step "host$run" 120 python3 bench/host_cost.py --providers fa4,flash-attn-4,cudnn
  done
  TAILN=6 step varlen_compile 200 python3 -m pytest -q -p no:cacheprovider tests/fa4/test_varlen_bwd_gpu.py -k compile
  TAILN=8 step fwd_suites "${TESTS_S:-360}" python3 -m pytest -q -n 15 -p no:cacheprovider \
    tests/fa4/test_fwd_gpu.py tests/fa4/test_fwd_features_gpu.py tests/fa4/test_varlen_gpu.py \
    tests/fa4/test_varlen_bwd_gpu.py tests/fa4/test_decode_gpu.py
  exit 0
fi
for det in "" --det; do
  TAILN=14 step "ab$det" 240 python3 bench/bwd_order.py --orders default --rounds 2 $det \
    --variants '[{"ds_early": false}, {"ds_early": true}]' \
    --shapes llama3.2-1b-8k,gpt2-1k,hd64-8k,llama3-8b-8k,qwen2.5-7b-4k,causal-8k --out "$work/ab$det.json"
done
