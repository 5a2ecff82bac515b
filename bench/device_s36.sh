#!/usr/bin/env bash
# Session 36. One phase a call (each is one full measurement run; call it twice for two runs):
#  m: issue 20 where it stands on this card: the five shapes ours (default) against the reference
#     (bench/bwd_order.py, two interleaved rounds), deterministic / non-deterministic at the same
#     shapes (bench/det_ratio.py, two rounds), and the host cost on the tiny problem
#     (bench/host_floor.py: PyTorch's floors, ours, cuDNN).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-m}
device_begin "s36$phase"
device_env "$work/env.log"
device_install
FIVE="llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k"
case "$phase" in
  m)
    TAILN=16 step five 300 python3 bench/bwd_order.py --orders default --rounds 2 --shapes "${SHAPES:-$FIVE}"
    TAILN=16 step det 200 python3 bench/det_ratio.py --rounds 2 --shapes "${SHAPES:-$FIVE}"
    (cd bench && TAILN=12 step host_floor 90 python3 host_floor.py) ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
