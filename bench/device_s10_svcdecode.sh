#!/usr/bin/env bash
# Session 10, helper "svcdecode" (issue 19's decode configs in fleet mode): a tuning service
# (fa4-serve, empty DB, on loopback) takes the results of fa4-tune --decode --push (batch 1 and 4 x
# KV 8k and 32k, pages of 256, GQA 32/8, hd128, bf16, 10 trials each, 100 s budget), then
# bench/decode_tuned.py --service: flash_attn_with_kvcache with the config the launch-time lookup
# gets from GET /v1/configs/best-decode (local DB skipped) vs the heuristic and the reference FA4,
# one process. First the feature's tests (CPU tests: they run on the GPU host too). Writes ONE file
# under $OUT: svcdecode.log. Wall: ~4 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/s10_svcdecode}"
mkdir -p "$out"
log="$out/svcdecode.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
tmp=$(mktemp -d)
export FA4_API_TOKEN="svcdecode-$$"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > "$log" 2>&1
python3 -c "from fa4.fingerprint import source_fingerprint as f; print('kernel source', f())" >> "$log" 2>&1
t=$SECONDS
echo "== tests" >> "$log"
timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/service/test_decode_service.py \
  tests/service/test_lookup_decode.py 2>&1 | tail -15 | tee -a "$log"
echo "tests rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$log"
port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
url="http://127.0.0.1:$port"
python3 -m service.cli --db "sqlite:///$tmp/central.db" --host 127.0.0.1 --port "$port" --log-level warning \
  --no-access-log > "$tmp/serve.log" 2>&1 &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null' EXIT
for _ in $(seq 1 120); do
  python3 -c "import httpx, sys; sys.exit(httpx.get('$url/healthz', timeout=1).status_code != 200)" 2>/dev/null && break
  sleep 0.5
done
echo "== service at $url: $(python3 -c "import httpx; print(httpx.get('$url/healthz').text)" 2>&1)" >> "$log"
t=$SECONDS
echo "== fa4-tune --decode --push" >> "$log"
timeout 140 python3 -m tuner.cli --decode --batch 1,4 --seqlen-k 8192,32768 --heads 32 --heads-kv 8 --hdim 128 \
  --page-size 256 --trials 10 --verify-rounds 3 --budget-s 100 --db "sqlite:///$tmp/tuner.db" \
  --storage "$tmp/optuna.journal" --push "$url" 2>&1 | tail -40 | tee -a "$log"
echo "tune rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$log"
echo "== GET /v1/configs/best-decode, batch 1 KV 32k" >> "$log"
python3 - "$url" >> "$log" 2>&1 <<'PY'
import json, sys, httpx
from fa4.fingerprint import source_fingerprint
q = dict(device=__import__("torch").cuda.get_device_name(0), batch=1, seqlen_q=1, seqlen_k=32768, heads_q=32,
         heads_kv=8, head_dim=128, page_size=256, source_fingerprint=source_fingerprint())
r = httpx.get(sys.argv[1] + "/v1/configs/best-decode", params=q, timeout=30)
b = r.json()
print(r.status_code, json.dumps({k: b.get(k) for k in ("provenance", "stale", "config", "tflops", "measurement_id",
                                                          "notes")}))
PY
t=$SECONDS
echo "== served by the service vs heuristic (and the reference)" >> "$log"
timeout 80 python3 bench/decode_tuned.py --service "$url" --rounds 5 2>&1 | tee -a "$log"
echo "bench rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$log"
echo "== service log (tail)" >> "$log"
tail -20 "$tmp/serve.log" >> "$log"
