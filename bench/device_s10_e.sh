#!/usr/bin/env bash
# Session 10, GPU start 3, call 2: README command (1), then the varlen backward's first GPU run
# (bench/device_s10_varlenbwd.sh). Files under $OUT: main.log, main.err, s10_varlenbwd.tar.
set -uo pipefail
cd "$(dirname "$0")/.."
bash bench/device_main.sh
bash bench/device_s10_varlenbwd.sh
