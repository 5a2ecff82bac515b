#!/usr/bin/env bash
# One device call's worth of pending checks, each with its own time limit, logs under $OUT
# (or bench/logs/session when $OUT is unset), and a short summary last.
#
#   bash bench/gpu_session.sh [bwd-check] [gpu-tests] [fwd-tests] [fwd-check] [bwd-variants] [fwd-p-smem]
#                             [fwd-tune] [fwd-sweep] [bwd-sweep] [fwd-persistent] [fleet]
#                             [fleet2] [fleet1] [fleet-report] [bwd-ncu]
#
# With no argument it runs all but fwd-tune and the two S-range sweeps, in this order (about 12 minutes on an H200: split
# it over two device calls, each under the 10-minute limit).
set -u
cd "$(dirname "$0")/.."
# The bench scripts run as files: the packages live at the repository root.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-bench/logs/session}"
mkdir -p "$out"
tune_db="sqlite:///$(cd "$out" && pwd)/tune.db"
steps=()
for s in "$@"; do  # 'fleet': both runs and the report, in one call
    if [ "$s" = fleet ]; then steps+=(fleet2 fleet1 fleet-report); else steps+=("$s"); fi
done
[ ${#steps[@]} -eq 0 ] && steps=(bwd-check gpu-tests fwd-check bwd-variants fwd-p-smem)
summary=()

run() {  # name, limit in s, command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    summary+=("$(printf '%-13s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -n 1 "$out/$name.log" | cut -c1-90)")")
}

for s in "${steps[@]}"; do
    case $s in
        bwd-check) run bwd-check 300 python3 bench/check_bwd.py --quick --no-bench --out "$out/bwd-check.json" ;;
        gpu-tests) run gpu-tests 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/fa4/test_bwd_gpu.py tests/fa4/test_interface.py ;;
        fwd-tests) run fwd-tests 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/fa4/test_fwd_gpu.py \
            tests/tuner/test_harness.py ;;
        fwd-check) run fwd-check 240 python3 bench/check_fwd.py --quick --seqlens 8192 --out "$out/fwd-check.json" ;;
        bwd-variants) run bwd-variants 200 python3 bench/check_bwd.py --no-check --out "$out/bwd-variants.json" \
            --variants '[{"dkv_store":"direct"},{"dkv_store":"direct","deterministic":true}]' ;;
        fwd-sweep) run fwd-sweep 420 python3 bench/bench_fwd.py ;;
        fwd-tune)  # issue 3's tuned bar: tune our forward on the four shapes, then the side-by-side
            # table again with the tuned configs (flash_attn_func reads them from $FA4_DB).
            run fwd-tune 400 env FA4_DB="$tune_db" python3 -m tuner.cli \
                --shapes bench/shapes/issue_speed_bar.csv --provider fa4 --trials 12 --json
            run fwd-tuned-check 120 env FA4_DB="$tune_db" python3 bench/check_fwd.py \
                --quick --no-check --seqlens 8192 ;;
        bwd-sweep) run bwd-sweep 420 python3 bench/check_bwd.py --no-check --seqlens 1024,2048,4096,8192,16384 \
            --out "$out/bwd-sweep.json" ;;
        fleet2|fleet1)  # issue 7, on nvidia-h200-x2: the 2-GPU or the 1-GPU run (at 40 trials per shape,
            # fa4-tune's default: ~2 and ~3.5 min), kept in /tmp/fleet on the warm machine, so the two may
            # go in separate device calls; 'fleet-report' compares them and packs the run folders into one
            # file. FLEET_TRIALS=20 for the shorter runs of sessions 3-5.
            run "$s" 560 python3 bench/fleet_scaling.py --out /tmp/fleet --trials "${FLEET_TRIALS:-40}" --runs "${s#fleet}" ;;
        fleet-report)
            run fleet-report 60 python3 bench/fleet_scaling.py --out /tmp/fleet --report
            tar czf "$out/fleet.tgz" -C /tmp fleet ;;
        bwd-ncu)  # Nsight Compute of our backward and the reference's (hd128 causal, hd64), stall tables
            run bwd-ncu 420 bash bench/ncu_bwd.sh
            for t in bwd128c bwd64; do
                python3 bench/ncu_stalls.py "$out/$t.source.csv" FlashBwdSm90 --top 30 > "$out/$t.ours-stalls.txt"
                python3 bench/ncu_stalls.py "$out/$t.source.csv" FlashAttentionBackwardSm90 --top 30 > "$out/$t.ref-stalls.txt"
                rm -f "$out/$t.source.csv" "$out/$t.ncu-rep"
            done ;;
        fwd-persistent) run fwd-persistent 240 python3 bench/knob_effects.py --check \
            --shapes 8192:64:0,8192:64:1,8192:128:0,8192:128:1 \
            --variants '[{},{"persistent":true},{"persistent":true,"sched_order":"natural"},{"persistent":true,"head_swizzle":4}]' ;;
        fwd-p-smem) run fwd-p-smem 240 python3 bench/knob_effects.py --check \
            --shapes 8192:64:0,8192:64:1,8192:128:0,8192:128:1 \
            --variants '[{},{"p_operand":"smem"},{"p_operand":"smem","tile_n":144},{"p_operand":"smem","tile_n":192}]' ;;
        *) echo "unknown step $s" >&2; exit 2 ;;
    esac
done
echo
printf '%s\n' "${summary[@]}"
grep -h "^|" "$out/bwd-variants.log" "$out/fwd-check.log" "$out/bwd-sweep.log" "$out/fwd-tuned-check.log" 2>/dev/null | head -50
