#!/usr/bin/env bash
# Session 30: what session 29 packed (bench/device_s29.sh t / s / s2 / r) plus one reading of the hd256
# non-causal gap that needs no new kernel. One phase a call:
#  w: hd256 non-causal, the default (one head a scheduling group) against 4 and 8 heads a group
#     (`--orders default,1:4,1:8`, the runtime knob head_swizzle: same kernel, no recompiles), two
#     interleaved rounds. Reading: in an unmasked walk every CTA of a head adds into the same dQ tile
#     at the same step; at hd256 a wave (~132 CTAs, 64 exchange pairs) is about one head, so one
#     head a group puts the whole wave on one 64 KB dQ region, 8 heads a group spreads it over 8.
#     head_swizzle 4/8 lost 1.5-2.5% at hd128 non-causal (L2 reuse of Q/dO, session 11), where a
#     wave spans two heads' key tiles already. Prediction: +2-6% at hd256 with 8 (the same effect
#     q_starts 16 aims at, by the launch order instead of the walk).
#  n: Nsight Compute of the hd256 non-causal backward beside the reference's (session 25 profiled it
#     causal): where our non-causal kernel, slower than our causal one in TFLOP/s (400 against 430),
#     waits; compare the dQ writers' reduce waits and L2 throughput with the causal profile.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-w}
device_begin "s30$phase"
device_env "$work/env.log"
device_install
case "$phase" in
  w)
    TAILN=8 step hd256_swizzle "${LIMIT:-200}" python3 bench/bwd_order.py --orders default,1:4,1:8 --rounds 2 \
      --shapes hd256-8k-noncausal ;;
  n)
    SPECS="256:" OUT="$out/ncu" timeout "${LIMIT:-300}" bash bench/ncu_bwd.sh ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
