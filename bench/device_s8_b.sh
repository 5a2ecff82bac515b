#!/usr/bin/env bash
# Session 8, second GPU call (< 10 minutes; needs the kit unpacked by the call before): issue 16's
# runs. A transformers Llama training step recorded with fa4.record_shapes and its shapes tuned;
# the per-shape table over seven real-model shapes, forward and backward; a fresh re-measurement of
# what is served; one study under CUDA-graph replay; hd96's final forward default re-timed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/session}"
mkdir -p "$out"
run() {
  local name=$1 limit=$2; shift 2
  echo "\$ $*"; local t=$SECONDS
  timeout "$limit" "$@" > >(tee "$out/$name.log") 2>"$out/$name.err"
  echo "rc=$? wall=$((SECONDS - t))s"
}
db="sqlite:///$out/table.db"
run llama_step 90 python3 bench/llama_step.py --out "$out/llama_shapes.json"
run llama_tune 110 fa4-tune --shapes "$out/llama_shapes.json" --trials 8 --verify-rounds 5 --budget-s 80 --db "$db" --json
run table 330 fa4-tune --shapes bench/shapes/issue16_table.csv --trials 8 --verify-rounds 5 --budget-s 280 --db "$db" --json
python3 bench/tuning_table.py "$out/llama_tune.log" "$out/table.log" | tee "$out/table.md"
run remeasure 60 python3 bench/remeasure_served.py --db "$db" --rounds 5
run graph 60 fa4-tune --seqlen 128 --seqlen-k 8192 --batch 8 --heads 32 --heads-kv 8 --hdim 128 --causal --trials 5 --verify-rounds 3 --launch graph --db "$db"
run hd96 50 python3 bench/check_fwd.py --quick --no-check --hds 96 --seqlens 8192
