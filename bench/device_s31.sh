#!/usr/bin/env bash
# Session 31: the landed walk orders (q_starts 16 at hd128/256, the deterministic walk down) on the
# GPU once more, and the same two knobs where they are unmeasured. One phase a call:
#  t: the walk tests with the shared helper (bench/check_bwd.py with_knob; walk_down's Sq < Sk cases
#     at hd128/256 now with q_starts 1, which the default's 16 had made infeasible) and the new
#     test that the deterministic 8k default walks down, bitwise over 10 runs.
#  q: q_starts 16 where the default keeps 1: hd64, hd96, hd192 and hd192/128 non-causal (a wave of
#     hd64 holds ~2 heads' 64 key tiles, hd96/192 one to two; every CTA of a head adds into the same
#     dQ tile at a step with 1). Prediction: +1-3% at hd96 / hd192 / hd192/128 (hd128: +1.6-2.7%),
#     within 1% at hd64 (tile_m 128 halves the dQ adds a step). Beside it issue 17's second runs:
#     hd96 causal and hd192/128 non-causal against the reference, and hd96 causal's launch order
#     (longest first at 2/4/8 heads a group; runtime knob, one kernel).
#  d: the deterministic walk down where it is not the default: Llama-3.2-1B 8k (hd64, GQA 4:1
#     'atomic', 64 key tiles a head, det/non-det 0.945 in session 29) and Sq 2k / Sk 8k with GQA
#     'atomic' instead of 'loop' (whose head-major walk would wait at each head). Prediction:
#     Llama-3.2-1B 0.945 -> 0.96-0.98 (Llama-3-8B gained 3.5%); Sq 2k within 2% (its 48 unmasked
#     key tiles of a head meet a query tile at the same step either way). Then issue 20's table
#     with the landed defaults (second H200 run): ours against the reference at its five shapes.
#  h: host cost (bench/host_floor.py, twice).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-t}
device_begin "s31$phase"
device_env "$work/env.log"
device_install
case "$phase" in
  t)
    TAILN=8 KEEP="passed|failed|FAILED|Error|error" step walk_tests "${LIMIT:-420}" python3 -m pytest -q -n 15 \
      -p no:cacheprovider --maxfail=10 tests/fa4/test_bwd_walk_down_gpu.py tests/fa4/test_bwd_q_starts_gpu.py ;;
  q)
    TAILN=12 step q_starts_wide "${LIMIT:-330}" python3 bench/bwd_order.py --orders default --rounds 2 \
      --variants '[{"q_starts": 16}]' \
      --shapes hd96-8k-noncausal,hd192-8k-noncausal,hd192v128-8k-noncausal,hd64-8k-noncausal
    TAILN=8 step hd96_orders 150 python3 bench/bwd_order.py --orders default,0:2,0:4,0:8 --rounds 2 \
      --shapes hd96-8k ;;
  d)
    TAILN=12 step det_wide "${LIMIT:-240}" python3 bench/det_ratio.py --rounds 2 --shapes llama3.2-1b-8k,sq2k-sk8k \
      --det-variants '[{"walk_down": true, "spt_order": false, "head_swizzle": 16},
        {"walk_down": true, "spt_order": false, "head_swizzle": 8},
        {"gqa_reduce": "atomic", "dkv_store": "direct", "walk_down": true, "spt_order": false, "head_swizzle": 16}]'
    TAILN=10 step issue20 200 python3 bench/bwd_order.py --orders default --rounds 2 \
      --shapes llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k ;;
  r)  # the second runs of what moved in q and d, the window tests fixed (q_starts 1), host cost
    TAILN=4 KEEP="passed|failed|FAILED|Error|error" step window_tests 120 python3 -m pytest -q -n 15 \
      -p no:cacheprovider tests/fa4/test_bwd_walk_down_gpu.py -k under_a_window
    TAILN=8 step hd96_orders2 120 python3 bench/bwd_order.py --orders default,0:1,0:2,0:4,1:2 --rounds 3 \
      --shapes hd96-8k
    TAILN=4 step hd96_q16_fp32 60 python3 -c "
import sys, dataclasses, torch; sys.path.insert(0, 'bench'); import check_bwd as c
for sh in ((1, 8192, 8192, 8, 8), (1, 4100, 4100, 8, 8)):
    cfg = dataclasses.replace(c.default_for(sh, 96, False, False), q_starts=16)
    print(sh, c.check_case(*sh, 96, False, torch.bfloat16, cfg))"
    TAILN=8 step hd96_q16 90 python3 bench/bwd_order.py --orders default --rounds 3 --variant-tol 0.004 \
      --variants '[{"q_starts": 16}]' --shapes hd96-8k-noncausal,hd64-8k-noncausal
    TAILN=12 step det_loop_down 120 python3 bench/det_ratio.py --rounds 3 --shapes sq2k-sk8k,llama3.2-1b-8k \
      --det-variants '[{"walk_down": true, "spt_order": false, "head_swizzle": 16},
        {"walk_down": true, "spt_order": false, "head_swizzle": 8}, {"walk_down": true, "spt_order": false}]'
    (cd bench && TAILN=12 step host_floor 90 python3 host_floor.py) ;;
  s)  # after the default change (the deterministic walk down under 'loop' at Sq < Sk): its tests, the
      # third runs of sq2k's and Llama-3.2-1B's det ratios (the old default as a variant), hd96/hd64 q16.
    TAILN=6 KEEP="passed|failed|FAILED|Error|error" step det_default_tests 200 python3 -m pytest -q -n 8 \
      -p no:cacheprovider tests/fa4/test_bwd_walk_down_gpu.py -k "deterministic_default or deterministic_bitwise"
    TAILN=12 step det_loop_down3 120 python3 bench/det_ratio.py --rounds 3 --shapes sq2k-sk8k,llama3.2-1b-8k \
      --det-variants '[{"walk_down": false, "spt_order": true, "head_swizzle": 1},
        {"walk_down": true, "spt_order": false, "head_swizzle": 16}]'
    TAILN=8 step hd96_q16_2 90 python3 bench/bwd_order.py --orders default,0:1,0:2 --rounds 3 --variant-tol 0.004 \
      --variants '[{"q_starts": 16}]' --shapes hd96-8k-noncausal,hd64-8k-noncausal,hd96-8k ;;
  e)  # the defaults of the last change (hd96 causal 2 heads a group; the deterministic walk down at
      # hd64 under GQA): the default test (hd64 GQA added) and both defaults timed once more.
    TAILN=6 KEEP="passed|failed|FAILED|Error|error" step det_default_tests2 120 python3 -m pytest -q -n 8 \
      -p no:cacheprovider tests/fa4/test_bwd_walk_down_gpu.py -k "deterministic_default"
    TAILN=6 step hd96_default 60 python3 bench/bwd_order.py --orders default,0:4 --rounds 3 --shapes hd96-8k
    TAILN=8 step l1b_default 60 python3 bench/det_ratio.py --rounds 3 --shapes llama3.2-1b-8k \
      --det-variants '[{"walk_down": false, "spt_order": true, "head_swizzle": 1}]' ;;
  h)
    (cd bench && TAILN=12 step host_floor "${LIMIT:-120}" python3 host_floor.py)
    (cd bench && TAILN=12 step host_floor2 120 python3 host_floor.py) ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
