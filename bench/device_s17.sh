#!/usr/bin/env bash
# Next session, after README command (1) (`bash bench/device_main.sh`):
#  the compact varlen grid (session 16, compile-checked only): its GPU tests first (correctness:
#  both launch orders, documents of 0 and 1 keys, seqused, GQA, all features, deterministic
#  bitwise), then against the padded grid and the reference, twice (prediction: varlen causal main
#  kernel +2-3%, i.e. 0.950 -> ~0.975 of the reference over the whole backward), and the
#  per-kernel split with it.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
# One call runs one phase (a call is capped at 600 s): `bash bench/device_s17.sh a|b|c`.
phase=${1:-a}
device_begin "s17$phase"
device_env "$work/env.log"
if [ "$phase" = a ]; then
TAILN=8 step compact_tests 280 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_varlen_bwd_gpu.py -k compact
TAILN=10 step host_floor1 90 bash -c "cd bench && python3 host_floor.py"
exit 0
fi
if [ "$phase" = b ]; then
for run in 1 2; do
  TAILN=8 step "compact_ab$run" 200 python3 bench/bwd_order.py --orders default --rounds 3 \
    --variants '[{"varlen_grid": "compact"}]' --shapes varlen-causal,varlen --out "$work/compact_ab$run.json"
done
TAILN=8 step compact_det 150 python3 bench/bwd_order.py --orders default --rounds 2 --det \
  --variants '[{"varlen_grid": "compact"}]' --shapes varlen-causal --out "$work/compact_det.json"
exit 0
fi
# Phase c. Issue 20's deterministic bar in one process: our deterministic against our non-deterministic.
TAILN=12 step det_ratio 240 python3 bench/det_ratio.py --rounds 3 --out "$work/det_ratio.json"
# Issue 20's weakest shape (GPT-2 1k hd64: main kernel 0.922 of the reference's, session 16's split):
# is it a knob setting? A backward study.
device_install
TAILN=12 step gpt2_tune 200 fa4-tune --pass bwd --batch 16 --seqlen 1024 --heads 12 --hdim 64 --causal \
  --trials 16 --budget-s 150 --verify-rounds 3 --db "sqlite:///$work/gpt2.db"
# Issue 20's host cost: the call split against PyTorch's own autograd floor (second run).
TAILN=10 step host_floor2 90 bash -c "cd bench && python3 host_floor.py"
