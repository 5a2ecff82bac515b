#!/usr/bin/env bash
# Session 26 (no machine lent; for the next GPU session), after README command (1) (`bash
# bench/device_main.sh`). One phase a call:
#  v: session 25's pending check: the causal forward head_swizzle default (swizzle_fits_l2) against 1,
#     Llama-3-8B's GQA 8k included, and the hd128 forward GPU cases.
#  o: the hd192/256 backward step orders (dp_first, dk_before_dq; session 26, compiled clean, not yet
#     run): their GPU tests against fp32 autograd (each alone and together, with and without the
#     exchange, deterministic bitwise), then each against the default and the reference, twice.
#     Prediction: hd256 causal +3-8% with both (Q's 32 KB load under dP^T and dQ instead of exposed;
#     session 25's Nsight: the consumers' largest stall); hd192 within 2% (two Q/dO stages there).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-o}
device_begin "s26$phase${2:-}"
device_env "$work/env.log"
device_install
case "$phase" in
  v)
    TAILN=12 KEEP="EFFECT|SKIP|INCORRECT|FAILED|rc=" step swz_default 150 python3 bench/knob_effects.py --check \
      --rounds 3 --shapes 8192:128:1:1:32:8,8192:128:1:1:32,4096:128:1,8192:64:1 --variants '[{}, {"head_swizzle": 1}]'
    TAILN=6 KEEP="passed|failed|FAILED" step fwd_tests 150 python3 -m pytest -q -n 15 -p no:cacheprovider \
      tests/fa4/test_fwd_gpu.py -k "128-128" ;;
  o)
    TAILN=8 KEEP="passed|failed|FAILED" step order_tests 280 python3 -m pytest -q -n 15 -p no:cacheprovider \
      tests/fa4/test_bwd_gpu.py::test_later_head_dims_each_knob_alone \
      tests/fa4/test_bwd_gpu.py::test_step_orders_deterministic_bitwise \
      tests/fa4/test_bwd_cluster_gpu.py::test_exchange_with_other_knobs
    for r in 1 2; do
      TAILN=14 step "orders$r" 240 python3 bench/bwd_order.py --orders default --rounds 2 \
        --shapes hd256-8k,hd192-8k,hd192v128-8k \
        --variants '[{"dp_first": true}, {"dk_before_dq": true}, {"dp_first": true, "dk_before_dq": true}]'
    done ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
