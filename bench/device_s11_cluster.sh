#!/usr/bin/env bash
# Session 11, helper "cluster" (issue 17, the backward's 2-CTA dS exchange, knob cluster_exchange,
# rebased over varlen and gqa_reduce 'loop'):
#  1. the GPU tests (tests/fa4/test_bwd_cluster_gpu.py: hd192, 192/128, 256, causal and not, odd
#     key-tile counts, GQA/MQA with 'atomic', fp16, beside other knobs, sink + the LSE's gradient),
#     over 8 pytest workers when xdist is there (the time is the kernels' compiles). A hang of the
#     exchange's handshake shows as the timeout (rc 124); the bench still runs.
#  2. backward TFLOP/s, exchange off/on vs the reference FA4, one process (bench/bench_cluster.py:
#     B2, H*hd 2048, S8192, hd256, 192, 192/128, causal and not; do_bench median). Its JSON is
#     rewritten after every row, so a capped run keeps what it measured.
# ONE tar under $OUT: s11_cluster.tar with tests.log, bench.log, bench.json.
# Wall time: under 4 minutes (tests capped at 150 s, bench at 80 s).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s11_cluster}"
r="$out/s11_cluster"
mkdir -p "$r"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FA4_LOOKUP_LOCAL_DB=0
unset FA4_TUNING_URL
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git log --oneline -1; } > "$r/tests.log" 2>&1
workers=""
python3 -c "import xdist" 2>/dev/null && workers="-n 8"
t=$SECONDS
timeout 150 python3 -m pytest -q -x $workers -p no:cacheprovider tests/fa4/test_bwd_cluster_gpu.py 2>&1 \
  | tee -a "$r/tests.log"
echo "tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$r/tests.log"
t=$SECONDS
timeout 80 python3 bench/bench_cluster.py --out "$r/bench.json" 2>&1 | tee "$r/bench.log"
echo "bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$r/bench.log"
tar -C "$out" -cf "$out/s11_cluster.tar" s11_cluster && rm -rf "$r"
