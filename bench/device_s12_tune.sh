#!/usr/bin/env bash
# Session 12 (issue 18): the tuner on the two backward bars that sit at 0.95 of the reference.
#  1. fa4-tune --pass bwd on the window shape (1023, 0), S16k, B1, H16, hd128 (budget 150 s of
#     trials, 3 verify rounds) into a temp DB: default / best / speedup and the best config.
#  2. bench/device_s12_varlentune.sh (the varlen provider's GPU tests, fa4-tune fwd/bwd on the
#     varlen shape, the providers' timings).
# One tar under $OUT: s12_tune.tar (and the varlen script's own s12_varlentune.tar).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s12_tune
TAILN=14 step window 230 python3 -m tuner.cli --pass bwd --seqlen 16384 --batch 1 --heads 16 --hdim 128 \
  --window 1023,0 --trials 24 --budget-s 150 --verify-rounds 3 --db "sqlite:///$work/tune.db" \
  --storage "$work/tune.journal"
[ "${SKIP_VARLEN:-0}" = 1 ] || bash bench/device_s12_varlentune.sh
