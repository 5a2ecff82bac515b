#!/usr/bin/env bash
# Session 18, after README command (1) (`bash bench/device_main.sh`). One phase a call (600 s cap):
#  p: the preprocess change (below); q: second samples of p's figures;
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
if [ "$phase" = p ]; then
  # The preprocess's loads in groups of 8 passes (SASS test in tests/fa4/test_bwd_compile.py):
  # correctness (head dims, the LSE gradient, rows that see no key, varlen lengths 0 and 1,
  # seqused), then the kernel split: prediction 74 -> ~69 us at hd128 S8k B2 H16 (the reference's).
  TAILN=8 step pre_tests 200 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
    tests/fa4/test_bwd_feat_gpu.py tests/fa4/test_varlen_bwd_gpu.py \
    -k "grads_match_reference or lse_gradient or see_no_key or lengths_0_and_1 or issue_mix or seqused or other_head_dims"
  TAILN=12 step pre_split 120 python3 bench/kernel_split.py --shapes causal-8k,llama3-8b-8k,varlen-causal --calls 10
  # Varlen's padded grid walks (sequence, group of head_swizzle heads, key tile): half its CTAs
  # (key tiles past a document's end) exit at once but hold an SM slot each, spread through the
  # launch. Larger groups walk key tile n of more documents together, so the empty ones gather
  # toward the end of the launch. Prediction: 0:16 / 0:32 +1-2% over the default's 0:4.
  TAILN=12 step varlen_swz 150 python3 bench/bwd_order.py --orders default,0:8,0:16,0:32 --rounds 3 \
    --shapes varlen-causal --out "$work/varlen_swz.json"
  exit 0
fi
if [ "$phase" = q ]; then
  # Second samples: the preprocess split (dense), and varlen/window with the new varlen default.
  TAILN=12 step pre_split2 70 python3 bench/kernel_split.py --shapes causal-8k,llama3-8b-8k --calls 10
  TAILN=6 step feat_default 90 python3 bench/bwd_order.py --orders default --rounds 3 --shapes varlen-causal,window
  exit 0
fi
if [ "$phase" = a ]; then
  for run in 1 2; do
    TAILN=8 step "bwd_feat$run" 200 python3 bench/bwd_order.py --orders default --rounds 4 \
      --shapes varlen-causal,window --out "$work/bwd_feat$run.json"
  done
  exit 0
fi
device_install
if [ "$phase" = b ]; then
  rm -f "$db"
  TAILN=30 KEEP="rc=|^\\$|error|Error" step auto_measure 420 python3 bench/auto_dispatch.py --db "sqlite:///$db" --measure
  cp "$db" "$work/"
  exit 0
fi
TAILN=40 step auto_time 240 python3 bench/auto_dispatch.py --db "sqlite:///$db"
TAILN=10 step host_floor 90 bash -c "cd bench && python3 host_floor.py"
