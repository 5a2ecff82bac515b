#!/usr/bin/env bash
# Nsight Compute profile of our backward next to the reference FA4's, on the GPU host:
# hd128 causal and hd64 non-causal at S=8192 (bench/profile_bwd.py), full section set, clocks
# left alone. Writes under $OUT: the .ncu-rep, its details page, the per-instruction source page
# (read it with bench/ncu_stalls.py) and the raw metrics; prints duration, issue activity,
# registers and occupancy of every kernel profiled (pre/main/postprocess of both).
#
#   bash bench/ncu_bwd.sh ['{"ds_store": "sts"}']   # optional knob overrides of our default
#   SPECS="128:--causal 128:--seqlen=16384,--window=1023,0" bash bench/ncu_bwd.sh   # other problems
# (SPECS: head_dim:profile_bwd.py's arguments, comma-separated; default hd128 causal and hd64.)
set -u
cfg=${1:-"{}"}
OUT=${OUT:-bench/logs/session}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
echo "ncu: $NCU"
for spec in ${SPECS:-128:--causal 64:}; do
  hd=${spec%%:*}; args=${spec#*:}; args=${args//,--/ --}
  tag=bwd$hd$(echo "$args" | tr -cd 'a-z0-9')
  # shellcheck disable=SC2086
  timeout 200 "$NCU" --profile-from-start off --clock-control none --set full -o "$OUT/$tag" \
     python3 bench/profile_bwd.py --hdim "$hd" $args --config "$cfg" > "$OUT/$tag.run.log" 2>&1
  echo "$tag rc=$?"; tail -3 "$OUT/$tag.run.log"
  "$NCU" --import "$OUT/$tag.ncu-rep" --page details > "$OUT/$tag.details.txt" 2>&1
  "$NCU" --import "$OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/$tag.source.csv" 2>&1
  "$NCU" --import "$OUT/$tag.ncu-rep" --page raw --csv > "$OUT/$tag.raw.csv" 2>&1
  grep -E "^  [A-Za-z_].*\(|Duration|Issue Slots Busy|Registers Per|Achieved Occ" "$OUT/$tag.details.txt" | head -40
done
