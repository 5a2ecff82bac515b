#!/usr/bin/env bash
# (Phases g, d, d2 and c run the walk_down / default code of branch session30-walk-down, e7b2bec: not on
# main, see bench/RESULTS.md, session 30, "Landing".)
# Session 30: what session 29 packed (bench/device_s29.sh t / s / s2 / r) plus one reading of the hd256
# non-causal gap that needs no new kernel. One phase a call:
#  w: hd256 non-causal, the default (one head a scheduling group) against 4 and 8 heads a group
#     (`--orders default,1:4,1:8`, the runtime knob head_swizzle: same kernel, no recompiles), two
#     interleaved rounds. Reading: in an unmasked walk every CTA of a head adds into the same dQ tile
#     at the same step; at hd256 a wave (~132 CTAs, 64 exchange pairs) is about one head, so one
#     head a group puts the whole wave on one 64 KB dQ region, 8 heads a group spreads it over 8.
#     head_swizzle 4/8 lost 1.5-2.5% at hd128 non-causal (L2 reuse of Q/dO, session 11), where a
#     wave spans two heads' key tiles already. Prediction: +2-6% at hd256 with 8 (the same effect
#     q_starts 16 aims at, by the launch order instead of the walk).
#  g: walk_down's GPU tests against fp32 autograd (tests/fa4/test_bwd_walk_down_gpu.py, the varlen
#     cases -k walking_down): every layout, odd seqlens, Sq != Sk both ways, GQA 'atomic' / 'loop',
#     windows, fp16, deterministic bitwise over 10 runs with the longest key tiles first.
#  d: the deterministic backward walking down with the longest key tiles first, against today's
#     deterministic default (shortest first, walking up) and our non-deterministic kernel
#     (bench/det_ratio.py, two rounds), at 1, 8 and 16 heads a scheduling group. Reading (session
#     30's model, bench/RESULTS.md): today's det/non-det gap at the causal GQA-'atomic' / MHA shapes is
#     the shortest-first launch's tail (the model gives 0.93 at causal 8k, measured 0.93); longest
#     first walking down needs no turn waits beyond one hand-off per CTA of a wave. Prediction:
#     det/non-det 0.93 -> 0.97-0.99 at causal 8k, Qwen2.5-7B and Llama-3-8B with 8-16 heads a group
#     (if a dQ hand-off costs under half a step); GPT-2 1k (8 key tiles a head) within 2%.
#  n: Nsight Compute of the hd256 non-causal backward beside the reference's (session 25 profiled it
#     causal): where our non-causal kernel, slower than our causal one in TFLOP/s (400 against 430),
#     waits; compare the dQ writers' reduce waits and L2 throughput with the causal profile.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-w}
device_begin "s30$phase"
device_env "$work/env.log"
device_install
case "$phase" in
  w)
    TAILN=8 step hd256_swizzle "${LIMIT:-200}" python3 bench/bwd_order.py --orders default,1:4,1:8 --rounds 2 \
      --shapes hd256-8k-noncausal ;;
  g)
    TAILN=8 KEEP="passed|failed|FAILED|Error|error" step walk_down_tests "${LIMIT:-330}" python3 -m pytest -q -n 15 \
      -p no:cacheprovider --maxfail=10 tests/fa4/test_bwd_walk_down_gpu.py tests/fa4/test_varlen_bwd_gpu.py \
      -k "walking_down" ;;
  d)
    TAILN=40 step det_walk_down "${LIMIT:-300}" python3 bench/det_ratio.py --rounds 2 \
      --shapes causal-8k,qwen2.5-7b-4k,llama3-8b-8k,gpt2-1k --det-variants \
      '[{"walk_down": true, "spt_order": false}, {"walk_down": true, "spt_order": false, "head_swizzle": 8},
        {"walk_down": true, "spt_order": false, "head_swizzle": 16}]' ;;
  d2)  # the second run, with 32 heads a group and hd64 MHA
    TAILN=40 step det_walk_down2 "${LIMIT:-300}" python3 bench/det_ratio.py --rounds 2 \
      --shapes causal-8k,llama3-8b-8k,qwen2.5-7b-4k,hd64-8k --det-variants \
      '[{"walk_down": true, "spt_order": false, "head_swizzle": 8}, {"walk_down": true, "spt_order": false, "head_swizzle": 16},
        {"walk_down": true, "spt_order": false, "head_swizzle": 32}]' ;;
  c)  # after the defaults moved (q_starts 16 at hd128/256 where it applies, the deterministic walk
      # down at causal hd128 with >= 64 key tiles): the resolved defaults against the reference and our
      # non-deterministic kernel, hd96's q_starts at 8k against fp32 autograd, and the q_starts tests.
    TAILN=8 step defaults "${LIMIT:-120}" python3 bench/bwd_order.py --orders default --rounds 2 \
      --shapes hd256-8k-noncausal,noncausal-8k,sq2k-sk8k
    TAILN=8 step det_defaults 90 python3 bench/det_ratio.py --rounds 2 --shapes causal-8k,llama3-8b-8k
    TAILN=4 step hd96_q16 60 python3 -c "
import sys, dataclasses, torch; sys.path.insert(0, 'bench'); import check_bwd as c
cfg = dataclasses.replace(c.default_for((1, 8192, 8192, 8, 8), 96, False, False), q_starts=16)
print(c.check_case(1, 8192, 8192, 8, 8, 96, False, torch.bfloat16, cfg))"
    TAILN=4 KEEP="passed|failed|FAILED|Error|error" step q_starts_tests 150 python3 -m pytest -q -n 15 \
      -p no:cacheprovider --maxfail=10 tests/fa4/test_bwd_q_starts_gpu.py ;;
  n)
    SPECS="256:" OUT="$out/ncu" timeout "${LIMIT:-300}" bash bench/ncu_bwd.sh ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
