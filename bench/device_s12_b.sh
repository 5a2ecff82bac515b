#!/usr/bin/env bash
# Session 12, GPU start 2, after README command (1): the two new backward defaults.
#  1. tests/fa4/test_bwd_gpu.py -k "256 or hd64" ... : the standard backward tests whose default now
#     runs the exchange (hd256) plus the exchange's own GPU tests at hd256, 150 s;
#  2. bench/bench_cluster.py --hds 256 (second run: off = the default without the exchange), 80 s;
#  3. bench/bench_gqa_loop.py at three hd64 GQA shapes (the default is now 'loop' + 'direct'), 170 s.
# One tar under $OUT: s12_b.tar.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s12_b
device_env "$work/env.log"
workers=""
python3 -c "import xdist" 2>/dev/null && workers="-n 12"
[ "${SKIP_TESTS:-0}" = 1 ] || KEEP="FAILED|passed|failed|rc=" TAILN=20 step tests 150 python3 -m pytest -q $workers \
  -p no:cacheprovider --tb=line tests/fa4/test_bwd_gpu.py tests/fa4/test_bwd_cluster_gpu.py -k "256"
TAILN=8 step cluster 80 python3 bench/bench_cluster.py --hds 256 --out "$work/cluster.json"
TAILN=8 step loop 170 python3 bench/bench_gqa_loop.py --shapes llama3.2-1b-8k,llama3.2-1b-4k-b2,sq2k-sk8k-hd64 \
  --out "$work/loop.json"
