#!/usr/bin/env bash
# Session 10, GPU start 1, call 2: README command (1) (bench/device_main.sh), then the varlen
# forward's first GPU run (bench/device_s9_varlen.sh). Files under $OUT: main.log, main.err, s9_varlen.tar.
set -uo pipefail
cd "$(dirname "$0")/.."
bash bench/device_main.sh
bash bench/device_s9_varlen.sh
