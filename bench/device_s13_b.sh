#!/usr/bin/env bash
# Session 13, the warp-uniform WGMMA descriptors of the backward's consumers (fa4.common.mma.wg_slices:
# the shared-memory operand fragments sliced at the warpgroup's first thread; ncu had 51M R2UR in our
# hd128 causal main kernel against the reference's 0.04M, and 13% more instructions in all).
#   MODE=tests: the backward GPU tests (every knob, the exchange, features, 'loop', varlen);
#   MODE=time:  bench/bwd_order.py --orders default at issue 18's and 20's shapes and hd256 (ours
#               against the reference in one process), then the same at four shapes with the fa4 of
#               another commit (a copy of its fa4/ carried under .device/base:
#               `mkdir -p .device/base && git archive COMMIT fa4 | tar -x -C .device/base`), then
#               the deterministic defaults at the hd64 and hd128 GQA shapes.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin "s13_b_${MODE:-time}"
device_env "$work/env.log"
if [ "${MODE:-time}" = tests ]; then
  TAILN=6 step tests "${TESTS_S:-330}" python3 -m pytest -q -n 15 -p no:cacheprovider -x \
    tests/fa4/test_bwd_gpu.py tests/fa4/test_bwd_cluster_gpu.py tests/fa4/test_bwd_feat_gpu.py \
    tests/fa4/test_bwd_gqa_loop_gpu.py tests/fa4/test_varlen_bwd_gpu.py
  exit 0
fi
SHAPES=${SHAPES:-varlen-causal,window,causal-8k,noncausal-8k,llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,sq128-sk8k,llama3.2-1b-8k,gpt2-1k,hd256-8k}
TAILN=16 step new 260 python3 bench/bwd_order.py --orders default --rounds 2 --shapes "$SHAPES" --out "$work/new.json"
if [ -d .device/base/fa4 ]; then
  # The base copy goes first on the kit's path (the reference FA4 lives on it too); -P: not the
  # working directory's fa4 ahead of it (a script's own folder, bench/, is first there instead).
  base_path="$PWD/.device/base:$PYTHONPATH"
  PYTHONPATH="$base_path" python3 -P -c "import fa4; print('base fa4 from', fa4.__file__)"
  PYTHONPATH="$base_path" TAILN=8 step base 120 python3 bench/bwd_order.py --orders default \
    --rounds 2 --shapes "${BASE_SHAPES:-varlen-causal,window,causal-8k,llama3-8b-8k}" --out "$work/base.json"
fi
TAILN=6 step det 100 python3 bench/bwd_order.py --orders default --rounds 2 --det \
  --shapes llama3.2-1b-8k,llama3-8b-8k --out "$work/det.json"
