#!/usr/bin/env bash
# Session 38. One phase a call:
#  d: the deterministic hd64 kernels with stat_shuffle against the deterministic default (three rounds,
#     bench/det_ratio.py --det-variants): session 37 measured it mixed (-2.3 to +2.8%) in two runs;
#     its SASS changes the loop exactly as in the non-deterministic kernel (64 LDS -> 8 LDS + 128
#     SHFL, 168 registers either way), where it paid 1-4%. Prediction: +0-2%.
#  s: the tuner where no study has run: the deterministic Llama-3.2-1B 8k backward (det/non-det
#     0.912-0.920, the furthest from issue 20's 0.95), and GPT-2 1k non-deterministic with the
#     stat_shuffle default. Prediction: neither beats its default by more than 2% (sessions 17-32's
#     studies found +0.7-1.9%).
#  t: GPU tests (TESTS: a -k expression of tests/fa4/test_bwd_gpu.py; default gqa_add_bulk).
#  c: VARIANTS (JSON) against the default at SHAPES, ROUNDS rounds (DET=1: deterministic).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-d}
device_begin "s38$phase"
device_env "$work/env.log"
device_install
L1B="--batch 1 --seqlen 8192 --heads 32 --heads-kv 8 --hdim 64 --causal"
GPT2="--batch 16 --seqlen 1024 --heads 12 --hdim 64 --causal"
case "$phase" in
  d)
    DV='[{"stat_shuffle": true}]'
    TAILN=16 step det 300 python3 bench/det_ratio.py --rounds "${ROUNDS:-3}" \
      --det-variants "${VARIANTS:-$DV}" --shapes "${SHAPES:-llama3.2-1b-8k,hd64-8k,gpt2-1k}" ;;
  s)
    TAILN=14 step tune_l1b_det 260 fa4-tune --pass bwd --trials 16 --verify-rounds 3 --budget-s 170 $L1B --deterministic
    TAILN=14 step tune_gpt2 200 fa4-tune --pass bwd --trials 14 --verify-rounds 3 --budget-s 120 $GPT2 ;;
  t)
    TAILN=12 step tests 420 python3 -m pytest -q -n 8 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
      -k "${TESTS:-gqa_add_bulk}" ;;
  c)
    TAILN=14 step confirm 420 python3 bench/bwd_order.py --orders default --rounds "${ROUNDS:-3}" ${DET:+--det} \
      --variants "${VARIANTS:?}" --shapes "${SHAPES:?}" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
