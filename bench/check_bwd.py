"""GPU check of our Hopper backward: correctness grid, determinism, then a timing table.

Correctness: out/lse from our forward (checked by bench/check_fwd.py), a random dO; dq, dk,
dv from fa4.sm90.bwd_launch.flash_attn_bwd against PyTorch autograd in fp32. The error rule
(FlashAttention's): max |ours - fp32| <= 2 x max |PyTorch same-dtype autograd - fp32| plus
twice the dtype rounding of the fp32 gradient, plus an fp32 floor (fp32_floor: the accumulators'
rounding, relative to the gradients' magnitude, where a gradient cancels to zero). NaN never passes.
Determinism: deterministic configs run 10 times on the same inputs; all results bitwise equal.
Timing (backward only; triton do_bench median, peers in the same process, S=8192 or the
--seqlens list, 16k tokens, heads*hd=2048): ours non-deterministic and deterministic, reference FA4 (both modes when it
takes deterministic=), cuDNN and FA2 through SDPA.

    python bench/check_bwd.py [--quick] [--no-check] [--no-bench] [--out results.json] [--variants JSON]
    python bench/check_bwd.py --quick --hds 96,192,192:128,256   # head_dim[:head_dim_v]

A head dim ``D`` below is an int (head_dim_v == head_dim) or a pair (head_dim, head_dim_v).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

import torch

import fa4
from fa4.problem import Problem
from fa4.sm90.bwd_config import BwdConfigSm90, violations
from fa4.sm90.bwd_defaults import default_config, default_launch_order
from fa4.sm90.bwd_launch import flash_attn_bwd
from fa4.tensors import problem_of


def attention(q, k, v, causal, scale):
    """softmax(q k^T scale) v in q's dtype with autograd; (B, S, H, D) layout, GQA by repeat."""
    Sq, Sk = q.shape[1], k.shape[1]
    rep = q.shape[2] // k.shape[2]
    qq = q.transpose(1, 2)
    kk = k.transpose(1, 2).repeat_interleave(rep, dim=1)
    vv = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    s = torch.matmul(qq, kk.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
    p = torch.softmax(s.to(torch.promote_types(s.dtype, torch.float32)), dim=-1)  # fp32 or wider
    p = torch.nan_to_num(p, nan=0.0).to(q.dtype)  # rows with no visible key: zero output
    return torch.matmul(p, vv).transpose(1, 2)


def reference_grads(q, k, v, dout, causal, scale, dtype):
    qq, kk, vv = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    o = attention(qq, kk, vv, causal, scale)
    return torch.autograd.grad(o, (qq, kk, vv), dout.to(dtype))


def dims(D) -> tuple[int, int]:
    """(head_dim, head_dim_v) of a head dim spec: 128 or (192, 128)."""
    return (D, D) if isinstance(D, int) else tuple(D)


def parse_hds(text: str) -> list:
    """'64,192:128' (or bench/check_fwd.py's '192v128') -> [64, (192, 128)]."""
    out = []
    for tok in text.split(","):
        d, _, dv = tok.replace("v", ":").partition(":")
        out.append(int(d) if not dv or int(dv) == int(d) else (int(d), int(dv)))
    return out


def label(D) -> str:
    d, dv = dims(D)
    return str(d) if d == dv else f"{d}/{dv}"


def make_inputs(B, Sq, Sk, Hq, Hkv, D, causal, dtype, seed):
    d, dv = dims(D)
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Sq, Hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, Sk, Hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, Sk, Hkv, dv, device="cuda", dtype=dtype, generator=g)
    dout = torch.randn(B, Sq, Hq, dv, device="cuda", dtype=dtype, generator=g)
    out, lse = fa4.flash_attn_func(q, k, v, provider="fa4", causal=causal, return_lse=True)
    return q, k, v, dout, out, lse


def check_case(B, Sq, Sk, Hq, Hkv, D, causal, dtype, config, deterministic=False):
    seed = int(time.time() * 1e6) % (2**31)
    q, k, v, dout, out, lse = make_inputs(B, Sq, Sk, Hq, Hkv, D, causal, dtype, seed)
    scale = 1.0 / math.sqrt(dims(D)[0])
    grads = flash_attn_bwd(dout, q, k, v, out, lse, scale, causal, deterministic, config)
    torch.cuda.synchronize()
    ok, info = grads_match_reference(grads, q, k, v, dout, causal, scale)
    return ok, {"seed": seed, **info}


def grads_match_reference(grads, q, k, v, dout, causal, scale):
    """The error rule above for (dq, dk, dv) of attention(q, k, v) with upstream gradient dout."""
    dtype = q.dtype
    ref = reference_grads(q, k, v, dout, causal, scale, torch.float32)
    low = reference_grads(q, k, v, dout, causal, scale, dtype)
    info, ok = {}, True
    floor = fp32_floor(ref)
    for name, g, r, lo in zip(("dq", "dk", "dv"), grads, ref, low):
        err = (g.float() - r).abs().max().item()
        err_pt = (lo.float() - r).abs().max().item()
        ulp = (r.to(dtype).float() - r).abs().max().item()
        nan = bool(torch.isnan(g).any().item())
        good = (not nan) and g.shape == r.shape and err <= 2 * err_pt + 2 * ulp + floor
        info[name] = dict(err=err, err_torch=err_pt, nan=nan, ok=good)
        ok &= good
    return ok, info


def fp32_floor(ref) -> float:
    """The absolute floor of the error rule: 1e-5, or 16 fp32 epsilons of the largest reference
    gradient. An fp32 accumulator's rounding is relative to the terms it sums, not to a result
    they cancel to: with one key (Sk = 1) dS = P (dP - D) is exactly 0, so dK is, and our fp32
    dP - D leaves ~1e-5 of rounding where PyTorch's autograd cancels exactly (the H200, hd256,
    B3 Sq65 Sk1: 0.8-1.1e-5, with the exchange and without); the other gradients there are
    ~30, so 16 epsilons of them is 5.7e-5. Where no gradient cancels, the bf16/fp16 terms
    above are orders of magnitude larger."""
    mag = max((r.abs().max().item() for r in ref if r.numel()), default=0.0)
    return max(1e-5, 16 * torch.finfo(torch.float32).eps * mag)


def check_deterministic(B, Sq, Sk, Hq, Hkv, D, causal, dtype, config, deterministic=True, runs=10):
    q, k, v, dout, out, lse = make_inputs(B, Sq, Sk, Hq, Hkv, D, causal, dtype, 1234)
    first = flash_attn_bwd(dout, q, k, v, out, lse, None, causal, True, config)
    same = 0
    for _ in range(runs - 1):
        again = flash_attn_bwd(dout, q, k, v, out, lse, None, causal, True, config)
        same += all(torch.equal(a, b) for a, b in zip(first, again))
    torch.cuda.synchronize()
    # Reproducible and right: a deterministic kernel that is wrong the same way each time fails.
    right, info = grads_match_reference(first, q, k, v, dout, causal, 1.0 / math.sqrt(dims(D)[0]))
    return same == runs - 1 and right, dict(identical_runs=same + 1, runs=runs, **info)


SHAPES = [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1), (2, 128, 128, 2, 2), (3, 65, 1, 2, 1)]
VARIANTS = [
    {}, dict(tile_m=128), dict(tile_m=128, dv_operand="smem", ds_stages=1, stages=1), dict(dv_operand="smem"),
    dict(stages=1), dict(ds_stages=1),
    dict(dq_accum="red_v2"),
    dict(dq_accum="red"), dict(spt_order=False), dict(head_swizzle=4), dict(ds_store="sts"),
    dict(tile_m=128, dq_split="rows"), dict(dkv_store="direct"),
]
# Deterministic configs checked for bitwise identity: the default and the knobs that change the
# order or the path of the dQ / dK / dV adds or the tiles they come from.
DET_SHAPES = [(2, 1000, 1000, 4, 4), (1, 777, 1333, 8, 2), (1, 2048, 2048, 16, 16)]
DET_VARIANTS = [{}, dict(dq_accum="red_v2"), dict(ds_store="sts"), dict(dq_split="rows"), dict(dkv_store="direct")]


def variant_shape(var):
    """Where a knob change is checked: GQA (dK/dV summed over 4 query heads each), except dkv_store,
    whose choice exists only with one K/V head per query head."""
    return (1, 1000, 1000, 8, 8) if "dkv_store" in var else (1, 1000, 1000, 8, 2)


def problem_for(sh, D, causal, det):
    B, Sq, Sk, Hq, Hkv = sh
    return Problem(B, Sq, Sk, Hq, Hkv, *dims(D), causal=causal, deterministic=det, pass_="bwd")


def default_for(sh, D, causal, det, **change):
    """The default config of this very problem (GQA changes it: dK/dV by reductions, not TMA),
    with the knob ``change`` applied."""
    return dataclasses.replace(default_config(problem_for(sh, D, causal, det)), **change)


def with_knob(sh, D, causal, det, knob, value, **change):
    """The problem's default with ``change`` and ``knob`` at ``value``, where the default's own value of
    the knob is its declared one (a measured default may already set it, e.g. q_starts 16 at hd128):
    a knob's test must run a config that the knob changes and violations() accepts, else ValueError."""
    declared = {f.name: f.default for f in dataclasses.fields(BwdConfigSm90)}
    base = default_for(sh, D, causal, det, **{**change, knob: declared[knob]})
    cfg = dataclasses.replace(base, **{knob: value})
    if cfg == base:
        raise ValueError(f"{knob}={value!r} is the default of {sh} hd{label(D)}: the test would not run the knob")
    bad = violations(cfg, problem_for(sh, D, causal, det))
    if bad:
        raise ValueError(f"{knob}={value!r} on {sh} hd{label(D)} is infeasible: {bad}")
    return cfg


def exchanged(prob: Problem, **change):
    """The problem's default config with cluster_exchange on and the knob ``change``: gqa_reduce
    'atomic' under GQA (the pair walks no head group), then, where violations() refuses it, dK/dV
    by element stores ('atomic' GQA), one dS buffer (hd192: the peer's tiles take the room of the
    second), a one-deep ring (hd256 beside per-thread dQ adds); never undoing ``change``."""
    spt, swizzle = default_launch_order(prob, "atomic")
    # (hd192's default is the queries-on-M tiling, not built with the exchange: the 64-key split's.)
    base = dataclasses.replace(default_config(prob, queries_on_m=False), cluster_exchange=True, gqa_reduce="atomic",
                               spt_order=spt, head_swizzle=swizzle)
    base = dataclasses.replace(base, **change)
    for fix in ({}, dict(dkv_store="direct"), dict(ds_stages=1), dict(ds_stages=1, dkv_store="direct"),
                dict(ds_stages=1, stages=1), dict(ds_stages=1, stages=1, dkv_store="direct")):
        if set(fix) & set(change):
            continue
        cfg = dataclasses.replace(base, **fix)
        if not violations(cfg, prob):
            return cfg
    raise ValueError(f"no exchanged config for {prob}: {violations(base, prob)}")


def case(kind, sh, D, causal, det, **change):
    return (kind, sh, D, causal, det, default_for(sh, D, causal, det, **change))


def correctness(quick, det_only=False, only=None, hds=(64, 128)):
    """The grid below; with ``only`` (a list of knob overrides), just those variants of the
    default, each on the quick shapes and, where deterministic, the bitwise-identity cases."""
    if only is not None:
        return correctness_of(only, hds)
    cases = []
    for D in hds:
        for causal in (False, True):
            for det in ((True,) if det_only else (False, True)):
                shapes = SHAPES[:3] if quick else SHAPES + [(1, 4096, 4096, 8, 8)]
                for sh in shapes:
                    cases.append(case("grad", sh, D, causal, det))
                for var in VARIANTS[1:]:
                    cases.append(case("grad", variant_shape(var), D, causal, det, **var))
                if det:
                    for sh in DET_SHAPES:
                        for var in DET_VARIANTS:
                            cases.append(case("det", sh, D, causal, det, **var))
    return run_cases(cases)


def correctness_of(variants, hds):
    cases = []
    for D in hds:
        for causal in (False, True):
            for var in variants:
                var = dict(var)
                det = bool(var.pop("deterministic", False))  # the problem's flag, not a knob
                cases += [case("grad", sh, D, causal, det, **var) for sh in SHAPES[:3]]
                if det:
                    cases += [case("det", sh, D, causal, det, **var) for sh in (DET_SHAPES[0], DET_SHAPES[2])]
    return run_cases(cases)


def run_cases(cases):
    results, n_ok = [], 0
    # A knob change equal to the shape's default (dkv_store 'direct' under GQA) is the same case twice.
    cases = list(dict.fromkeys(cases))
    for kind, sh, D, causal, det, cfg in cases:
        bad = violations(cfg, problem_for(sh, D, causal, det))
        if bad:
            print(f"SKIP {kind} {sh} D={label(D)} causal={causal}: infeasible ({'; '.join(bad)[:160]})", flush=True)
            continue
        try:
            fn = check_case if kind == "grad" else check_deterministic
            ok, info = fn(*sh, D, causal, torch.bfloat16, cfg, det)
        except Exception as e:  # noqa: BLE001 - report and keep going
            ok, info = False, dict(exception=f"{type(e).__name__}: {e}"[:400])
        n_ok += ok
        rec = dict(kind=kind, shape=sh, D=label(D), causal=causal, deterministic=det, config=dataclasses.asdict(cfg),
                   ok=ok, **info)
        results.append(rec)
        print(("PASS " if ok else "FAIL ") + json.dumps({k: rec[k] for k in rec if k != "config"}, default=str)
              + ("" if ok else "  cfg=" + json.dumps(rec["config"])), flush=True)
    print(f"correctness: {n_ok}/{len(results)} passed", flush=True)
    return results


def bench(seqlens, hds, variants=(), ref_det=True):
    import triton.testing as tt
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def timed(run):
        run()
        return tt.do_bench(run, warmup=20, rep=200, return_mode="median")

    rows = []
    for seqlen, D, causal in ((s, d, c) for s in seqlens for d in hds for c in (False, True)):
        d, dv = dims(D)
        B, H = max(1, 16384 // seqlen), 2048 // d
        q, k, v, dout, out, lse = make_inputs(B, seqlen, seqlen, H, H, D, causal, torch.bfloat16, 7)
        flops = Problem(B, seqlen, seqlen, H, H, d, dv, causal=causal, pass_="bwd").flops
        row = dict(S=seqlen, D=label(D), causal=causal)
        runs = {}
        for det in (False, True):
            runs[f"ours{' det' if det else ''}"] = (
                lambda det=det: flash_attn_bwd(dout, q, k, v, out, lse, None, causal, det)
            )
        for var in variants:
            name = "ours " + json.dumps(var, separators=(",", ":"))
            var = dict(var)
            det = bool(var.pop("deterministic", False))  # the problem's flag, not a knob
            prob = problem_of(q, k, v, causal, pass_="bwd", deterministic=det)
            cfg = dataclasses.replace(default_config(prob), **var)
            if not violations(cfg, prob):
                runs[name] = (
                    lambda cfg=cfg, det=det: flash_attn_bwd(dout, q, k, v, out, lse, None, causal, det, cfg)
                )
        try:
            from flash_attn.cute import flash_attn_func as ref_fa4

            for det in ((False, True) if ref_det else (False,)):
                qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
                o = ref_fa4(qr, kr, vr, causal=causal, deterministic=det)
                o = o[0] if isinstance(o, tuple) else o
                runs[f"ref FA4{' det' if det else ''}"] = (
                    lambda o=o, qr=qr, kr=kr, vr=vr: torch.autograd.grad(o, (qr, kr, vr), dout, retain_graph=True)
                )
        except Exception as e:  # noqa: BLE001
            print("reference FA4 unavailable:", str(e)[:200])
        for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("FA2", SDPBackend.FLASH_ATTENTION)):
            try:
                qs, ks, vs = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
                dos = dout.transpose(1, 2)
                runs[name] = lambda o=o, qs=qs, ks=ks, vs=vs, dos=dos: torch.autograd.grad(
                    o, (qs, ks, vs), dos, retain_graph=True
                )
            except Exception as e:  # noqa: BLE001
                print(f"{name} unavailable:", str(e)[:200])
        for name, run in runs.items():
            try:
                row[name] = flops / timed(run) / 1e9
            except Exception as e:  # noqa: BLE001
                row[name] = None
                print(f"{name} failed at S={seqlen} D={label(D)} causal={causal}: {e}"[:300])
        rows.append(row)
        ours, det, ref = row.get("ours"), row.get("ours det"), row.get("ref FA4")
        extra = ""
        if ours and ref:
            extra += f" ours/ref={ours / ref:.3f}"
        if ours and det:
            extra += f" det/non-det={det / ours:.3f}"
        print("BENCH " + json.dumps(row) + extra, flush=True)
    print("\n| S | hd | causal | ours | ours det | det/non-det | ref FA4 | ref FA4 det | ours/ref | cuDNN | FA2 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def f(x):
        return f"{x:.0f}" if x else "-"

    for r in rows:
        o, d, rf = r.get("ours"), r.get("ours det"), r.get("ref FA4")
        print(f"| {r['S']} | {r['D']} | {r['causal']} | {f(o)} | {f(d)} | {d / o if o and d else 0:.3f} | {f(rf)} | "
              f"{f(r.get('ref FA4 det'))} | {o / rf if o and rf else 0:.3f} | {f(r.get('cuDNN'))} | {f(r.get('FA2'))} |")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--det-only", action="store_true", help="correctness of the deterministic configs only")
    ap.add_argument("--seqlens", default="8192", help="comma list, e.g. 1024,2048,4096,8192,16384 (16k tokens each)")
    ap.add_argument("--hds", default="64,128", help="comma list of head_dim or head_dim:head_dim_v, e.g. 96,192:128")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-ref-det", action="store_true", help="time the reference FA4 non-deterministic only")
    ap.add_argument("--check-variants-only", action="store_true",
                    help="correctness of the --variants only (on the --hds), instead of the whole grid")
    ap.add_argument("--variants", default="[]",
                    help='JSON list of knob overrides of the default config, each timed: [{"ds_stages":1},{"deterministic":true,"head_swizzle":8}]')
    a = ap.parse_args()
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    from fa4.fingerprint import source_fingerprint

    # The kernels these numbers are of: the demo and the dashboard label rows with it.
    print("fa4 source:", source_fingerprint(), flush=True)
    res = {}
    if not a.no_check:
        only = json.loads(a.variants) if a.check_variants_only else None
        res["correctness"] = correctness(a.quick, a.det_only, only, tuple(parse_hds(a.hds)))
    if not a.no_bench:
        res["bench"] = bench([int(s) for s in a.seqlens.split(",")], parse_hds(a.hds), json.loads(a.variants),
                             ref_det=not a.no_ref_det)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
    if "correctness" in res and not all(r["ok"] for r in res["correctness"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
