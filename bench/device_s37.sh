#!/usr/bin/env bash
# Session 37. One phase a call:
#  p: where GPT-2's backward main kernel loses to the reference's: the per-kernel split at GPT-2 1k
#     and Sq 2k / Sk 8k (bench/kernel_split.py), then Nsight Compute on one backward of each at
#     GPT-2 1k (B16 H12 hd64 causal: bench/ncu_bwd.sh), the top stalls of both main kernels
#     (bench/ncu_stalls.py) and their duration / issue / occupancy lines. Reports go to $OUT.
#  t: stat_shuffle's GPU tests (test_bwd_gpu's knob-alone and deterministic cases, test_bwd_feat_gpu's
#     features case).
#  c: VARIANTS (JSON) against the default at SHAPES, ROUNDS rounds (DET=1: deterministic).
#  d: deterministic VARIANTS (JSON) against the deterministic default at SHAPES (bench/det_ratio.py).
#  m: issue 20's five shapes ours/ref, deterministic / non-deterministic, host cost (as device_s36.sh m).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-p}
device_begin "s37$phase"
device_env "$work/env.log"
device_install
FIVE="llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k"
case "$phase" in
  p)
    TAILN=30 step split 150 python3 bench/kernel_split.py --calls 20 --shapes "${SHAPES:-gpt2-1k,sq2k-sk8k}"
    OUT="$out/ncu" SPECS="64:--seqlen=1024,--causal,--width=768" TAILN=40 step ncu 300 bash bench/ncu_bwd.sh
    for k in FlashBwdSm90 FlashAttentionBackwardSm90; do
      TAILN=45 step "stalls_$k" 60 python3 bench/ncu_stalls.py "$out/ncu/bwd64seqlen1024causalwidth768.source.csv" "$k" --top 40
    done ;;
  t)
    TAILN=12 step tests 300 python3 -m pytest -q -n 8 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
      tests/fa4/test_bwd_feat_gpu.py -k "${TESTS:-stat_shuffle}" ;;
  d)
    TAILN=16 step det 300 python3 bench/det_ratio.py --rounds "${ROUNDS:-2}" --det-variants "${VARIANTS:?}" \
      --shapes "${SHAPES:?}" ;;
  c)
    TAILN=14 step confirm 420 python3 bench/bwd_order.py --orders default --rounds "${ROUNDS:-3}" ${DET:+--det} \
      --variants "${VARIANTS:?}" --shapes "${SHAPES:?}" ;;
  m)
    TAILN=16 step five 300 python3 bench/bwd_order.py --orders default --rounds 2 --shapes "${SHAPES:-$FIVE}"
    TAILN=16 step det 200 python3 bench/det_ratio.py --rounds 2 --shapes "${SHAPES:-$FIVE}"
    (cd bench && TAILN=12 step host_floor 90 python3 host_floor.py) ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
