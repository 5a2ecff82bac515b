#!/usr/bin/env bash
# Session 32: issue 20 where it stands, and the tuner at its shapes, where no backward study has run
# (GQA 'atomic' at Qwen2.5-7B, GQA 'loop' at Sq 2k / Sk 8k, and the deterministic backward at the two
# shortest walks, Qwen2.5-7B 4k and GPT-2 1k, where walking down lost). One phase a call:
#  m: issue 20's table (ours against the reference, the five shapes, two rounds), GPT-2's
#     exp_pin + head_swizzle 16 (session 17's tuner pick, +1.6% there) once more, host cost.
#  d: deterministic / non-deterministic at the five shapes, then the deterministic Qwen2.5-7B study.
#  t: the studies: deterministic GPT-2, non-deterministic Qwen2.5-7B and Sq 2k / Sk 8k.
#     Prediction: no study finds more than +2% over the default (sessions 17-30's studies at other
#     shapes found +0.7-1.6%, the gaps sit in the kernels), except the deterministic ones at the short
#     walks, where the launch order and the heads a group are the whole deterministic cost (+2-4%).
#  c: VARIANTS (JSON) against the default at SHAPES, three rounds (a second run of what t found).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-m}
device_begin "s32$phase"
device_env "$work/env.log"
device_install
QWEN="--batch 2 --seqlen 4096 --heads 28 --heads-kv 4 --hdim 128 --causal"
GPT2="--batch 16 --seqlen 1024 --heads 12 --hdim 64 --causal"
SQ2K="--batch 1 --seqlen 2048 --seqlen-k 8192 --heads 64 --heads-kv 8 --hdim 128 --causal"
TUNE="--pass bwd --trials 14 --verify-rounds 3"
case "$phase" in
  m)
    TAILN=12 step issue20 220 python3 bench/bwd_order.py --orders default --rounds 2 \
      --shapes llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k
    TAILN=6 step gpt2_pin 90 python3 bench/bwd_order.py --orders default --rounds 3 \
      --variants '[{"exp_pin": true, "head_swizzle": 16}]' --shapes gpt2-1k
    (cd bench && TAILN=12 step host_floor 90 python3 host_floor.py) ;;
  d)
    TAILN=12 step det_ratio 220 python3 bench/det_ratio.py --rounds 2 \
      --shapes llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k
    TAILN=14 step tune_qwen_det 300 fa4-tune $TUNE --budget-s 140 $QWEN --deterministic ;;
  t)
    TAILN=14 step tune_gpt2_det 220 fa4-tune $TUNE --budget-s 110 $GPT2 --deterministic
    TAILN=14 step tune_qwen 220 fa4-tune $TUNE --budget-s 110 $QWEN
    TAILN=14 step tune_sq2k 220 fa4-tune $TUNE --budget-s 110 $SQ2K ;;
  c)
    TAILN=12 step confirm 300 python3 bench/bwd_order.py --orders default --rounds 3 ${DET:+--det} \
      --variants "${VARIANTS:?}" --shapes "${SHAPES:?}"
    (cd bench && TAILN=12 step host_floor2 90 python3 host_floor.py) ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
