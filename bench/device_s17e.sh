#!/usr/bin/env bash
# Session 17, third device round: issue 20's provider="auto" bar on the 10 problems of
# bench/shapes/issue16_table.csv (one run): each provider's default measured into a fresh DB
# (fa4-tune --trials 1, both L2 modes, correctness-gated), then auto against every provider in
# one process (bench/auto_dispatch.py). Since session 1's run, fa4.auto charges each provider's
# host cost per call (the miss then: the reference chosen for the hd64 B16 fwd+bwd at 1.47x).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s17e
device_env "$work/env.log"
device_install
TAILN=30 KEEP="rc=|^\\$|error|Error" step auto_measure 330 python3 bench/auto_dispatch.py --db "sqlite:///$work/auto.db" --measure
TAILN=40 step auto_time 180 python3 bench/auto_dispatch.py --db "sqlite:///$work/auto.db"
