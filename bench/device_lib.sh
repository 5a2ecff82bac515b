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

device_env() {  # LOG: the GPU, torch, where fa4 and the reference FA4 load from, the last commits
  python3 -c "import torch, cutlass; print('device:', torch.cuda.get_device_name(), 'torch', torch.__version__); \
import fa4, flash_attn.cute as r; print('fa4 from', fa4.__file__, '| reference from', r.__file__)" 2>&1 | tee "$1"
  git log --oneline -3 2>/dev/null | tee -a "$1"
}

device_install() {  # the kit's platformdirs wheel and fa4 itself (editable: `fa4-tune` on PATH), quietly
  python3 -m pip install -q --no-index --no-deps .whl/*.whl >/dev/null 2>&1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
}
