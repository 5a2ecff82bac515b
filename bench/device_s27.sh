#!/usr/bin/env bash
# Session 27, after README command (1) (`bash bench/device_main.sh`). One phase a call:
#  t: the backward's wide-head tiling (qm_tile_n, fa4.sm90.bwd_qm): its GPU tests against fp32 autograd
#     (tests/fa4/test_bwd_qm_gpu.py; session 27: 136 passed).
#  v: (for the next session) the tiling's varlen GPU tests (tests/fa4/test_varlen_bwd_gpu.py -k qm_tiling),
#     not yet run; hd192's varlen default waits for them.
#  r [N]: the tiling against the default and the reference (bench/bwd_order.py --variants), causal and
#     not, hd192, hd192/128, hd256 S8k; and hd256's new default (dk_before_dq) against the old one
#     non-causal. Prediction: hd192 causal 0.89 -> 0.95+ of the reference (the reference's own tiling;
#     the step moves from shared-memory bound to tensor bound); hd256 at 48 keys below the exchange.
#     Session 27 ran `r 1` before hd192's default became the tiling; since then "default" is the tiling
#     at hd192, and the last variant is the 64-key split it replaced (default_config(queries_on_m=False)).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-t}
device_begin "s27$phase${2:-}"
device_env "$work/env.log"
device_install
QM='[{"qm_tile_n": 96, "stages": 2, "do_single": true, "ds_stages": 1},
 {"qm_tile_n": 96, "stages": 2, "do_single": false, "ds_stages": 1},
 {"qm_tile_n": 96, "stages": 2, "do_single": true, "ds_stages": 1, "dk_before_dq": true},
 {"qm_tile_n": 48, "cluster_exchange": false, "stages": 2, "do_single": true, "ds_stages": 1, "dq_accum": "bulk",
  "ds_store": "sts", "dk_before_dq": false},
 {"dk_before_dq": false},
 {"qm_tile_n": 0, "do_single": false, "dk_before_dq": false, "stages": 2, "ds_stages": 2}]'
case "$phase" in
  t)
    TAILN=30 KEEP="passed|failed|FAILED|Error|error" step qm_tests 420 python3 -m pytest -q -n 15 -p no:cacheprovider \
      --maxfail=10 tests/fa4/test_bwd_qm_gpu.py ;;
  v)
    TAILN=20 KEEP="passed|failed|FAILED|Error|error" step qm_varlen 300 python3 -m pytest -q -n 15 -p no:cacheprovider \
      tests/fa4/test_varlen_bwd_gpu.py -k qm_tiling ;;
  r)
    TAILN=16 step "qm_order${2:-}" 560 python3 bench/bwd_order.py --orders default --rounds 2 \
      --shapes "${SHAPES:-hd192-8k,hd192v128-8k,hd256-8k,hd192-8k-noncausal,hd192v128-8k-noncausal,hd256-8k-noncausal}" --variants "$QM" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
