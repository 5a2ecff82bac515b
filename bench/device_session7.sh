#!/usr/bin/env bash
# Session 7's one GPU call after the kit (about 7 minutes): README command (1) (bench/device_main.sh);
# the tuner issue's deterministic backward study (issue 16 measured 3 of 12 trials there, 8
# infeasible); the final forward defaults of the new head dims timed beside the peers (no check:
# the check ran before the last default change); two real-model forward shapes (Llama-3-8B GQA 8k,
# chunked prefill Sq 2k / Sk 8k). Each tuning study is feasible-only with its winner re-measured.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/session}"
mkdir -p "$out"
timeout 220 bash bench/device_main.sh 2>/dev/null
db="sqlite:///$out/issue16.db"
echo "\$ fa4-tune --seqlen 8192 --hdim 128 --pass bwd --deterministic --trials 12"
timeout 110 fa4-tune --seqlen 8192 --hdim 128 --pass bwd --deterministic --trials 12 --db "$db" 2>"$out/det.err" | tee "$out/det.log"
echo "\$ python3 bench/check_fwd.py --quick --no-check --hds 192v128,256 --seqlens 8192"
timeout 100 python3 bench/check_fwd.py --quick --no-check --hds 192v128,256 --seqlens 8192 --out "$out/hdims.json" 2>"$out/hdims.err" | grep -E "^BENCH|^\|" | tee "$out/hdims.log"
echo "\$ fa4-tune --shapes bench/shapes/issue16_models.csv --trials 12"
timeout 150 fa4-tune --shapes bench/shapes/issue16_models.csv --trials 12 --db "$db" 2>"$out/models.err" | tee "$out/models.log"
