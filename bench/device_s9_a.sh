#!/usr/bin/env bash
# Session 9, first GPU call after the kit (< 10 minutes): README command (1) (bench/device_main.sh),
# then the host cost per call of ours and the peers on the tiny problem with a profile of ours
# (issue 20), and a small random-weight Llama trained through fa4.integrations.transformers
# against SDPA (issue 18). Everything under $OUT goes back as one tar (the tool returns few files).
set -uo pipefail
cd "$(dirname "$0")/.."
final="${OUT:-bench/logs/session}"
out=$(mktemp -d)
run() {  # name timeout command...: stdout+stderr to $out/name.log (and shown)
  local name=$1 limit=$2; shift 2
  echo "\$ $*" | tee "$out/$name.log"; local t=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$out/$name.log"
  echo "rc=${PIPESTATUS[0]} wall=$((SECONDS - t))s" | tee -a "$out/$name.log"
}
OUT="$out" timeout 220 bash bench/device_main.sh 2>/dev/null
run host_cost 120 python3 bench/host_cost.py --profile
run hf_llama 200 python3 bench/hf_train.py --family llama --steps 20
mkdir -p "$final" && tar -C "$out" -czf "$final/s9a.tgz" . && ls -la "$out"
