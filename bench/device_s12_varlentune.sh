#!/usr/bin/env bash
# Session 11/12, helper varlenprov (issue 18: the tuner measures and tunes packed varlen problems), on
# the H200, about 4 minutes.
#  1. tests/tuner/test_varlen_provider_gpu.py: harness.measure of packed problems (the fp32 reference
#     per document, every document checked) with fa4 (causal, GQA + sliding window; fwd and bwd;
#     default and non-default configs) and the reference FA4 (the feature's CPU tests,
#     tests/tuner/test_varlen_tuning.py, are CI's: they fake the launch and the GPU).
#  2. fa4-tune on issue 18's varlen shape (8 documents, longest 4096, mean 2048, H16, hd128, causal)
#     --pass fwd and --pass bwd, 10 trials each (bounded by --budget-s), into a temp DB: the output's
#     default / best / speedup lines.
#  3. bench/bench_varlen_providers.py: each provider's make_fwd / make_fwd_bwd (what the tuner times)
#     at that shape (causal), default configs, do_bench median, TFLOP/s over the documents,
#     fa4/ref (ref ms / fa4 ms), and one harness.measure per row.
# Everything lands in $OUT/s12_varlentune.tar (env.log, tests.log, tune_fwd.log, tune_bwd.log,
# tune.db, bench.log, bench.json).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s12_varlentune

device_env "$work/env.log"

workers=""
python3 -c "import xdist" 2>/dev/null && workers="-n 6"
echo "\$ python3 -m pytest -q -x $workers tests/tuner/test_varlen_provider_gpu.py" | tee "$work/tests.log"
t=$SECONDS
timeout 75 python3 -m pytest -q -x $workers -p no:cacheprovider -rfs tests/tuner/test_varlen_provider_gpu.py 2>&1 \
  | tee -a "$work/tests.log"
echo "[tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]" | tee -a "$work/tests.log"

db="sqlite:///$work/tune.db"
shape=(--batch 8 --seqlen 4096 --hdim 128 --heads 16 --causal --varlen-mean 2048)
for pass_ in fwd bwd; do
  echo "\$ fa4-tune ${shape[*]} --pass $pass_ --trials 10 --budget-s 40 --verify-rounds 3" | tee "$work/tune_$pass_.log"
  t=$SECONDS
  timeout 60 python3 -m tuner.cli "${shape[@]}" --pass "$pass_" --trials 10 --budget-s 40 --verify-rounds 3 \
    --db "$db" --storage "$work/tune.journal" 2>&1 | tee -a "$work/tune_$pass_.log"
  echo "[tune $pass_ rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]" | tee -a "$work/tune_$pass_.log"
done

echo "\$ python3 bench/bench_varlen_providers.py --out bench.json" | tee "$work/bench.log"
t=$SECONDS
timeout 60 python3 bench/bench_varlen_providers.py --out "$work/bench.json" 2>&1 | tee -a "$work/bench.log"
echo "[bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s]" | tee -a "$work/bench.log"
