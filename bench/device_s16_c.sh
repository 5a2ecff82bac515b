#!/usr/bin/env bash
# Session 16, GPU start 3 (last device minutes): where the packed-varlen backward's time goes against
# the reference (bench/kernel_split.py, the dense causal 8k as the control), then a varlen backward
# study (issue 18's varlen bar: six runs give ours/ref 0.935-1.006, median 0.950).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s16_c
device_env "$work/env.log"
TAILN=40 KEEP="us|TFLOP|config|rc=" step split 120 python3 bench/kernel_split.py --shapes varlen-causal,causal-8k \
  --out "$work/split.json"
device_install
TAILN=14 step tune 220 fa4-tune --pass bwd --batch 8 --seqlen 4096 --hdim 128 --heads 16 --causal \
  --varlen-mean 2048 --trials 16 --budget-s 150 --verify-rounds 3 --db "sqlite:///$work/varlen.db"
