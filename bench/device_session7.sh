#!/usr/bin/env bash
# Session 7's one GPU call after the kit: README command (1) (bench/device_main.sh), then the tuner
# issue's checks: a deterministic backward study (issue 16 measured 3 of 12 trials there, 8
# infeasible) and three real-model shapes (Llama-3-8B GQA 8k fwd/bwd, chunked prefill Sq 2k / Sk 8k),
# each study feasible-only and its winner re-measured. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/session}"
mkdir -p "$out"
bash bench/device_main.sh 2>/dev/null
db="sqlite:///$out/issue16.db"
echo "\$ fa4-tune --seqlen 8192 --hdim 128 --pass bwd --deterministic --trials 12 --db ..."
timeout 150 fa4-tune --seqlen 8192 --hdim 128 --pass bwd --deterministic --trials 12 --db "$db" 2>"$out/det.err" | tee "$out/det.log"
echo "\$ fa4-tune --shapes bench/shapes/issue16_models.csv --trials 12 --db ..."
timeout 240 fa4-tune --shapes bench/shapes/issue16_models.csv --trials 12 --db "$db" 2>"$out/models.err" | tee "$out/models.log"
