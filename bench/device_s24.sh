#!/usr/bin/env bash
# Session 24, after README command (1) (`bash bench/device_main.sh`): issue 20's GPT-2 forward
# (B16 S1k H12 hd64 causal), where cuDNN's 0.085-0.094 ms beats our ~0.100 (session 23). One phase a call:
#  tune: a forward study at that shape (fa4-tune, 40 trials) into $OUT/gpt2.db: which knobs win there.
#  v:    the knob effects at the exact shape, with the correctness gate, cuDNN and the reference
#        FA4 in the same rotated rounds. Predictions: persistent +3-6% (a CTA walks ~4.5 key tiles,
#        so its prologue and epilogue are a large share, and one CTA fills an SM: 168 registers x
#        384 threads); kv_stages 3 +-1%; tile_n 96/160/176 -2 to -5%; sched_order natural and
#        head_swizzle within 1%. (Measured: persistent -8%, head_swizzle 8 +3.5%.)
#  ctas: ctas_per_sm 2 at 256-2k, causal and not. Prediction: +5-15% on short causal walks.
#  t:    the forward GPU suites, and a 20-trial study at 512 keys.
#  auto: the GPT-2 row of issue 20's auto bar from the tuned DB (+ the peers measured into it).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/device_lib.sh
phase=${1:-tune}
device_begin "s24$phase${2:-}"
device_env "$work/env.log"
device_install
db="sqlite:///$PWD/.device/gpt2.db"
head -1 bench/shapes/issue16_table.csv > /tmp/gpt2.csv
grep "^1024,64,16" bench/shapes/issue16_table.csv >> /tmp/gpt2.csv
case "$phase" in
  tune)
    TAILN=12 step gpt2_tune 420 fa4-tune --batch 16 --seqlen 1024 --heads 12 --hdim 64 --causal --trials 40 --db "$db"
    cp .device/gpt2.db "$out/gpt2.db" ;;
  v)  # the knobs at GPT-2's exact shape, then head_swizzle 8 / exp_pin at 512-2k (session 24, calls 3-4)
    TAILN=30 KEEP="EFFECT|SKIP|INCORRECT|FAILED|rc=" step "gpt2_knobs" 400 python3 bench/knob_effects.py --check \
      --shapes 1024:64:1:16:12 --rounds 3 --peers cudnn,flash-attn-4 --variants '[{}, {"persistent": true},
      {"exp_pin": true, "head_swizzle": 8}, {"exp_pin": true, "head_swizzle": 8, "persistent": true}, {"exp_pin": true},
      {"head_swizzle": 8}, {"kv_stages": 3}, {"tile_n": 96}, {"tile_n": 160}, {"tile_n": 176}, {"pingpong": "mma"},
      {"sched_order": "natural"}, {"exp_pin": true, "head_swizzle": 8, "kv_stages": 3}, {"tile_m": 192, "mask_bits": false}]'
    TAILN=30 KEEP="EFFECT|rc=" step swizzle 300 python3 bench/knob_effects.py --rounds 3 --peers cudnn \
      --shapes 1024:64:1:16:12,1024:64:1,512:64:1,2048:64:1:8:12 --variants '[{}, {"head_swizzle": 8},
      {"exp_pin": true, "head_swizzle": 8}, {"head_swizzle": 4}, {"exp_pin": true, "head_swizzle": 4}]' ;;
  ctas)  # two CTAs an SM (ctas_per_sm 2), calls 5-6; the old default spelled out since it changed
    C='"ctas_per_sm": 2, "tile_m": 128, "p_operand": "smem"'
    TAILN=40 KEEP="EFFECT|SKIP|INCORRECT|FAILED|rc=" step ctas 500 python3 bench/knob_effects.py --check --rounds 3 \
      --peers cudnn --shapes 1024:64:1:16:12,512:64:1,2048:64:1:8:12,1024:64:0:16:12,256:64:1,768:64:1:16:12 \
      --variants "[{}, {$C, \"tile_n\": 64}, {$C, \"tile_n\": 80}, {$C, \"tile_n\": 64, \"kv_stages\": 3},
      {$C, \"tile_n\": 64, \"head_swizzle\": 8}, {$C, \"tile_n\": 64, \"exp_pin\": true}, {\"head_swizzle\": 8}]" ;;
  t)  # the forward GPU suites on the new defaults, and a study at 512 keys (calls 7-10)
    TAILN=8 KEEP="passed|failed|FAILED" step fwd_tests 300 python3 -m pytest -q -n 15 -p no:cacheprovider \
      tests/fa4/test_fwd_gpu.py tests/fa4/test_fwd_features_gpu.py tests/fa4/test_varlen_gpu.py
    TAILN=9 step s512_tune 200 fa4-tune --batch 32 --seqlen 512 --heads 12 --hdim 64 --causal --trials 20 \
      --db "sqlite:////tmp/s512.db" ;;
  auto)
    TAILN=6 step gpt2_measure 300 python3 bench/auto_dispatch.py --db "$db" --shapes /tmp/gpt2.csv --measure
    for how in bench loop; do
      extra=(); [[ $how == loop ]] && extra=(--loop 200)
      TAILN=4 KEEP="auto chose|slower than" step "gpt2_auto_$how" 150 python3 bench/auto_dispatch.py \
        --db "$db" --shapes /tmp/gpt2.csv "${extra[@]}"
    done
    cp .device/gpt2.db "$out/gpt2_auto.db" ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
