#!/usr/bin/env bash
# Session 10, helper varlenbwd (issue 18, the packed varlen backward), on the H200 (under 4 minutes).
#  1. tests/fa4/test_varlen_bwd_gpu.py: the varlen backward against fp32 autograd per sequence
#     (the backward error rule of test_bwd_feat_gpu.py, rounded_out_grads included): the issue's mix
#     (8 docs 512-4096, 16k, H16, hd128, causal), lengths 0 and 1 in a batch, GQA 4:1, fp16,
#     window+softcap+sink+dLSE, seqused, deterministic bitwise over 10 runs, autograd end to end,
#     hd 96/192/256, the transformers packed path's grads vs per-document dense grads; and
#     tests/fa4/test_varlen_gpu.py (the varlen forward). Spread over pytest workers when xdist is
#     there (the time is the kernels' compiles).
#  2. bench/bench_varlen.py: ours vs flash_attn.cute.flash_attn_varlen_func at the issue's shape,
#     bf16, causal and not: forward, backward alone (same saved out/lse), forward + backward;
#     TFLOP/s over the unmasked region (bwd x 2.5), ours/ref. Issue 18's bar: >= 0.95.
# Everything lands in $OUT/s10_varlenbwd.tar (env.log, tests.log, bench.log, bench.json).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s10_varlenbwd}"
mkdir -p "$out"
work=$(mktemp -d)
finish() { tar -C "$work" -cf "$out/s10_varlenbwd.tar" . ; echo "wrote $out/s10_varlenbwd.tar"; }
trap finish EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FA4_LOOKUP_LOCAL_DB=0
unset FA4_TUNING_URL

python3 -c "import torch, cutlass; print('device:', torch.cuda.get_device_name(), 'torch', torch.__version__); \
import fa4, flash_attn.cute as r; print('fa4 from', fa4.__file__, '| reference from', r.__file__)" 2>&1 | tee "$work/env.log"
git log --oneline -3 2>/dev/null | tee -a "$work/env.log"

workers=""
python3 -c "import xdist" 2>/dev/null && workers="-n 12"
echo "\$ python3 -m pytest -q $workers tests/fa4/test_varlen_bwd_gpu.py tests/fa4/test_varlen_gpu.py" | tee "$work/tests.log"
t=$SECONDS
timeout 170 python3 -m pytest -q $workers -p no:cacheprovider -rf tests/fa4/test_varlen_bwd_gpu.py \
  tests/fa4/test_varlen_gpu.py 2>&1 | tee -a "$work/tests.log"
echo "[tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]" | tee -a "$work/tests.log"

echo "\$ python3 bench/bench_varlen.py --out bench.json" | tee "$work/bench.log"
t=$SECONDS
timeout 60 python3 bench/bench_varlen.py --out "$work/bench.json" 2>&1 | tee -a "$work/bench.log"
echo "[bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]" | tee -a "$work/bench.log"
