#!/usr/bin/env bash
# Session 22 (prepared in session 21), after README command (1) (`bash bench/device_main.sh`).
# Session 21's branch mask-bits (check it out before the call: the device runs the working tree)
# masks the forward's right edge (causal diagonal, seqlen_k residue) and the backward's causal
# prefix with one 32-bit mask per 32 elements (R2P) instead of an ISETP per element: compiled on
# the CPU, causal hd64/hd128 forward 148 -> 28 ISETP, backward hd64 116 -> 57; codegen suites clean.
# Never run on a GPU. One phase a call (600 s cap):
#  v: correctness on the GPU (fp32 reference, the error rule): forward and backward grids, the
#     features whose masks changed path (causal, window right, seqlen residue, rows that see no
#     key), varlen, deterministic bitwise. Merge only when every one passes.
#  t 1, t 2: timing, the branch against main (a worktree of main beside it, run by PYTHONPATH) in
#     alternating processes, each ours/reference in one process: forward GPT-2 1k hd64 and causal
#     hd128 S4k / S8k (bench_fwd), backward gpt2-1k, qwen, llama3-8b, causal-8k, window (bwd_order).
#     Prediction: forward GPT-2 +2-4% (a masked tile is 1 of ~4.5 a CTA there and ~12% cheaper),
#     S8k causal +0-0.5%; backward GPT-2 +1-3%, the 8k shapes within noise.
#  m, n: issue 20's auto bar on all ten rows (as bench/device_s21.sh m, n; session 21 lost them to
#     a machine taken back mid-call).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-v}
device_begin "s22$phase"
device_env "$work/env.log"
device_install
case "$phase" in
  v)
    TAILN=6 step fwd_tests 240 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_fwd_gpu.py \
      tests/fa4/test_fwd_features_gpu.py tests/fa4/test_varlen_gpu.py
    TAILN=6 step bwd_tests 300 python3 -m pytest -q -n 15 -p no:cacheprovider tests/fa4/test_bwd_gpu.py \
      tests/fa4/test_bwd_feat_gpu.py -k "match_reference or deterministic_bitwise or window or rows_that or all_combined" ;;
  t)
    main_tree=/tmp/main_tree
    git worktree add -f "$main_tree" main >/dev/null 2>&1 || { echo "no worktree of main"; exit 1; }
    run=${2:-1}  # t 1, then t 2: each ~500 s
    for side in branch main; do
      root=$PWD; [ "$side" = main ] && root=$main_tree
      TAILN=8 step "fwd_${side}$run" 150 env PYTHONPATH="$root" python3 "$root/bench/bench_fwd.py" \
        --providers fa4,flash-attn-4 --seqlens 1024,4096,8192 --hdims 64,128 --causal yes
      TAILN=10 step "bwd_${side}$run" 200 env PYTHONPATH="$root" python3 "$root/bench/bwd_order.py" --orders default \
        --rounds 2 --shapes gpt2-1k,qwen2.5-7b-4k,llama3-8b-8k,causal-8k,window
    done ;;
  m|n) bash bench/device_s21.sh "$phase" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
