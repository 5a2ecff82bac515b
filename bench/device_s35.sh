#!/usr/bin/env bash
# Session 35. One phase a call:
#  t: the deterministic backward's GPU tests after its first dQ turn stores instead of adding (the
#     preprocess then zeroes only the query tiles no key tile reaches): bitwise repeats and fp32
#     references, dense (incl. Sq > Sk causal, whose first rows see no key), windows/softcap/sinks,
#     GQA 'loop', varlen and the walk-down orders.
#  d: deterministic / non-deterministic at the GQA shapes with --zero-all (the same deterministic
#     config with every dQ row zeroed, as before: the change's A/B in one process), two rounds;
#     then the per-kernel split of the deterministic backward.
#  a: issue 20's five shapes, ours (default) against the reference, two rounds.
#  c: VARIANTS (JSON) against the default at SHAPES, ROUNDS rounds (DET=1: deterministic).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-t}
device_begin "s35$phase"
device_env "$work/env.log"
device_install
FIVE="llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k"
GQA="llama3-8b-8k,qwen2.5-7b-4k,llama3.2-1b-8k"
case "$phase" in
  t)
    TAILN=12 step det_dense 300 python3 -m pytest -q -n 8 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
      -k "${TESTS:-deterministic or grads_match_reference}"
    TAILN=12 step det_more 280 python3 -m pytest -q -n 8 -p no:cacheprovider tests/fa4/test_bwd_feat_gpu.py \
      tests/fa4/test_bwd_gqa_loop_gpu.py tests/fa4/test_varlen_bwd_gpu.py tests/fa4/test_bwd_walk_down_gpu.py \
      -k "${TESTS2:-deterministic or det or see_no_key}" ;;
  d)
    TAILN=16 step det 330 python3 bench/det_ratio.py --rounds 2 --zero-all --shapes "${SHAPES:-$GQA}"
    TAILN=30 step split 200 python3 bench/kernel_split.py --det --calls 20 --shapes "${SHAPES:-$GQA}" ;;
  a)
    TAILN=16 step five 330 python3 bench/bwd_order.py --orders default --rounds 2 --shapes "$FIVE" ;;
  c)
    TAILN=14 step confirm 420 python3 bench/bwd_order.py --orders default --rounds "${ROUNDS:-3}" ${DET:+--det} \
      --variants "${VARIANTS:?}" --shapes "${SHAPES:?}" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
