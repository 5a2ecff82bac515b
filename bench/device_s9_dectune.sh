#!/usr/bin/env bash
# Session 9, helper "dectune" (issue 19's tuner side): the fa4-decode provider's GPU tests, then
# fa4-tune --decode at batch 1 and 4 x KV 8k and 32k (pages of 256, GQA 32/8, hd128, bf16, 12 trials
# each, one measuring process, 150 s budget for the trials) into a temp DB, then bench/decode_tuned.py:
# flash_attn_with_kvcache with the config the lookup serves from that DB vs the heuristic (and the
# reference FA4), one process. Writes ONE file under $OUT: dectune.log. Wall: ~3.5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s9_dectune}"
mkdir -p "$out"
log="$out/dectune.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
tmp=$(mktemp -d)
db="sqlite:///$tmp/decode.db"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > "$log" 2>&1
python3 -c "from fa4.fingerprint import source_fingerprint as f; print('kernel source', f())" >> "$log" 2>&1
t=$SECONDS
echo "== GPU tests" >> "$log"
timeout 45 python3 -m pytest -q -x -p no:cacheprovider tests/tuner/test_decode_provider_gpu.py 2>&1 | tail -30 | tee -a "$log"
echo "tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$log"
t=$SECONDS
echo "== fa4-tune --decode" >> "$log"
timeout 200 python3 -m tuner.cli --decode --batch 1,4 --seqlen-k 8192,32768 --heads 32 --heads-kv 8 --hdim 128 \
  --page-size 256 --trials 12 --verify-rounds 5 --budget-s 150 --db "$db" --storage "$tmp/optuna.journal" 2>&1 \
  | tail -60 | tee -a "$log"
echo "tune rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$log"
t=$SECONDS
echo "== served vs heuristic" >> "$log"
timeout 60 python3 bench/decode_tuned.py --db "$db" --rounds 5 2>&1 | tee -a "$log"
echo "bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$log"
python3 - "$tmp/decode.db" >> "$log" 2>&1 <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print("== measurements (status, count)", c.execute("select status, count(*) from measurements group by status").fetchall())
for r in c.execute("select p.batch, p.seqlen_k, v.significant, round(v.gain, 4), round(v.spread, 4) from verdicts v "
                   "join problems p on p.id = v.problem_id"):
    print("verdict", r)
PY
