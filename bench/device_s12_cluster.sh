#!/usr/bin/env bash
# Session 12 (issue 17): the 2-CTA dS exchange after the hang fix (the peer-K TMA copy no longer
# sits inside elect_one: the copy elects its own thread, and the nested elect waited for lanes
# that never came). Steps, each capped so that a hang costs its cap, not the call:
#  1. one exchanged backward (hd256, B2 S1000 H4, non-causal) against fp32 autograd, 120 s: a
#     hang shows as rc 124 and the later steps are skipped;
#  2. tests/fa4/test_bwd_cluster_gpu.py over 8 workers, 200 s;
#  3. bench/bench_cluster.py (B*S 16k, H*hd 2048, S8192; off / on / reference), 150 s.
# One tar under $OUT: s12_cluster.tar.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
device_begin s12_cluster
device_env "$work/env.log"
TAILN=8 step one 120 python3 -c "
import sys, torch; sys.path.insert(0, 'bench'); import check_bwd as c
for causal in (False, True):
    cfg = c.exchanged(c.problem_for((2, 1000, 1000, 4, 4), 256, causal, False))
    print('causal', causal, cfg)
    ok, info = c.check_case(2, 1000, 1000, 4, 4, 256, causal, torch.bfloat16, cfg)
    print('ONE ok' if ok else 'ONE FAIL', info, flush=True)
"
if grep -q "^ONE FAIL\|rc=124" "$work/one.log" || ! grep -q "^ONE ok" "$work/one.log"; then
  echo "the single exchanged case failed or hung: tests and bench skipped"; exit 0
fi
workers=""
python3 -c "import xdist" 2>/dev/null && workers="-n 8"
KEEP="FAILED|passed|failed|rc=" TAILN=20 step tests 200 python3 -m pytest -q $workers -p no:cacheprovider \
  --tb=line tests/fa4/test_bwd_cluster_gpu.py
TAILN=20 step bench 150 python3 bench/bench_cluster.py --out "$work/bench.json"
