#!/usr/bin/env bash
# Session 34. One phase a call:
#  a: issue 20's five shapes, ours (default) against the reference, two rounds, and the Sq 2k / Sk 8k
#     'atomic' comparison session 33 left (with and without gqa_finish 'last_cta', against 'loop').
#  d: deterministic / non-deterministic at the GQA shapes (session 33's deterministic last_cta
#     default at hd128; first reading on the H200 if one is lent).
#  c: VARIANTS (JSON) against the default at SHAPES, ROUNDS rounds (DET=1: deterministic).
#  t: GPU tests selected by TESTS (a pytest -k expression) in tests/fa4/test_bwd_gpu.py.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-a}
device_begin "s34$phase"
device_env "$work/env.log"
device_install
FIVE="llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k"
GQA="llama3-8b-8k,qwen2.5-7b-4k,llama3.2-1b-8k"
case "$phase" in
  a)
    TAILN=16 step five 330 python3 bench/bwd_order.py --orders default --rounds 2 --shapes "$FIVE"
    AT='"gqa_reduce": "atomic", "dkv_store": "direct", "q_starts": 1, "head_swizzle": 4'
    TAILN=10 step sq2k 200 python3 bench/bwd_order.py --orders default --rounds 2 --shapes sq2k-sk8k \
      --variants "[{$AT}, {$AT, \"gqa_finish\": \"last_cta\"}]" ;;
  d)
    TAILN=14 step det 300 python3 bench/det_ratio.py --rounds 2 --shapes "$GQA" ;;
  c)
    TAILN=14 step confirm 420 python3 bench/bwd_order.py --orders default --rounds "${ROUNDS:-3}" ${DET:+--det} \
      --variants "${VARIANTS:?}" --shapes "${SHAPES:?}" ;;
  t)
    TAILN=25 step gpu_tests 400 python3 -m pytest -q -n 8 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
      -k "${TESTS:?}" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
