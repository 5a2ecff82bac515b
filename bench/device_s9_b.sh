#!/usr/bin/env bash
# Session 9, GPU session 2, first call after the kit (< 10 minutes): README command (1), then the host
# cost of ours with its profile (after the backward plan and the knob-spec cache), and a small
# Mistral-style model (sliding window) trained through fa4.integrations.transformers against SDPA.
# Everything under $OUT goes back as one tar.
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
run host_cost 100 python3 bench/host_cost.py --providers fa4,cudnn --profile
run hf_mistral 150 python3 bench/hf_train.py --family mistral --steps 12
mkdir -p "$final" && tar -C "$out" -czf "$final/s9b.tgz" . && ls -la "$out"
