#!/usr/bin/env bash
# Next session, after README command (1) (`bash bench/device_main.sh`):
#  MODE=tests: what has not yet run on a GPU: packed varlen under torch.compile (session 14's
#    fa4::varlen_fwd / varlen_bwd; compiled vs eager bitwise, and right), then the forward, feature,
#    varlen and decode GPU suites on the session-14 tree (the backward suite ran in session 14).
#    First the host cost twice (session 14's device_guard: predicted fwd 20.7-21.7 -> ~18 us, fwd+bwd
#    a few us less; the peers in the same runs).
#    Then the backward knob and feature cases of exp_pin (never run on a GPU: correctness first).
#  MODE=ab: exp_pin (session 14, CPU: the exp2 loop pinned ahead of the dP^T wait; without it ptxas
#    leaves 5 of 32 MUFU.EX2 under the dP^T GEMM in the hd128 unmasked loop, with it 32 of 32).
#    Prediction: +2-6% at hd128 (up to ~500 of ~4,600 cycles a step, less where the other consumer
#    warpgroup's GEMMs already fill the tensor cores); alone and with ds_early; then the hd64
#    ds_early default's fourth and fifth samples. bench/bwd_order.py --variants, deterministic too.
#  MODE=abwide: exp_pin at hd192 / 192-128 / 256 (dkv_split 'head_dim'; session 15, CPU: the default
#    keeps 2-9 of a step's 16 MUFU.EX2 under the dP^T GEMM, exp_pin 16 of 16). Prediction +1-4%.
#  MODE=fwdab: the forward's exp_pin (session 15, CPU: the default issues 2 of a step's 66 MUFU.EX2
#    (hd128; the rescale factors) between the S wait and the PV(j-1) wait, exp_pin all 66, at every
#    head dim): every head dim, causal and not, beside the reference, twice. Prediction: +1-4% where
#    the other warpgroup's GEMMs do not already fill the tensor cores (hd64 / hd128 ping-pong), more
#    at hd192/256 (ping-pong off: nothing else runs under PV).
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
  [ -z "${NO_PIN:-}" ] && TAILN=6 step exp_pin 240 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
    tests/fa4/test_bwd_feat_gpu.py -k "exp_pin"
  TAILN=8 step fwd_suites "${TESTS_S:-360}" python3 -m pytest -q -n 15 -p no:cacheprovider \
    tests/fa4/test_fwd_gpu.py tests/fa4/test_fwd_features_gpu.py tests/fa4/test_varlen_gpu.py \
    tests/fa4/test_varlen_bwd_gpu.py tests/fa4/test_decode_gpu.py
  exit 0
fi
if [ "${MODE}" = pin ]; then
  TAILN=8 step exp_pin_bwd 220 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
    tests/fa4/test_bwd_feat_gpu.py -k "exp_pin"
  TAILN=8 step exp_pin_fwd 200 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_fwd_gpu.py \
    tests/fa4/test_fwd_features_gpu.py -k exp_pin
  exit 0
fi
if [ "${MODE}" = fwdab ]; then
  TAILN=12 step fwd_correct 300 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_fwd_gpu.py \
    tests/fa4/test_fwd_features_gpu.py -k exp_pin
  for run in 1 2; do
    TAILN=30 step "fwdab$run" 240 python3 bench/check_fwd.py --no-check --hds 64,96,128,192,192v128,256 \
      --variants '[{"exp_pin": true}]' --out "$work/fwdab$run.json"
  done
  exit 0
fi
if [ "${MODE}" = abwide ]; then
  TAILN=12 step abwide "${AB_S:-400}" python3 bench/bwd_order.py --orders default --rounds 2 \
    --variants '[{"exp_pin": true}]' --shapes hd192-8k,hd192v128-8k,hd256-8k --out "$work/abwide.json"
  exit 0
fi
# MODE=ab (non-deterministic, issue 18's and 20's shapes) or MODE=abdet (deterministic): one call each.
det=""; shapes=varlen-causal,window,llama3-8b-8k,qwen2.5-7b-4k,causal-8k,llama3.2-1b-8k,gpt2-1k
[ "${MODE}" = abdet ] && det=--det && shapes=llama3.2-1b-8k,llama3-8b-8k,causal-8k
TAILN=14 step "ab$det" "${AB_S:-500}" python3 bench/bwd_order.py --orders default --rounds 2 $det \
  --variants '[{"exp_pin": true}, {"exp_pin": true, "ds_early": true}, {"ds_early": false}, {"ds_early": true}]' \
  --shapes "${SHAPES:-$shapes}" --out "$work/ab$det.json"
