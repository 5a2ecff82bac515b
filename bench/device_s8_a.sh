#!/usr/bin/env bash
# Session 8, first GPU call after the kit (< 10 minutes): README command (1) (bench/device_main.sh),
# then the demo's sources re-measured with today's kernels (issue 15): the fa4 tuning studies at
# S=8192 hd 64/128 into a fresh results DB, bench_fwd.py's side-by-side forward table, check_fwd.py
# and check_bwd.py at S=8192. Every log names the kernel source fingerprint it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/session}"
mkdir -p "$out"
timeout 200 bash bench/device_main.sh 2>/dev/null
cp "$HOME/.local/share/fa4-tune/results.db" "$out/main.db" 2>/dev/null
run() {  # name timeout command...: stdout to $out/name.log (and shown), stderr to $out/name.err
  local name=$1 limit=$2; shift 2
  echo "\$ $*"; local t=$SECONDS
  timeout "$limit" "$@" > >(tee "$out/$name.log") 2>"$out/$name.err"
  echo "rc=$? wall=$((SECONDS - t))s"
}
demo="sqlite:///$out/demo.sqlite"
run demo_studies 150 fa4-tune --seqlen 8192 --hdim 64,128 --trials 14 --db "$demo"
run check_fwd 100 python3 bench/check_fwd.py --quick --seqlens 8192
run check_bwd 80 python3 bench/check_bwd.py --no-check
run bench_fwd 120 python3 bench/bench_fwd.py --seqlens 1024,4096,8192,16384
