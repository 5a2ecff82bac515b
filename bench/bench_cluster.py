"""The 2-CTA dS exchange (cluster_exchange) off and on against the reference FA4, backward TFLOP/s.

One process, do_bench median (as bench/check_bwd.py): B = 16384 / S, H = 2048 / head_dim, bf16,
causal and not. For each shape: our default config ("off"), the same with the exchange ("on",
bench/check_bwd.exchanged: one dS buffer where two no longer fit, hd192, timed beside "off ds1",
the default with one dS buffer, so the exchange's own effect is on/off-ds1), the reference FA4.
Before timing, "on" is compared with "off" on the timed inputs (max |on - off| / max |off| per
gradient). bench_shape runs on the CPU with the GPU faked (tests/fa4/test_bwd_pair.py).

    python bench/bench_cluster.py [--hds 256,192,192:128] [--seqlen 8192] [--out results.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_bwd  # noqa: E402

from fa4.problem import Problem  # noqa: E402
from fa4.sm90.bwd_config import violations  # noqa: E402
from fa4.sm90.bwd_defaults import default_config  # noqa: E402
from fa4.tensors import problem_of  # noqa: E402


def configs(prob: Problem) -> dict:
    # "off": the 64-key split's default without the exchange (at hd256 the default has it: "on" is the
    # default; at hd192 the default is the queries-on-M tiling, not built with it).
    off = dataclasses.replace(default_config(prob, queries_on_m=False), cluster_exchange=False)
    on = check_bwd.exchanged(prob)
    out = {"off": off, "on": on}
    if on.ds_stages != off.ds_stages:
        out["off ds1"] = dataclasses.replace(off, ds_stages=1)
    return {k: c for k, c in out.items() if not violations(c, prob)}


def bench_shape(S: int, D, causal: bool, device="cuda", tokens: int = 16384, width: int = 2048) -> dict:
    """One row: TFLOP/s of each config of configs() and of the reference FA4 at B = tokens / S,
    H = width / head_dim, and how far "on" is from "off" on the timed inputs."""
    import triton.testing as tt

    import fa4
    from fa4.sm90 import bwd_launch

    d, dv = check_bwd.dims(D)
    B, H = max(1, tokens // S), width // d
    g = torch.Generator(device=device).manual_seed(7)
    q, k = (torch.randn(B, S, H, d, device=device, dtype=torch.bfloat16, generator=g) for _ in range(2))
    v, dout = (torch.randn(B, S, H, dv, device=device, dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = fa4.flash_attn_func(q, k, v, provider="fa4", causal=causal, return_lse=True)
    prob = problem_of(q, k, v, causal, pass_="bwd")
    flops = Problem(B, S, S, H, H, d, dv, causal=causal, pass_="bwd").flops
    row = dict(S=S, D=check_bwd.label(D), causal=causal)
    runs = {}
    cfgs = configs(prob)
    for name, cfg in cfgs.items():
        runs[name] = lambda cfg=cfg: bwd_launch.flash_attn_bwd(dout, q, k, v, out, lse, None, causal, False, cfg)
    try:
        g_off, g_on = runs["off"](), runs["on"]()
        row["on_vs_off"] = {n: ((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
                            for n, x, y in zip(("dq", "dk", "dv"), g_on, g_off)}
    except Exception as e:  # noqa: BLE001 - a failing exchange must not hide the other numbers
        print(f"on vs off failed at {row['D']} causal={causal}: {e}"[:300], flush=True)
    try:
        from flash_attn.cute import flash_attn_func as ref_fa4

        qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
        o = ref_fa4(qr, kr, vr, causal=causal)
        o = o[0] if isinstance(o, tuple) else o
        runs["ref FA4"] = lambda: torch.autograd.grad(o, (qr, kr, vr), dout, retain_graph=True)
    except Exception as e:  # noqa: BLE001
        print("reference FA4 unavailable:", str(e)[:200], flush=True)
    for name, run in runs.items():
        try:
            run()
            row[name] = flops / tt.do_bench(run, warmup=20, rep=200, return_mode="median") / 1e9
        except Exception as e:  # noqa: BLE001
            row[name] = None
            print(f"{name} failed at {row['D']} causal={causal}: {e}"[:300], flush=True)
    row["configs"] = {n: dataclasses.asdict(c) for n, c in cfgs.items()}
    return row


def main():
    ap = argparse.ArgumentParser()
    # hd256 first: where the exchange is expected to pay (a capped run still measures it).
    ap.add_argument("--hds", default="256,192,192:128")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = []
    for D in check_bwd.parse_hds(a.hds):
        for causal in (False, True):
            row = bench_shape(a.seqlen, D, causal)
            rows.append(row)
            print("BENCH " + json.dumps({k: v for k, v in row.items() if k != "configs"}), flush=True)
            if a.out:  # after every row: a run stopped by its time cap keeps what it measured
                Path(a.out).write_text(json.dumps(rows, indent=1))
    table(rows)


def table(rows):
    def f(x):
        return f"{x:.0f}" if x else "-"

    def r(x, y):
        return f"{x / y:.3f}" if x and y else "-"

    print("\n| S | hd | causal | off | off ds1 | on | on/off | on/off-ds1 | ref FA4 | off/ref | on/ref | on vs off (dq, dk, dv) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w in rows:
        o, o1, n, ref = w.get("off"), w.get("off ds1"), w.get("on"), w.get("ref FA4")
        diff = ", ".join(f"{x:.1e}" for x in w.get("on_vs_off", {}).values())
        print(f"| {w['S']} | {w['D']} | {w['causal']} | {f(o)} | {f(o1)} | {f(n)} | {r(n, o)} | {r(n, o1)} | "
              f"{f(ref)} | {r(o, ref)} | {r(n, ref)} | {diff} |")


if __name__ == "__main__":
    main()
