#!/usr/bin/env bash
# Session 23, second machine (after README command (1) ran on the first): the GPT-2 row of issue
# 20's auto bar from call m's DB (carried as .device/s21_all.db), in both regimes: do_bench (its
# L2 flush hides up to its own length of a call's host path) and 200 back-to-back calls (what
# fa4.auto's rule charges: the slower of a provider's cold and warm rows), then mask_bits' second
# timing run (bench/device_s23.sh t 2).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s23b
device_env "$work/env.log"
device_install
cp .device/s21_all.db /tmp/s21_all.db
head -1 bench/shapes/issue16_table.csv > /tmp/gpt2.csv
grep "^1024,64,16" bench/shapes/issue16_table.csv >> /tmp/gpt2.csv
for how in loop1 bench loop2; do
  extra=(); [[ $how == loop* ]] && extra=(--loop 200)
  TAILN=4 KEEP="auto chose|slower than" step "gpt2_$how" 150 python3 bench/auto_dispatch.py \
    --db sqlite:////tmp/s21_all.db --shapes /tmp/gpt2.csv "${extra[@]}"
done
trap - EXIT; tar -C "$work" -cf "$out/s23b.tar" .
OUT=$out bash bench/device_s23.sh t 2
