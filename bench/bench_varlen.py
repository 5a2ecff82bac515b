"""Packed varlen forward, ours vs the reference FA4 (flash_attn.cute.flash_attn_varlen_func) in one
process, at issue 18's varlen shape: 8 documents of 512-4096 tokens (16k total), H=16, hd128, bf16,
causal (and not). TFLOP/s over the unmasked region (per document: causal halves), triton do_bench
median (warmup 50, rep 300 ms). Also the same tokens as dense B=8 x 2048 for scale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton.testing as tt  # noqa: E402

import fa4  # noqa: E402

LENS = [2048, 512, 4096, 1024, 3072, 1536, 2560, 1536]


def flops(lens, h, d, causal):
    return sum(4.0 * h * d * (n * (n + 1) / 2 if causal else n * n) for n in lens)


def bench(fn):
    return tt.do_bench(fn, warmup=50, rep=300, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from flash_attn.cute import flash_attn_varlen_func as ref_varlen

    h, d = 16, 128
    total = sum(LENS)
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    rows = []
    for causal in (True, False):
        f = flops(LENS, h, d, causal)
        ours = lambda: fa4.flash_attn_varlen_func(q, k, v, cu, cu, max(LENS), max(LENS), causal=causal)  # noqa: E731
        # Keywords: the reference's positional order has qv before cu_seqlens_q in some versions.
        ref = lambda: ref_varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(LENS),  # noqa: E731
                                 max_seqlen_k=max(LENS), causal=causal)
        o1 = ours()
        o2 = ref()
        o2 = o2[0] if isinstance(o2, tuple) else o2
        diff = (o1.float() - o2.float()).abs().max().item()
        t_ours, t_ref = bench(ours), bench(ref)
        row = dict(shape="varlen8-16k-h16-hd128", causal=causal, ours_ms=t_ours, ref_ms=t_ref,
                   ours_tflops=f / t_ours / 1e9, ref_tflops=f / t_ref / 1e9, ratio=t_ref / t_ours, max_diff_vs_ref=diff)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
