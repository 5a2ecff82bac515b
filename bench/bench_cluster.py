"""The 2-CTA dS exchange (cluster_exchange) off and on against the reference FA4, backward TFLOP/s.

One process, do_bench median (as bench/check_bwd.py): B = 16384 / S, H = 2048 / head_dim, bf16,
causal and not. For each shape: our default config ("off"), the same with the exchange ("on",
bench/check_bwd.exchanged: one dS buffer where two no longer fit, hd192, timed beside "off ds1",
the default with one dS buffer, so the exchange's own effect is on/off-ds1), the reference FA4. Before timing, "on" is
compared with "off" on the timed inputs (max |on - off| / max |off| per gradient).

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
from fa4.sm90.bwd_config import default_config, violations  # noqa: E402
from fa4.sm90.bwd_launch import flash_attn_bwd  # noqa: E402
from fa4.tensors import problem_of  # noqa: E402


def configs(prob: Problem) -> dict:
    off = default_config(prob)
    on = check_bwd.exchanged(prob)
    out = {"off": off, "on": on}
    if on.ds_stages != off.ds_stages:
        out["off ds1"] = dataclasses.replace(off, ds_stages=1)
    return {k: c for k, c in out.items() if not violations(c, prob)}


def main():
    import triton.testing as tt

    ap = argparse.ArgumentParser()
    # hd256 first: where the exchange is expected to pay (a capped run still measures it).
    ap.add_argument("--hds", default="256,192,192:128")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = []
    S = a.seqlen
    for D in check_bwd.parse_hds(a.hds):
        for causal in (False, True):
            d, dv = check_bwd.dims(D)
            B, H = max(1, 16384 // S), 2048 // d
            q, k, v, dout, out, lse = check_bwd.make_inputs(B, S, S, H, H, D, causal, torch.bfloat16, 7)
            prob = problem_of(q, k, v, causal, pass_="bwd")
            flops = Problem(B, S, S, H, H, d, dv, causal=causal, pass_="bwd").flops
            row = dict(S=S, D=check_bwd.label(D), causal=causal)
            runs = {}
            cfgs = configs(prob)
            for name, cfg in cfgs.items():
                runs[name] = lambda cfg=cfg: flash_attn_bwd(dout, q, k, v, out, lse, None, causal, False, cfg)
            if "on" in runs and "off" in runs:
                g_off, g_on = runs["off"](), runs["on"]()
                torch.cuda.synchronize()
                row["on_vs_off"] = {n: ((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
                                    for n, x, y in zip(("dq", "dk", "dv"), g_on, g_off)}
            try:
                from flash_attn.cute import flash_attn_func as ref_fa4

                qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
                o = ref_fa4(qr, kr, vr, causal=causal)
                o = o[0] if isinstance(o, tuple) else o
                runs["ref FA4"] = lambda o=o, qr=qr, kr=kr, vr=vr: torch.autograd.grad(
                    o, (qr, kr, vr), dout, retain_graph=True)
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
            rows.append(row)
            print("BENCH " + json.dumps({k: v for k, v in row.items() if k != "configs"}), flush=True)
            if a.out:  # after every row: a run stopped by its time cap keeps what it measured
                Path(a.out).write_text(json.dumps(rows, indent=1))

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
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
