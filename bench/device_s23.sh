#!/usr/bin/env bash
# Session 23 (prepared in session 22, which had no device time), after README command (1)
# (`bash bench/device_main.sh`). The knob mask_bits (forward and backward, off by default;
# fa4.common.masking): a masked tile's verdicts per row as 32-bit words tested bit by bit (R2P)
# instead of one ISETP per element. Compiled on the CPU: causal forward hd64/hd128 150 -> 26 ISETP,
# windowed 414 -> 36; backward causal hd64 116 -> 56, hd128 84 -> 54; no spills; the default
# kernels' SASS unchanged. Never run on a GPU. One phase a call (600 s cap):
#  v: correctness on the GPU (fp32 reference, the error rule): the mask_bits cases of the forward
#     and backward feature suites (causal, every window, Sq != Sk both ways, GQA/MQA, rows that
#     see no key, wide head dims, deterministic bitwise). Turn the default on only when all pass.
#  t 1, t 2: timing, default against mask_bits in one process, twice each (alternating configs):
#     forward causal hd64 S1k, hd128 S4k / S8k (knob_effects); backward gpt2-1k, qwen, llama3-8b,
#     causal-8k, window (bwd_order). Prediction: forward S1k hd64 +2-4% (a masked tile is 1 of ~4.5
#     a CTA there, ~12% cheaper with the words), S8k causal +0-0.5%; backward gpt2-1k +1-3%, the 8k
#     shapes within noise.
#  m, n: issue 20's auto bar on all ten rows (as bench/device_s21.sh m, n; session 21 lost them to
#     a machine taken back mid-call).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-v}
device_begin "s23$phase"
device_env "$work/env.log"
device_install
case "$phase" in
  v)
    TAILN=6 step fwd_tests 240 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_fwd_features_gpu.py \
      -k mask_bits
    TAILN=6 step bwd_tests 300 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_bwd_feat_gpu.py \
      -k mask_bits ;;
  t)
    run=${2:-1}
    TAILN=12 step "fwd_mask_bits$run" 200 python3 bench/knob_effects.py --shapes 1024:64:1,4096:128:1,8192:128:1 \
      --variants '[{}, {"mask_bits": true}, {}, {"mask_bits": true}]'
    TAILN=12 step "bwd_mask_bits$run" 300 python3 bench/bwd_order.py --orders default --rounds 2 \
      --variants '[{"mask_bits": true}]' --shapes gpt2-1k,qwen2.5-7b-4k,llama3-8b-8k,causal-8k,window ;;
  m|n) bash bench/device_s21.sh "$phase" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
