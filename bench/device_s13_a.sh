#!/usr/bin/env bash
# Next session, after README command (1) (issue 18's window and varlen backward bars, issue 20's
# Sq = Sk gap: the hd128 backward mainloop sits at ~0.95 of the reference at every masked shape):
#  1. Nsight Compute, ours next to the reference (bench/ncu_bwd.sh): hd128 causal S8k and the
#     window (1023, 0) S16k; the top stalls of both main kernels (bench/ncu_stalls.py) printed;
#  2. the window and varlen backward bars again (bench/bwd_order.py --orders default, 2 rounds);
#  3. bench/bench_gqa_loop.py at the hd64 GQA shapes: the deterministic default is 'loop' at tile
#     128 since session 12 (its third run).
# Text pages under $OUT/ncu (the .ncu-rep files are dropped: too large to come back).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s13_a
device_env "$work/env.log"
export OUT_NCU="$work/ncu"
mkdir -p "$OUT_NCU"
SPECS="128:--causal 128:--seqlen=16384,--window=1023,0" OUT="$OUT_NCU" timeout 420 bash bench/ncu_bwd.sh \
  > "$work/ncu.log" 2>&1
echo "[ncu rc=$?]"; grep -E "rc=|Duration|Registers Per" "$work/ncu.log" | head -40
for f in "$OUT_NCU"/*.source.csv; do
  for kern in FlashBwdSm90 FlashAttentionBackwardSm90; do
    echo "== $(basename "$f") $kern"; python3 bench/ncu_stalls.py "$f" "$kern" --top 12 2>&1 | tail -14
  done
done | tee "$work/stalls.log"
rm -f "$OUT_NCU"/*.ncu-rep "$OUT_NCU"/*.raw.csv
[ "${SKIP_BARS:-0}" = 1 ] || TAILN=12 step bars 150 python3 bench/bwd_order.py --orders default --rounds 2 \
  --shapes varlen-causal,window
[ "${SKIP_LOOP:-0}" = 1 ] || TAILN=8 step loop 150 python3 bench/bench_gqa_loop.py \
  --shapes llama3.2-1b-8k,llama3.2-1b-4k-b2 --out "$work/loop.json"
