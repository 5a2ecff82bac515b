"""A list-scheduling model of the causal backward's launch order (CPU): how much of the machine a
non-deterministic 'atomic' grid keeps busy for each head_swizzle, longest key tiles first.

The model: `--sms` SMs, one CTA an SM; CTAs start in launch order (the kernel's decode of the
linear block index, mirrored on the host by tests/fa4/test_bwd_gqa_loop.launch_order) as SMs free
up; the CTA of key tile n walks (num_n - n) * tile_n / tile_m query tiles and costs that many steps
plus `--overhead` steps (prologue and epilogue). Printed: the efficiency lower bound / makespan,
where the lower bound is the total work spread evenly over the SMs. No waits: the deterministic dQ
turns and the L2 are outside the model.

Session 32 used it to read the launch-order measurements (bench/RESULTS.md): the model's gains
from a group of about a wave match the hd64 shapes (GPT-2 1k +4.5% against +3-4% measured, hd64 2k
+4.7% / +5%, hd64 4k +5.2% / +4.8%) and overstate hd128 at 1k-2k (+3-4% against +0.4-1.8%).

    python3 bench/launch_model.py [--sms 132] [--overhead 1]
"""

from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fa4.test_bwd_gqa_loop import launch_order  # noqa: E402

# name: (key tiles a head, batch x heads, tile_n / tile_m, the default's heads a group before session 32)
SHAPES = {
    "gpt2-1k (B16 H12 hd64)": (8, 192, 1, 2),
    "hd64-2k (B8 H16)": (16, 128, 1, 2),
    "hd64-4k (B4 H16)": (32, 64, 1, 2),
    "llama3.2-1b-8k (H32 hd64)": (64, 32, 1, 2),
    "hd128-1k (B16 H16)": (8, 256, 2, 4),
    "hd128-2k (B8 H16)": (16, 128, 2, 4),
    "qwen2.5-7b-4k (B2 H28)": (32, 56, 2, 4),
    "causal-8k (B2 H16 hd128)": (64, 32, 2, 4),
}
SWIZZLES = (1, 2, 4, 8, 16, 32)


def efficiency(num_n: int, num_bh: int, ratio: int, swizzle: int, sms: int, overhead: float) -> float:
    """Lower bound / makespan of the longest-first launch in groups of ``swizzle`` heads."""
    free = [0.0] * sms
    end = work = 0.0
    for n, _, _ in launch_order(num_n, num_bh, 1, swizzle, 0):
        start = heapq.heappop(free)
        cost = (num_n - n) * ratio + overhead
        heapq.heappush(free, start + cost)
        end = max(end, start + cost)
        work += cost
    return work / sms / end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=1.0, help="a CTA's fixed cost, in steps")
    a = ap.parse_args()
    print("| shape | " + " | ".join(f"{s} heads" for s in SWIZZLES) + " | old default |")
    print("|---|" + "---:|" * (len(SWIZZLES) + 1))
    for name, (num_n, num_bh, ratio, old) in SHAPES.items():
        effs = [efficiency(num_n, num_bh, ratio, s, a.sms, a.overhead) for s in SWIZZLES]
        print(f"| {name} | " + " | ".join(f"{e:.3f}" for e in effs) + f" | {old} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
