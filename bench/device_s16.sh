#!/usr/bin/env bash
# Session 16, GPU start 2 (the first ran README command (1), the exp_pin A/B and the session-14 suites):
#  - the varlen torch.compile test after the symbolic-softcap fix (failed at start 1 on torch 2.11);
#  - issue 18's varlen and window backward against the reference, 4 rounds each (start 1: varlen 1.006,
#    sessions 14: 0.935-0.948; the reference's own times moved 8% within the run);
#  - the forward's exp_pin at hd192/256 a second time (start 1: +1.5% / +0.4% non-causal);
#  - the host cost twice more (start 1: fa4 forward 23.4 and 17.8 us in two runs).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s16_b
device_env "$work/env.log"
TAILN=6 step varlen_compile 200 python3 -m pytest -q -p no:cacheprovider tests/fa4/test_varlen_bwd_gpu.py -k compile
TAILN=6 step varlen_ab 200 python3 bench/bwd_order.py --orders default --rounds 4 --shapes varlen-causal,window \
  --out "$work/varlen_ab.json"
TAILN=10 step fwdab2 150 python3 bench/check_fwd.py --no-check --hds 192,256 --variants '[{"exp_pin": true}]' \
  --out "$work/fwdab2.json"
for run in 3 4; do
  TAILN=5 step "host$run" 60 python3 bench/host_cost.py --providers fa4,flash-attn-4,cudnn
done
