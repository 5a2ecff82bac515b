# Sourced by the bench/device_*.sh scripts (bash): the results folder, one tar of it on exit, the
# environment every GPU run takes (the working tree on the path, no local-DB or service lookups),
# `device_env LOG` (what ran where) and `step NAME LIMIT CMD...` (a capped command, its log kept
# whole in the tar, its tail printed).
device_begin() {  # NAME: the tar's name, the default folder under bench/logs
  tar_name=$1
  out="${OUT:-bench/logs/$1}"
  mkdir -p "$out"
  work=$(mktemp -d)
  trap 'tar -C "$work" -cf "$out/$tar_name.tar" . ; echo "wrote $out/$tar_name.tar"' EXIT
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  export FA4_LOOKUP_LOCAL_DB=0
  unset FA4_TUNING_URL
}

step() {  # NAME LIMIT CMD...: TAILN lines of the log printed (KEEP: a grep -E filter)
  local name=$1 limit=$2; shift 2
  echo "\$ $*" > "$work/$name.log"
  local t=$SECONDS
  timeout "$limit" "$@" >> "$work/$name.log" 2>&1
  local rc=$?
  echo "[$name rc=$rc wall=$((SECONDS - t))s]" | tee -a "$work/$name.log"
  grep -v "^BENCH \|Warning\|generate_mlir\|warnings.warn\|exe_args" "$work/$name.log" | grep -E "${KEEP:-.}" \
    | tail -n "${TAILN:-25}"
}

code_hash() {  # the Python of fa4/, bench/ and tests/ as it is on disk, 12 hex digits
  find fa4 bench tests -name '*.py' -print0 | LC_ALL=C sort -z | xargs -0 cat | sha1sum | cut -c1-12
}

device_env() {  # LOG: the GPU, torch, where fa4 and the reference FA4 load from, which code ran
  python3 -c "import torch, cutlass; print('device:', torch.cuda.get_device_name(), 'torch', torch.__version__); \
import fa4, flash_attn.cute as r; print('fa4 from', fa4.__file__, '| reference from', r.__file__)" 2>&1 | tee "$1"
  # The device's .git need not be the checkout's (session 42: a branch's run logged main's commits),
  # so the code is named by its content: `bash -c '. bench/device_lib.sh; code_hash'` here gives the
  # same digits for the same files.
  echo "code $(code_hash); the device's .git says: $(git log --oneline -1 2>/dev/null | cut -c1-60)" | tee -a "$1"
}

device_install() {  # the kit's platformdirs wheel and fa4 itself (editable: `fa4-tune` on PATH), quietly
  python3 -m pip install -q --no-index --no-deps .whl/*.whl >/dev/null 2>&1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
}

# The phases every session's script has repeated since session 30 (issue 20's measurements). Each
# takes its shapes (comma list of bench/bwd_order.py names) and the rest from the environment.
ISSUE20_FIVE="llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k"

# Beside them, Sq 128 / Sk 8k (B8 H32/KV8 hd128, GQA 'loop'): in session 43's auto run our fwd+bwd there
# took 2.22 ms against the reference's 2.06, where session 23 measured 0.98 against 1.81 (the cause:
# the nearest-shape rule served an 8k/8k config, session 44); ours_vs_ref times it by default.
ISSUE20_WATCH="$ISSUE20_FIVE,sq128-sk8k"

ours_vs_ref() {  # SHAPES: our backward / the reference's, default configs, 2 interleaved rounds
  TAILN=16 step five 300 python3 bench/bwd_order.py --orders default --rounds 2 --shapes "${1:-$ISSUE20_WATCH}"
}

det_vs_nondet() {  # SHAPES [VARIANTS]: deterministic / non-deterministic (and VARIANTS of the det config)
  TAILN=16 step "${STEP:-det}" 300 python3 bench/det_ratio.py --rounds "${ROUNDS:-2}" --shapes "${1:-$ISSUE20_FIVE}" \
    ${2:+--det-variants "$2"}
}

bwd_variants() {  # SHAPES VARIANTS: knob overrides against the default (DET=1: deterministic), ROUNDS rounds
  TAILN=14 step confirm 420 python3 bench/bwd_order.py --orders default --rounds "${ROUNDS:-3}" ${DET:+--det} \
    --variants "$2" --shapes "$1"
}

host_cost() {  # the tiny problem's host cost, piece by piece, then floor+3 / ours / cuDNN interleaved (bench/host_floor.py)
  (cd bench && TAILN=${TAILN:-18} step host_floor 120 python3 host_floor.py --ab "${AB:-10}" --calls 1000)
}

bwd_gpu_tests() {  # -k EXPR: the backward's GPU suite (tests/fa4/test_bwd_gpu.py), 12 workers
  TAILN=14 step tests 360 python3 -m pytest -q -n 12 -p no:cacheprovider tests/fa4/test_bwd_gpu.py -k "$1"
}

feat_gpu_tests() {  # -k EXPR: the features' and the GQA 'loop' GPU suites
  TAILN=14 step feat 240 python3 -m pytest -q -n 12 -p no:cacheprovider tests/fa4/test_bwd_feat_gpu.py \
    tests/fa4/test_bwd_gqa_loop_gpu.py -k "$1"
}

# Issue 20's auto bar on issue16_table's ten rows, in two calls of one warm machine (the DB is under
# /tmp, kept between calls, lost when the machine goes back). Our kernels compile and verify for
# about 55 s a row on the device (session 44, H100), so the fa4 measure alone takes about 550 s:
# auto_store 1 stores the peers (about 90 s) and fa4's first 6 rows (about 330 s); auto_store 2 the
# last 4 (about 230 s), then bench/auto_dispatch.py (about 95 s).
AUTO_DB=sqlite:////tmp/auto_bar.db
AUTO_TABLE=bench/shapes/issue16_table.csv
auto_store() {  # PART (1 or 2)
  local rows
  if [ "$1" = 1 ]; then
    rm -f /tmp/auto_bar.db /tmp/auto_bar.optuna.journal
    for p in flash-attn-4 cudnn; do
      TAILN=3 step "auto_$p" 150 fa4-tune --shapes "$AUTO_TABLE" --provider "$p" --trials 1 --l2 cold --db "$AUTO_DB"
    done
    rows='1,7p'
  else
    rows='1p;8,11p'
  fi
  sed -n "$rows" "$AUTO_TABLE" > "$work/auto_rows$1.csv"
  TAILN=8 KEEP="^b[0-9]|rc=" step "auto_fa4_$1" 400 fa4-tune --shapes "$work/auto_rows$1.csv" --provider fa4 \
    --trials 1 --l2 cold --db "$AUTO_DB"
  if [ "$1" = 2 ]; then
    TAILN=12 KEEP="medians of 3|slower" step auto_dispatch 200 python3 bench/auto_dispatch.py --db "$AUTO_DB" \
      --shapes "$AUTO_TABLE" --rounds 3
  fi
}
