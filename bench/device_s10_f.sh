#!/usr/bin/env bash
# Session 10, GPU start 3, call 3 (same machine after bench/device_s10_e.sh): the backward's
# gqa_reduce 'loop' (bench/device_s10_gqaloop.sh: tests, then atomic vs loop vs the reference at
# four GQA shapes), then the 2-CTA dS exchange (bench/device_s10_cluster.sh: smoke, tests, bench).
# Files under $OUT: s10_gqaloop.tar, s10_cluster.tar.
set -uo pipefail
cd "$(dirname "$0")/.."
bash bench/device_s10_gqaloop.sh
bash bench/device_s10_cluster.sh
