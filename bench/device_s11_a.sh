#!/usr/bin/env bash
# Session 11, call A: the backward's launch order (bench/bwd_order.py) at the varlen, window, sink,
# GQA and plain causal shapes, ours vs the reference FA4 in one process. Results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s11_a}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FA4_LOOKUP_LOCAL_DB=0
unset FA4_TUNING_URL
git log --oneline -1 2>/dev/null
echo "\$ python3 bench/bwd_order.py --out bwd_order.json"
t=$SECONDS
timeout "${BWD_ORDER_TIMEOUT:-420}" python3 bench/bwd_order.py --out "$out/bwd_order.json" ${BWD_ORDER_ARGS:-} 2>&1 \
  | tee "$out/bwd_order.log" | grep -v "^BENCH "
echo "[bwd_order rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]"
