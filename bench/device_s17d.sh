#!/usr/bin/env bash
# Ran once at a889164 (bench/RESULTS.md, session 17): q_order was taken out again in 6a89fdf, so on
# later commits its tests and variants are gone; check out a889164 to rerun it.
# Session 17, second device round: q_order 'descending' (each CTA walks its query tiles from the
# last one down; compile-checked clean, the ascending kernels byte-identical). Its GPU tests first
# (right, and deterministic bitwise under both launch orders: no deadlock with the longest key
# tiles first), then issue 20's deterministic bar with it, twice: our deterministic default and
# three descending variants against our non-deterministic default in one process. Prediction (a
# list-scheduling model of the causal launch, bench/RESULTS.md session 17): MHA causal det/non-det
# 0.94 -> ~1.0 with the longest-first launch; GQA shapes gain the same ~5% but keep the serialized
# dK/dV turns. Last, the non-deterministic kernels with the descending walk (the CTAs in flight
# share Q/dO tiles in L2): within noise expected.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s17d
device_env "$work/env.log"
TAILN=8 step q_order_tests 240 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_bwd_q_order_gpu.py \
  tests/fa4/test_varlen_bwd_gpu.py -k "descending"
V='[{"q_order": "descending", "spt_order": false}, {"q_order": "descending", "spt_order": false, "head_swizzle": 2}, {"q_order": "descending", "spt_order": false, "head_swizzle": 4}]'
for run in 1 2; do
  TAILN=40 step "det_desc$run" 150 python3 bench/det_ratio.py --rounds 3 --det-variants "$V" --out "$work/det_desc$run.json"
done
TAILN=10 step nondet_desc 120 python3 bench/bwd_order.py --orders default --rounds 2 \
  --variants '[{"q_order": "descending"}]' --shapes causal-8k,llama3-8b-8k,gpt2-1k,varlen-causal --out "$work/nondet_desc.json"
