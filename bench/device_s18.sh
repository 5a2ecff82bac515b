#!/usr/bin/env bash
# Session 18, after README command (1) (`bash bench/device_main.sh`). One phase a call (600 s cap):
#  a: issue 18's varlen causal and window backward against the reference, more samples (the bar
#     0.95: varlen's median 0.955 over nine runs, window 0.925-0.974 not re-measured since session 16);
#  b: issue 20's provider="auto" bar, the measuring half: each provider's default on the 10 problems
#     of bench/shapes/issue16_table.csv into a DB that outlives the call (fa4-tune --trials 1, both L2
#     modes, correctness-gated);
#  c: the timing half: auto against every provider in one process (bench/auto_dispatch.py), and the
#     host cost once more (issue 20's fwd+bwd bar sat at 150 us).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-a}
device_begin "s18$phase"
device_env "$work/env.log"
db=/tmp/s18_auto.db
if [ "$phase" = a ]; then
  for run in 1 2; do
    TAILN=8 step "bwd_feat$run" 200 python3 bench/bwd_order.py --orders default --rounds 4 \
      --shapes varlen-causal,window --out "$work/bwd_feat$run.json"
  done
  exit 0
fi
python3 -m pip install -q --no-index --no-deps .whl/*.whl >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
if [ "$phase" = b ]; then
  rm -f "$db"
  TAILN=30 KEEP="rc=|^\\$|error|Error" step auto_measure 420 python3 bench/auto_dispatch.py --db "sqlite:///$db" --measure
  cp "$db" "$work/"
  exit 0
fi
TAILN=40 step auto_time 240 python3 bench/auto_dispatch.py --db "sqlite:///$db"
TAILN=10 step host_floor 90 bash -c "cd bench && python3 host_floor.py"
