#!/usr/bin/env bash
# README command (1) on the device machine, through the device kit (../shared/device/stage.sh).
# The machine reaches no package index and carries torch 2.11: the kit's wheels stand in for the
# two pip installs of command (1) (torch==2.13.0 is the CPU machines' pin; the GPU image has its
# own CUDA build), and `pip install -e .` without an index puts the `fa4-tune` program on PATH.
# Then the main job runs exactly as README command (1) writes it. Log under $OUT/main.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/logs/session}"
mkdir -p "$out"
{
  echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?') on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  # platformdirs (the default DB's folder) is not on the image: carried as a wheel in .whl/.
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl 2>&1 | grep -v "^WARNING: Running pip as"
  # Session 23's first call ran without .whl carried (stage.sh's carry lists do not name it) and the
  # main job stopped at the default DB's folder: say how to carry it instead.
  python3 -c "import platformdirs" 2>/dev/null || echo "platformdirs missing: on this machine run" \
    "'python3 -m pip download --no-deps platformdirs -d .whl' and add \".whl\" to the call's carry"
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING: Running pip as" || true
  echo "\$ fa4-tune --seqlen 8192 --hdim 128"
  start=$SECONDS
  fa4-tune --seqlen 8192 --hdim 128
  echo "rc=$? wall=$((SECONDS - start))s"
} > >(tee "$out/main.log") 2> >(tee "$out/main.err" >&2)
