#!/usr/bin/env bash
# Next session, after README command (1) and `MODE=tests bash bench/device_s13_b.sh` (the backward GPU
# suite on the warp-uniform descriptors and the ds_early cases, not yet run on a GPU):
#  1. ds_early (the dS^T store ahead of the dV GEMM) against the default, in one process, with its
#     correctness gate: bench/check_bwd.py at S=8192, hd64 and hd128, causal and not, two runs;
#  2. the warp-uniform descriptors against the fa4 before them (2f46bf2), as device_s13_b.sh's
#     MODE=time does, when .device/base holds that copy
#     (`mkdir -p .device/base && git archive 2f46bf2 fa4 | tar -x -C .device/base`, carried).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s14_a
device_env "$work/env.log"
for run in 1 2; do
  TAILN=24 step "early$run" 200 python3 bench/check_bwd.py --hds 64,128 --no-ref-det \
    --check-variants-only --variants '[{"ds_early": true}]' --out "$work/early$run.json"
done
[ "${SKIP_AB:-0}" = 1 ] || MODE=time SHAPES=varlen-causal,window,causal-8k,llama3-8b-8k \
  BASE_SHAPES=varlen-causal,window,causal-8k,llama3-8b-8k bash bench/device_s13_b.sh
