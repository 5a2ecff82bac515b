#!/usr/bin/env bash
# Session 25, after README command (1) (`bash bench/device_main.sh`). Where issues 17 and 20 stand
# on today's main (the forward defaults of session 24 in), before the next backward change. One phase a call:
#  m: issue 20's bars: host cost (bench/host_floor.py twice, the peers with bench/host_cost.py),
#     the backward against the reference on the chosen shapes (bwd_order.py, 3 rounds), the
#     deterministic backward against the reference's, and det / our non-det (det_ratio.py).
#  h: issue 17's head dims, backward against the reference (bwd_order.py), and Nsight Compute on
#     the hd256 causal backward (ours with the exchange, the reference's 64x48 tile): where its step goes.
#  t: backward studies at issue 17's hd192 and hd192/128 (causal S8k B2 H10, the bwd_order shapes; the
#     first at these head dims), then the served config against the reference in one process
#     (bwd_order.py --served). Prediction: within 2% of the default (sessions 12-16: the hd128 and
#     varlen gaps were no knob setting; exp_pin gave hd192 0-1.7%).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-m}
device_begin "s25$phase${2:-}"
device_env "$work/env.log"
device_install
SET=llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,sq128-sk8k,llama3.2-1b-8k,gpt2-1k
case "$phase" in
  m)
    for i in 1 2; do
      TAILN=12 step "host_floor$i" 120 bash -c "cd bench && python3 host_floor.py"
    done
    TAILN=8 step host_cost 150 python3 bench/host_cost.py --providers fa4,flash-attn-4,cudnn
    TAILN=14 step bwd 300 python3 bench/bwd_order.py --orders default --rounds 3 --shapes "$SET"
    TAILN=14 step bwd_det 200 python3 bench/bwd_order.py --orders default --rounds 2 --det --shapes "$SET" ;;
  d)
    TAILN=14 step det_ratio 300 python3 bench/det_ratio.py --rounds 3 ;;
  h)
    TAILN=10 step bwd_hdims 300 python3 bench/bwd_order.py --orders default --rounds 2 \
      --shapes hd96-8k,hd192-8k,hd192v128-8k,hd256-8k
    OUT=$out SPECS="256:--causal" TAILN=40 step ncu256 280 bash bench/ncu_bwd.sh ;;
  t)
    db="sqlite:///$PWD/.device/s25t.db"
    TAILN=9 step tune192 260 fa4-tune --pass bwd --batch 2 --seqlen 8192 --heads 10 --hdim 192 --causal \
      --trials 14 --budget-s 170 --verify-rounds 3 --db "$db"
    TAILN=9 step tune192v128 260 fa4-tune --pass bwd --batch 2 --seqlen 8192 --heads 10 --hdim 192 --hdim-v 128 \
      --causal --trials 14 --budget-s 170 --verify-rounds 3 --db "$db"
    TAILN=8 step served 200 python3 bench/bwd_order.py --orders default --rounds 3 --served "$db" \
      --shapes hd192-8k,hd192v128-8k
    cp .device/s25t.db "$out/" ;;
  sw)  # hd64 causal head_swizzle 8 past 2k keys (session 24: +2-3% at 4k and 8k, one run each), twice
    # more; prediction +2-3% at 4k/8k, smaller at 16k (a head's K/V outgrows what 8 heads keep in L2).
    for r in 1 2; do
      TAILN=12 KEEP="EFFECT|SKIP|INCORRECT|FAILED|rc=" step "swizzle$r" 240 python3 bench/knob_effects.py --check \
        --rounds 3 --peers cudnn --shapes 4096:64:1,8192:64:1,16384:64:1 --variants '[{}, {"head_swizzle": 8}, {"head_swizzle": 4}]'
    done ;;
  v)  # (prepared; not run in session 25: no machine was lent after the change) the new causal
      # head_swizzle default (swizzle_fits_l2) against the old (1), Llama-3-8B's GQA 8k included; the
    # hd128 forward GPU cases (head_swizzle is a runtime knob: the same kernels, another launch order).
    TAILN=12 KEEP="EFFECT|SKIP|INCORRECT|FAILED|rc=" step swz_default 150 python3 bench/knob_effects.py --check \
      --rounds 3 --shapes 8192:128:1:1:32:8,8192:128:1:1:32,4096:128:1,8192:64:1 --variants '[{}, {"head_swizzle": 1}]'
    TAILN=6 KEEP="passed|failed|FAILED" step fwd_tests 150 python3 -m pytest -q -n 15 -p no:cacheprovider \
      tests/fa4/test_fwd_gpu.py -k "128-128" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
