"""GPU check of our forward kernel: correctness grid, then a side-by-side timing table.

Correctness: fresh random inputs per case; output poisoned with NaN before the run;
error vs an fp32 reference must be <= 2 x PyTorch's own same-dtype error + 1e-4
(the FlashAttention rule); rows that see no key must be exactly 0 with LSE -inf.
Timing: triton.testing.do_bench median, peers in the same process; FLOPs 2*B*H*Sq*Sk*(d+dv),
halved when causal.

    python bench/check_fwd.py [--quick] [--no-bench] [--out results.json]
    python bench/check_fwd.py --quick --hds 96,192,192v128,256   # head dims "d" or "dvdv"
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import time

import torch

import fa4
from fa4.sm90.fwd_config import default_config
from fa4.problem import Problem


def reference(q, k, v, causal, scale, dtype=torch.float32):
    """Attention in `dtype` (SDPA math layout (B, H, S, D)); GQA by repeating K/V heads."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    qq = q.to(dtype).transpose(1, 2)
    kk = k.to(dtype).transpose(1, 2).repeat_interleave(rep, dim=1)
    vv = v.to(dtype).transpose(1, 2).repeat_interleave(rep, dim=1)
    s = torch.matmul(qq, kk.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Sk - Sq), float("-inf"))
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.softmax(s.float(), dim=-1).to(dtype)
    p = torch.nan_to_num(p, nan=0.0)  # rows with no visible key: FlashAttention returns 0
    o = torch.matmul(p, vv).transpose(1, 2)
    return o, lse


def head_dims(spec: str) -> list[tuple[int, int]]:
    """"64,192v128" -> [(64, 64), (192, 128)]: (head_dim, head_dim_v) pairs."""
    out = []
    for item in spec.split(","):
        d, _, dv = item.strip().partition("v")
        out.append((int(d), int(dv or d)))
    return out


def check_case(B, Sq, Sk, Hq, Hkv, D, causal, dtype, config, scale_mult=1.0, Dv=None):
    Dv = Dv or D
    seed = int(time.time() * 1e6) % (2**31)
    torch.manual_seed(seed)
    q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=dtype) * scale_mult
    k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dtype) * scale_mult
    v = torch.randn(B, Sk, Hkv, Dv, device="cuda", dtype=dtype)
    scale = 1.0 / math.sqrt(D)
    out = torch.full((B, Sq, Hq, Dv), float("nan"), device="cuda", dtype=dtype)
    o, lse = fa4.flash_attn_func(q, k, v, provider="fa4", causal=causal, return_lse=True, config=config, out=out)
    torch.cuda.synchronize()
    ref, ref_lse = reference(q, k, v, causal, scale, torch.float32)
    low, _ = reference(q, k, v, causal, scale, dtype)
    err = (o.float() - ref).abs().max().item()
    err_pt = (low.float() - ref).abs().max().item()
    nan = torch.isnan(o).any().item()
    fin = torch.isfinite(ref_lse)
    lse_err = (lse[fin] - ref_lse[fin]).abs().max().item() if fin.any() else 0.0
    lse_masked_ok = bool((lse[~fin] == float("-inf")).all().item()) if (~fin).any() else True
    ok = (not nan) and err <= 2 * err_pt + 1e-4 and lse_err <= 1e-3 and lse_masked_ok
    return ok, dict(seed=seed, err=err, err_torch=err_pt, lse_err=lse_err, nan=nan, lse_masked_ok=lse_masked_ok)


def correctness(quick, base_change=None, dims=((64, 64), (128, 128))):
    D_ = default_config
    cases = []
    for D, Dv in dims:
        for causal in (False, True):
            base = dataclasses.replace(D_(Problem.standard(1024, D, head_dim_v=Dv, causal=causal)), **(base_change or {}))
            shapes = [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1), (2, 128, 128, 2, 2)]
            if not quick:
                shapes += [(1, 4096, 4096, 8, 8), (3, 65, 1, 2, 1)]
            for sh in shapes:
                cases.append((sh, D, Dv, causal, torch.bfloat16, base, 1.0))
            variants = [
                dict(pingpong="off"), dict(pingpong="mma_exp"), dict(intra_wg_overlap=False, pingpong="mma"),
                dict(exp2_emu_frac=0.375), dict(tau=8.0), dict(tile_n=64), dict(kv_stages=3, tile_n=96),
                dict(p_operand="smem" if base.p_operand == "rmem" else "rmem"),
                dict(sched_order="natural", head_swizzle=4), dict(persistent=not base.persistent),
                dict(persistent=not base.persistent, sched_order="natural", head_swizzle=4),
            ]
            for var in variants:
                cfg = dataclasses.replace(base, **var)
                cases.append(((1, 1000, 1000, 8, 2), D, Dv, causal, torch.bfloat16, cfg, 1.0))
            # Large-magnitude scores: the row max jumps on many KV tiles (exercises tau).
            cases.append(((1, 2048, 2048, 4, 4), D, Dv, causal, torch.bfloat16, dataclasses.replace(base, tau=8.0), 4.0))
            cases.append(((1, 1000, 1000, 4, 4), D, Dv, causal, torch.float16, dataclasses.replace(base, tau=8.0), 2.0))
    results = []
    n_ok = 0
    for sh, D, Dv, causal, dtype, cfg, mult in cases:
        from fa4.sm90.fwd_config import violations
        B, Sq, Sk, Hq, Hkv = sh
        prob = Problem(B, Sq, Sk, Hq, Hkv, D, Dv, "bf16" if dtype == torch.bfloat16 else "fp16", causal)
        if violations(cfg, prob):
            continue
        try:
            ok, info = check_case(B, Sq, Sk, Hq, Hkv, D, causal, dtype, cfg, mult, Dv)
        except Exception as e:  # noqa: BLE001 - report and keep going
            ok, info = False, dict(exception=f"{type(e).__name__}: {e}"[:300])
        n_ok += ok
        rec = dict(shape=sh, D=D, Dv=Dv, causal=causal, dtype=str(dtype), scale_mult=mult, config=dataclasses.asdict(cfg),
                   ok=ok, **info)
        results.append(rec)
        print(("PASS " if ok else "FAIL ") + json.dumps({k: rec[k] for k in rec if k != "config"}) +
              ("" if ok else "  cfg=" + json.dumps(rec["config"])), flush=True)
    print(f"correctness: {n_ok}/{len(results)} passed", flush=True)
    return results


def bench(seqlens, dims, variants=()):
    import triton.testing as tt

    providers = {}
    providers["fa4 (ours)"] = lambda q, k, v, c: fa4.flash_attn_func(q, k, v, provider="fa4", causal=c)

    def ours_with(change):
        # The config is built once per shape, not inside the timed call.
        @functools.lru_cache(maxsize=None)
        def config_for(seqlen, d, dv, causal):
            return dataclasses.replace(default_config(Problem.standard(seqlen, d, head_dim_v=dv, causal=causal)),
                                       **change)

        def run(q, k, v, c):
            return fa4.flash_attn_func(q, k, v, provider="fa4", causal=c, config=config_for(q.shape[1], q.shape[3], v.shape[3], c))
        return run

    for change in variants:
        providers["ours " + json.dumps(change, separators=(",", ":"))] = ours_with(change)
    try:
        from flash_attn.cute import flash_attn_func as ref_fa4

        providers["ref FA4"] = lambda q, k, v, c: ref_fa4(q, k, v, causal=c)
    except Exception as e:  # noqa: BLE001
        print("reference FA4 unavailable:", e)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    def sdpa(backend):
        def run(q, k, v, c):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=c)
        return run

    providers["cuDNN"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    providers["FA2"] = sdpa(SDPBackend.FLASH_ATTENTION)
    rows = []
    for D, Dv in dims:
        for S in seqlens:
            for causal in (False, True):
                B, H = max(1, 16384 // S), 2048 // D
                q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(B, S, H, Dv, device="cuda", dtype=torch.bfloat16)
                flops = 2 * B * H * S * S * (D + Dv) / (2 if causal else 1)
                row = dict(S=S, D=D, causal=causal) if Dv == D else dict(S=S, D=D, Dv=Dv, causal=causal)
                for name, fn in providers.items():
                    try:
                        fn(q, k, v, causal)
                        ms = tt.do_bench(lambda: fn(q, k, v, causal), warmup=50, rep=300, return_mode="median")
                        row[name] = flops / ms / 1e9
                    except Exception as e:  # noqa: BLE001
                        row[name] = None
                        print(f"{name} failed at {row}: {e}"[:300])
                rows.append(row)
                ours, ref = row.get("fa4 (ours)"), row.get("ref FA4")
                ratio = f"{ours / ref:.3f}" if ours and ref else "-"
                print("BENCH " + json.dumps(row) + f" ours/ref={ratio}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--seqlens", default="8192")
    ap.add_argument("--hds", default="64,128", help="head dims checked and timed: d, or dvdv for head_dim_v "
                    "!= head_dim (e.g. 64,96,128,192,192v128,256)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--base", default="{}", help="knob changes applied to every correctness case, e.g. "
                    "'{\"persistent\": true}'")
    ap.add_argument("--variants", default="[]", help="JSON list of knob changes timed beside the default")
    a = ap.parse_args()
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    from fa4.fingerprint import source_fingerprint

    # The kernels these numbers are of: the demo and the dashboard label rows with it.
    print("fa4 source:", source_fingerprint(), flush=True)
    res = {}
    if not a.no_check:
        res["correctness"] = correctness(a.quick, json.loads(a.base), head_dims(a.hds))
    if not a.no_bench:
        res["bench"] = bench([int(s) for s in a.seqlens.split(",")], head_dims(a.hds), json.loads(a.variants))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    if "correctness" in res and not all(r["ok"] for r in res["correctness"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
