#!/usr/bin/env bash
# Session 28 (no device time then: prepared for the next GPU session), after README command (1)
# (`bash bench/device_main.sh`) and session 27's leftovers (`bash bench/device_s27.sh r 2`, then `v`).
# One phase a call:
#  q: the shifted query walks (knob q_starts, fa4.common.bwd_schedule.walk_tile) against fp32 autograd:
#     tests/fa4/test_bwd_q_starts_gpu.py and the varlen cases (test_varlen_bwd_gpu.py -k shifted).
#  s [N]: q_starts 4 / 16 / 64 against the default (1) and the reference (bench/bwd_order.py --variants),
#     non-causal and causal Sq 2k / Sk 8k. Prediction: with 1 every CTA of a wave adds its dQ tile into
#     the same accumulator tile at the same step where the CTAs' unmasked runs coincide (a causal walk at
#     Sq = Sk is spread by its diagonal); at hd256 (64 KB of dQ a step, the exchange's pairs) the
#     non-causal backward runs 0.90 of our causal one's TFLOP/s while the reference's runs 1.03: q_starts
#     16-64 +4-10% at hd256 non-causal (issue 17's 1.054 -> 1.10), +1-3% at hd128 non-causal and at Sq 2k /
#     Sk 8k (issue 20's 0.968: 48 of a head's 64 key tiles walk all 32 query tiles unmasked), within
#     noise at hd96/192 (smaller dQ tiles a FLOP). Run twice (N = 1, 2).
#  h [N]: hd256 non-causal (issue 17: 1.054 of the reference against 1.10) and causal, the other candidates
#     one at a time beside q_starts: dp_first (with the default's dk_before_dq: causal 1.189 / 1.193),
#     the queries-on-M tiling at 64 keys with one Q/dO stage (compiled clean, never timed), and
#     q_starts 16 with dp_first. (q_starts is refused causal: bwd_order skips it there with the reason.)
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-q}
device_begin "s28$phase${2:-}"
device_env "$work/env.log"
device_install
STARTS='[{"q_starts": 4}, {"q_starts": 16}, {"q_starts": 64}]'
case "$phase" in
  q)
    TAILN=20 KEEP="passed|failed|FAILED|Error|error" step q_starts_tests 420 python3 -m pytest -q -n 15 \
      -p no:cacheprovider --maxfail=10 tests/fa4/test_bwd_q_starts_gpu.py tests/fa4/test_varlen_bwd_gpu.py \
      -k "shifted" ;;
  s)
    TAILN=16 step "q_starts${2:-}" 560 python3 bench/bwd_order.py --orders default --rounds 2 \
      --shapes "${SHAPES:-hd256-8k-noncausal,noncausal-8k,sq2k-sk8k,hd192-8k-noncausal,hd96-8k-noncausal,varlen}" \
      --variants "$STARTS" ;;
  h)
    TAILN=16 step "hd256_${2:-}" 560 python3 bench/bwd_order.py --orders default --rounds 2 \
      --shapes "hd256-8k-noncausal,hd256-8k" --variants '[{"q_starts": 16}, {"dp_first": true},
      {"dp_first": true, "q_starts": 16},
      {"qm_tile_n": 64, "cluster_exchange": false, "stages": 1, "do_single": false, "ds_stages": 1, "dk_before_dq": false},
      {"qm_tile_n": 64, "cluster_exchange": false, "stages": 1, "do_single": false, "ds_stages": 1, "dk_before_dq": true}]' ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
