#!/usr/bin/env bash
# Next session, after README command (1): what session 11 left to check on the H200.
#  1. tests/fa4/test_bwd_gpu.py (its knob cases now flip the problem's own launch-order default;
#     session 11's run had 5 failures of the old no-op changes and one unidentified F), -v so that
#     each failure is named as it happens.
#  2. bench/bench_varlen.py (issue 18's varlen bar through its own script, the new launch order).
#  3. bench/bench_gqa_loop.py at Llama-3.2-1B hd64 (deterministic 'atomic' at tile_m 64 vs 'loop'
#     at 128).
# Logs under $OUT (one tar).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s12_a
workers=""
python3 -c "import xdist" 2>/dev/null && workers="-n 12"
[ "${SKIP_TESTS:-0}" = 1 ] || KEEP="FAILED|passed|failed|rc=" TAILN=30 step tests 200 python3 -m pytest -v $workers \
  -p no:cacheprovider --tb=line tests/fa4/test_bwd_gpu.py
[ "${SKIP_VARLEN:-0}" = 1 ] || TAILN=10 step varlen 120 python3 bench/bench_varlen.py --out "$work/varlen.json"
[ "${SKIP_LOOP:-0}" = 1 ] || TAILN=6 step loop 150 python3 bench/bench_gqa_loop.py --shapes llama3.2-1b-8k --out "$work/loop.json"
