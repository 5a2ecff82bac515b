#!/usr/bin/env bash
# Session 21, after README command (1) (`bash bench/device_main.sh`). One phase a call (600 s cap):
#  d: flash_attn_func's default provider, "auto", on the GPU with an empty DB (bench/check_default.py):
#     every plain call must be ours, errors against fp32 within 3x PyTorch's bf16 error, and the
#     dispatch's host price per call against provider="fa4" (prediction: +2-5 us on the forward).
#  m: issue 20's auto bar, measuring half: the four providers' default rows (both L2 modes) for the
#     ten rows of bench/shapes/issue16_table.csv into /tmp/s21_all.db (kept for the next call on a
#     warm machine, and copied to $OUT).
#  n: the timing half, twice (six rotated rounds, medians): auto against each provider.
#  c: check_default with m's DB (the choice a measured DB makes, run by a plain call), then the
#     causal hd128 S8k forward study (sessions 19-20 read 0.934-0.950 of the reference there while
#     S16k is at ~1.0) and the plain causal forward against the reference in one process.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-d}
device_begin "s21$phase"
device_env "$work/env.log"
device_install
db=/tmp/s21_all.db
case "$phase" in
  d)
    TAILN=8 step default_empty 150 bash -c "cd bench && python3 check_default.py" ;;
  m)
    rm -f "$db"
    TAILN=20 KEEP="rc=|^\\$|error|Error" step auto_measure 560 python3 bench/auto_dispatch.py --db "sqlite:///$db" \
      --measure --shapes bench/shapes/issue16_table.csv
    cp "$db" "$work/" ;;
  n)
    for run in 1 2; do
      TAILN=12 KEEP="auto chose|slower than|fwd|bwd" step "auto_all$run" 290 python3 bench/auto_dispatch.py \
        --db "sqlite:///$db" --shapes bench/shapes/issue16_table.csv
    done ;;
  c)
    [ -f "$db" ] && TAILN=8 step default_db 120 bash -c "cd bench && python3 check_default.py --db sqlite:///$db --calls 1000"
    TAILN=14 step causal_study 300 fa4-tune --seqlen 8192 --hdim 128 --causal --trials 40 --db sqlite:////tmp/causal.db
    TAILN=8 step causal_vs_ref 120 python3 bench/bench_fwd.py --providers fa4,flash-attn-4 --seqlens 8192,16384 \
      --hdims 128 --causal yes ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
