#!/usr/bin/env bash
# Session 9, helper bwdfeat (issue 18, backward): sliding window, softcap, learnable sinks and the
# LSE's gradient in our Hopper backward, on the H200 (about 6 minutes).
#  1. tests/fa4/test_bwd_feat_gpu.py: each feature alone and combined against fp32 autograd
#     (FlashAttention's error rule), GQA, fp16, Sq != Sk, rows that see no key, deterministic
#     bitwise over 10 runs (the window's dQ turns). Spread over 12 pytest workers when xdist is
#     there (the time is the kernels' compiles).
#  2. bench/check_bwd_feat.py: the backward alone, ours (launch_bwd) vs the reference FA4's
#     (_flash_attn_bwd, what its autograd backward calls) on the same saved out/lse from the
#     reference's forward, do_bench median, TFLOP/s over the unmasked region x 2.5: window (1023, 0)
#     S=16384 B=1 H=16 hd128; softcap 30, sink and plain causal at S=8192 B=2 H=16 hd128 causal.
#     Issue 18's bar: ours/ref >= 0.95 each.
# Everything lands in $OUT/s9_bwdfeat.tar (env.log, tests.log, bench.log, bench.json).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s9_bwdfeat}"
mkdir -p "$out"
work=$(mktemp -d)
finish() { tar -C "$work" -cf "$out/s9_bwdfeat.tar" . ; echo "wrote $out/s9_bwdfeat.tar"; }
trap finish EXIT

python3 -c "import torch, cutlass; print('device:', torch.cuda.get_device_name(), 'torch', torch.__version__); \
import fa4, flash_attn.cute as r; print('fa4 from', fa4.__file__, '| reference from', r.__file__)" 2>&1 | tee "$work/env.log"
git log --oneline -3 2>/dev/null | tee -a "$work/env.log"

workers=""
python3 -c "import xdist" 2>/dev/null && workers="-n 12"
echo "\$ python3 -m pytest -q -x $workers tests/fa4/test_bwd_feat_gpu.py"
t=$SECONDS
timeout 230 python3 -m pytest -q -x $workers -p no:cacheprovider tests/fa4/test_bwd_feat_gpu.py 2>&1 | tee "$work/tests.log"
echo "[tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]" | tee -a "$work/tests.log"

echo "\$ python3 bench/check_bwd_feat.py --out bench.json"
t=$SECONDS
timeout 150 python3 bench/check_bwd_feat.py --out "$work/bench.json" 2>&1 | tee "$work/bench.log"
echo "[bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]" | tee -a "$work/bench.log"
