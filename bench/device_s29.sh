#!/usr/bin/env bash
# Session 29: session 28's q_starts work and session 27's hd192 second run, packed for a session of
# ~24 device minutes left after two refused starts. One phase a call:
#  t: after README command (1) in the same call: the shifted query walks' GPU tests against fp32 autograd
#     (tests/fa4/test_bwd_q_starts_gpu.py and the varlen cases, -k shifted).
#  s, s2: runs 1 and 2 (one a call, or back to back in one) of q_starts 16 / 64 against the default and the reference at the three
#     shapes of the prediction (bench/device_s28.sh s): hd256 non-causal (+4-10%: issue 17's 1.054 ->
#     1.10), hd128 non-causal and causal Sq 2k / Sk 8k (+1-3%: issue 20's 0.968).
#  r: hd192's default (the queries-on-M tiling) against the reference, causal and not, hd192 and
#     hd192/128: the second run of session 27's `r 1` (0.989 / 1.003 / 1.020; non-causal 192/128 untimed).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-t}
device_begin "s29$phase"
device_env "$work/env.log"
device_install
STARTS='[{"q_starts": 16}, {"q_starts": 64}]'
three() {
  TAILN=12 step "q_starts$1" "$2" python3 bench/bwd_order.py --orders default --rounds 2 \
    --shapes hd256-8k-noncausal,noncausal-8k,sq2k-sk8k --variants "$STARTS"
}
case "$phase" in
  t)
    TAILN=8 KEEP="passed|failed|FAILED|Error|error" step q_starts_tests "${LIMIT:-330}" python3 -m pytest -q -n 15 \
      -p no:cacheprovider --maxfail=10 tests/fa4/test_bwd_q_starts_gpu.py tests/fa4/test_varlen_bwd_gpu.py \
      -k "shifted" ;;
  s) three 1 "${LIMIT:-270}" ;;  # run 1
  s2) three 2 "${LIMIT:-240}" ;;  # run 2 (the kernels compiled in run 1's process are compiled again)
  r)
    TAILN=10 step hd192_2 "${LIMIT:-280}" python3 bench/bwd_order.py --orders default --rounds 2 \
      --shapes hd192-8k,hd192v128-8k,hd192-8k-noncausal,hd192v128-8k-noncausal ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
