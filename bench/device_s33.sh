#!/usr/bin/env bash
# Session 33: gqa_finish 'last_cta' (GQA 'atomic': the first CTA of a group stores its fp32 dK/dV
# tile, the last writes the output; no memset of the sums, no dK/dV postprocess). One phase a call:
#  t: the GPU tests: session 32's new defaults' deterministic bitwise tests (not run on the GPU then)
#     and the new path's (tests/fa4/test_bwd_gpu.py -k "deterministic_bitwise or gqa_finish").
#  b: ours (default, last_cta) against the reference at the GQA 'atomic' shapes of issue 20 (three
#     rounds), then deterministic / non-deterministic with the deterministic last_cta beside.
#     Prediction: +1.5-2% at Llama-3-8B 8k, Qwen2.5-7B 4k and Llama-3.2-1B 8k (the memset of
#     64 / 33 / 33 MB of fp32 sums and their two postprocess passes, 40-50 / 20-25 / 25 us of
#     2.5 / 1.2 / 1.4 ms), deterministic alike.
#  c: VARIANTS (JSON) against the default at SHAPES, three rounds (DET=1: deterministic).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-t}
device_begin "s33$phase"
device_env "$work/env.log"
device_install
GQA="llama3-8b-8k,qwen2.5-7b-4k,llama3.2-1b-8k"
LAST='[{"gqa_finish": "last_cta"}]'
case "$phase" in
  t)
    # (The later head dims' bitwise tests are left out: session 32's default changed hd64 only.)
    TAILN=25 step gpu_tests 300 python3 -m pytest -q -n 8 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
      -k "gqa_finish or test_deterministic_bitwise or test_autograd_deterministic_bitwise" ;;
  b)
    TAILN=14 step order 250 python3 bench/bwd_order.py --orders default --rounds 3 --variants "$LAST" --shapes "$GQA"
    # Sq 2k / Sk 8k takes 'loop' by default; 'atomic' was even with it in session 32 (0.952 / 0.958
    # against 0.939 / 0.958, 4 heads a group, q_starts 1): with and without last_cta beside it.
    AT='"gqa_reduce": "atomic", "q_starts": 1, "head_swizzle": 4'
    TAILN=10 step sq2k 150 python3 bench/bwd_order.py --orders default --rounds 2 --shapes sq2k-sk8k \
      --variants "[{$AT}, {$AT, \"gqa_finish\": \"last_cta\"}]"
    TAILN=14 step det 200 python3 bench/det_ratio.py --rounds 2 --det-variants "$LAST" --shapes "$GQA" ;;
  c)
    TAILN=12 step confirm 300 python3 bench/bwd_order.py --orders default --rounds 3 ${DET:+--det} \
      --variants "${VARIANTS:?}" --shapes "${SHAPES:?}"
    (cd bench && TAILN=12 step host_floor 90 python3 host_floor.py) ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
