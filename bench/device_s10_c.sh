#!/usr/bin/env bash
# Session 10, GPU start 2: README command (1), then the decode work of the session (fused / PDL
# combine, head dims 96/192/256: bench/device_s10_decfuse.sh), the host cost split
# (bench/host_floor.py) and the features under torch.compile (GPU test). Files under $OUT:
# main.log, main.err, decfuse_tests.log, decfuse_bench.log, extra.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-bench/logs/s10_c}"
mkdir -p "$out"
bash bench/device_main.sh
bash bench/device_s10_decfuse.sh
{
  echo "== host_floor"; timeout 60 python3 bench/host_floor.py
  echo "== torch.compile with features (GPU)"
  timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/fa4/test_bwd_gpu.py -k "compile_fullgraph" 2>&1 | tail -5
} > "$out/extra.log" 2>&1
