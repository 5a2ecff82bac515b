#!/usr/bin/env bash
# Session 20, after README command (1) (`bash bench/device_main.sh`). One phase a call (600 s cap):
#  a: issue 20's provider="auto" at GPT-2 1k (the shape that failed), timed from session 20's
#     first start's DB (carried as .device/s20_auto.db: the providers' cold and warm rows). There,
#     in do_bench rounds of rotated order, every host-bound provider read 15-40% slower in its
#     second round than its first (fa4 fwd+bwd 0.400 -> 0.550, cuDNN 0.579 -> 0.681; FA2, GPU-bound,
#     flat), so auto's 1.38-1.39 "slower" was its position. Now six rounds, medians, and the garbage
#     collector's time per call; then the same with gc.freeze(). Prediction: auto/fa4 within 3%
#     with grad in both; if the collector's time per call grows with the rounds and freezing
#     removes the drift, the drift is the collector walking a heap the compiled kernels grew.
#  t: the hd64 causal forward at short sequences, tile_m 128 against the default 192, a second run
#     of session 20's (+4.5% / +5.0% with pingpong 'mma' at S1k, -6% at S2k, -5% non-causal S1k),
#     with S512 and S1536 to place a threshold. Prediction: +4-5% at S1k, more at S512 (a 192-row
#     tiling leaves 2.67 tiles), S1536 (8 full 192-row tiles) a loss like S2k's.
#  m, n: issue 20's auto bar on all ten rows with the six-round medians (m measures, n times twice).
#  d: flash_attn_func's default provider, "auto", on the GPU (bench/check_default.py): what a plain
#     call runs with an empty DB and with start 1's, its errors, and the dispatch's host cost.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-a}
device_begin "s20$phase"
device_env "$work/env.log"
device_install
if [ "$phase" = a ]; then
  db=/tmp/s20_auto.db
  cp .device/s20_auto.db "$db"
  TAILN=8 step auto_time1 150 python3 bench/auto_dispatch.py --db "sqlite:///$db" --shapes bench/shapes/gpt2_1k.csv
  TAILN=8 step auto_freeze 150 python3 bench/auto_dispatch.py --db "sqlite:///$db" --shapes bench/shapes/gpt2_1k.csv \
    --gc-freeze
  TAILN=10 step host_floor 90 bash -c "cd bench && python3 host_floor.py"
  exit 0
fi
if [ "$phase" = t ]; then
  TAILN=12 step fwd_tile 200 python3 bench/knob_effects.py --check --shapes 1024:64:1,512:64:1,1536:64:1 \
    --variants '[{}, {"tile_m": 128}, {"tile_m": 128, "pingpong": "mma"}]' --out "$work/fwd_tile.json"
  exit 0
fi
if [ "$phase" = d ]; then
  # provider="auto" as flash_attn_func's default, on the GPU: with an empty DB every plain call must
  # be ours (errors against fp32 within 3x PyTorch's bf16 error), and the dispatch's host price per
  # call against provider="fa4" (prediction: +2-5 us on the forward, inside the fwd+bwd's spread);
  # then with start 1's measured DB at GPT-2 (the choice the DB makes, run by a plain call).
  TAILN=8 step default_empty 120 bash -c "cd bench && python3 check_default.py"
  db=/tmp/s20_auto.db
  cp .device/s20_auto.db "$db"
  TAILN=8 step default_db 100 bash -c "cd bench && python3 check_default.py --db sqlite:///$db --calls 1000"
  exit 0
fi
if [ "$phase" = m ] || [ "$phase" = n ]; then
  # Issue 20's auto bar on all ten rows (bench/shapes/issue16_table.csv) with the six-round medians:
  # m measures the four providers' default rows (both L2 modes) into /tmp/s20_all.db (kept for the
  # next call on a warm machine, and in the tar); n times auto against each provider, twice.
  db=/tmp/s20_all.db
  if [ "$phase" = m ]; then
    rm -f "$db"
    TAILN=20 KEEP="rc=|^\\$|error|Error" step auto_measure 560 python3 bench/auto_dispatch.py --db "sqlite:///$db" \
      --measure --shapes bench/shapes/issue16_table.csv
    cp "$db" "$work/"
    exit 0
  fi
  for run in 1 2; do
    TAILN=12 KEEP="auto chose|slower than" step "auto_all$run" 280 python3 bench/auto_dispatch.py --db "sqlite:///$db" \
      --shapes bench/shapes/issue16_table.csv
  done
  exit 0
fi
echo "unknown phase $phase" >&2
exit 2
