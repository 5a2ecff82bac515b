"""The backward with issue 18's features (sliding window, softcap, learnable sink, the LSE's
gradient) against PyTorch autograd in fp32, and its timing against the reference FA4.

Reference: the attention equations with autograd (window masks bottom-right aligned, softcap
c * tanh(s / c) of the scaled score, the sink an extra logit in the softmax denominator),
in fp32 (the yardstick) and in the input dtype (PyTorch's own error). Error rule as
bench/check_bwd.py: max |ours - fp32| <= 2 x max |PyTorch same-dtype - fp32| + 2 ulp. The
forward's out and lse come from the fp32 reference (the forward with these features is
another helper's), so the check is the backward's alone.

    python bench/check_bwd_feat.py [--no-check] [--no-bench]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from fa4.problem import Problem

NEG_INF = float("-inf")


def visible(sq: int, sk: int, causal: bool, window_left: int, window_right: int, device=None) -> torch.Tensor:
    """(Sq, Sk) bool: query i sees key j (offset o = Sk - Sq; -1 = unbounded; causal: right 0)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    o = sk - sq
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    right = 0 if causal else window_right
    if causal or window_right >= 0:
        ok &= j <= i + o + right
    if window_left >= 0:
        ok &= j >= i + o - window_left
    return ok


def attention(q, k, v, scale, causal=False, window_left=-1, window_right=-1, softcap=0.0, sink=None):
    """(out (B, Sq, H, Dv), lse (B, H, Sq)) in q's dtype (lse in fp32 or wider), with autograd."""
    sq, sk = q.shape[1], k.shape[1]
    rep = q.shape[2] // k.shape[2]
    qq = q.transpose(1, 2)
    kk = k.transpose(1, 2).repeat_interleave(rep, dim=1)
    vv = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    s = torch.matmul(qq, kk.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible(sq, sk, causal, window_left, window_right, q.device), NEG_INF)
    if sink is not None:
        s_all = torch.cat([s, sink.to(s.dtype)[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
    else:
        s_all = s
    # Rows that see nothing (no key, no sink): LSE -inf, zero output and zero gradients, no NaN.
    empty = torch.isinf(s_all).all(-1, keepdim=True)
    lse = torch.logsumexp(s_all.masked_fill(empty, 0.0), dim=-1, keepdim=True)
    p = torch.exp(s - lse.masked_fill(empty, 0.0)).masked_fill(empty, 0.0)
    out = torch.matmul(p.to(q.dtype), vv).transpose(1, 2)
    return out, lse.squeeze(-1).masked_fill(empty.squeeze(-1), NEG_INF)


def reference_grads(q, k, v, dout, dlse, dtype, sink=None, **feat):
    """(dq, dk, dv[, dsink]) of attention(...) in ``dtype`` for upstream (dout, dlse or None)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    if sink is not None:
        leaves.append(sink.detach().to(torch.promote_types(dtype, torch.float32)).requires_grad_())
    out, lse = attention(*leaves[:3], sink=leaves[3] if sink is not None else None, **feat)
    outs, grads = [out], [dout.to(dtype)]
    if dlse is not None:
        outs.append(lse)
        grads.append(dlse.to(lse.dtype))
    return torch.autograd.grad(outs, leaves, grads)


def make_inputs(B, Sq, Sk, Hq, Hkv, d, dtype, seed, sink=False, dlse=False, device="cuda", **feat):
    """q, k, v, dout, out, lse (the fp32 reference's forward, out in dtype), sink, dlse."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Sq, Hq, d, device=device, dtype=dtype, generator=g)
    k = torch.randn(B, Sk, Hkv, d, device=device, dtype=dtype, generator=g)
    v = torch.randn(B, Sk, Hkv, d, device=device, dtype=dtype, generator=g)
    dout = torch.randn(B, Sq, Hq, d, device=device, dtype=dtype, generator=g)
    s = torch.randn(Hq, device=device, generator=g) * 2 if sink else None
    dl = torch.randn(B, Hq, Sq, device=device, generator=g) if dlse else None
    with torch.no_grad():
        out, lse = attention(q.float(), k.float(), v.float(), 1 / math.sqrt(d), sink=s, **feat)
    return q, k, v, dout, out.to(dtype), lse.float().contiguous(), s, dl


def rounded_out_grads(q, k, v, dout, dlse, out, sink=None, **feat):
    """The fp32 gradients a FlashAttention backward computes exactly from the ``out`` it is given
    (in q's dtype): its D = rowsum(dO * O) - dLSE then carries dO . (out - O_fp32) per row, which
    enters dS = P (dP - D) exactly like a change of dLSE by -dO . (out - O_fp32). PyTorch's
    autograd never forms D, so its same-dtype error misses this term; it dominates where a row's
    P k does not average out (few keys and a sink, e.g. causal Sk = 1: dq = P (1 - P) dP k scale
    of one key, with |D's error| ~ |dO| |O| 2^-9 against a dq that the sink makes small)."""
    exact, _ = attention(q.float(), k.float(), v.float(), sink=None if sink is None else sink.float(), **feat)
    shift = (dout.float() * (out.float() - exact)).sum(-1).transpose(1, 2)  # (B, H, Sq)
    shift = torch.nan_to_num(shift)
    base = torch.zeros_like(shift) if dlse is None else dlse.float()
    return reference_grads(q, k, v, dout, base - shift, torch.float32, sink=sink, **feat)


def grads_match(grads, q, k, v, dout, dlse, sink=None, out=None, **feat):
    """The error rule for each gradient; NaN never passes. With ``out`` (the forward's output the
    backward was given, in q's dtype), the yardstick is the larger of PyTorch's same-dtype error
    and the error that out's rounding alone forces on any backward using D = rowsum(dO * O)
    (rounded_out_grads): the kernel is held to 2x whichever is larger."""
    ref = reference_grads(q, k, v, dout, dlse, torch.float32, sink=sink, **feat)
    low = reference_grads(q, k, v, dout, dlse, q.dtype, sink=sink, **feat)
    floor = rounded_out_grads(q, k, v, dout, dlse, out, sink=sink, **feat) if out is not None else None
    names = ("dq", "dk", "dv", "dsink")[: len(ref)]
    info, ok = {}, len(grads) == len(ref)
    for i, (name, g, r, lo) in enumerate(zip(names, grads, ref, low)):
        err = (g.float() - r).abs().max().item() if g.numel() else 0.0
        err_pt = (lo.float() - r).abs().max().item() if g.numel() else 0.0
        err_out = (floor[i].float() - r).abs().max().item() if floor is not None and g.numel() else 0.0
        ulp = (r.to(q.dtype).float() - r).abs().max().item() if g.numel() else 0.0
        nan = bool(torch.isnan(g).any().item())
        good = (not nan) and g.shape == r.shape and err <= 2 * max(err_pt, err_out) + 2 * ulp + 1e-5
        info[name] = dict(err=err, err_torch=err_pt, err_rounded_out=err_out, nan=nan, ok=good)
        ok &= good
    return ok, info


def default_for(q, k, v, causal, deterministic=False, softcap=0.0, *, window_left=-1, window_right=-1, sink=False,
                **change):
    """The default backward config of the problem with its features (the one flash_attn_func
    resolves for it), with the knob ``change``; asserted feasible for that problem. A test that
    runs a window or a sink passes it here too: the default of the problem without them can be
    infeasible with them (q_starts 16 at hd128 under a window, session 42's dry run)."""
    import dataclasses

    from fa4.sm90.bwd_config import violations

    from fa4.sm90.bwd_defaults import default_config
    from fa4.tensors import problem_of

    problem = problem_of(q, k, v, causal, pass_="bwd", deterministic=deterministic, window_left=window_left,
                         window_right=window_right, softcap=softcap, sink=sink)
    config = dataclasses.replace(default_config(problem), **change)
    if softcap and config.tile_m == 128:  # violations(): softcap needs tile_m 64
        config = dataclasses.replace(config, tile_m=64, dq_split="head_dim")
    assert not violations(config, problem), violations(config, problem)
    return config


def problem_features(kw: dict) -> dict:
    """default_for's feature arguments out of a test's check_case keywords."""
    return {n: kw[n] for n in ("softcap", "window_left", "window_right", "sink") if n in kw}


def run_ours(q, k, v, dout, out, lse, sink, dlse, causal, deterministic=False, config=None, **feat):
    from fa4.sm90.bwd_launch import launch_bwd

    if config is None:
        config = default_for(q, k, v, causal, deterministic, **problem_features(feat), sink=sink is not None)
    return launch_bwd(dout, q, k, v, out, lse, 1 / math.sqrt(q.shape[3]), causal, deterministic, config,
                      dlse=dlse, sink=sink, **{n: feat[n] for n in ("window_left", "window_right", "softcap")
                                               if n in feat})


def check_case(B, Sq, Sk, Hq, Hkv, d, dtype=torch.bfloat16, causal=False, sink=False, dlse=False,
               deterministic=False, config=None, device="cuda", seed=None, **feat):
    if seed is None:
        seed = int(time.time() * 1e6) % (2**31)
    feat = dict(causal=causal, **feat)
    q, k, v, dout, out, lse, s, dl = make_inputs(B, Sq, Sk, Hq, Hkv, d, dtype, seed, sink, dlse, device=device,
                                                 **feat)
    kw = {n: x for n, x in feat.items() if n != "causal"}
    grads = run_ours(q, k, v, dout, out, lse, s, dl, causal, deterministic, config, **kw)
    if device == "cuda":
        torch.cuda.synchronize()
    ok, info = grads_match(grads, q, k, v, dout, dl, sink=s, out=out, scale=1 / math.sqrt(d), **feat)
    return ok, {"seed": seed, **info}


def check_deterministic(B, Sq, Sk, Hq, Hkv, d, dtype=torch.bfloat16, causal=False, sink=False, runs=10,
                        config=None, dlse=True, **feat):
    """Ten deterministic backwards (dlse included) on the same inputs: bitwise equal, and right."""
    feat = dict(causal=causal, **feat)
    q, k, v, dout, out, lse, s, dl = make_inputs(B, Sq, Sk, Hq, Hkv, d, dtype, 1234, sink, dlse, **feat)
    kw = {n: x for n, x in feat.items() if n != "causal"}

    def once():
        return run_ours(q, k, v, dout, out, lse, s, dl, causal, True, config, **kw)

    first = once()
    same = sum(all(torch.equal(a, b) for a, b in zip(first, once())) for _ in range(runs - 1))
    torch.cuda.synchronize()
    right, info = grads_match(first, q, k, v, dout, dl, sink=s, out=out, scale=1 / math.sqrt(d), **feat)
    return same == runs - 1 and right, dict(identical_runs=same + 1, runs=runs, **info)


# -- timing against the reference FA4 (issue 18's shapes) -----------------------------------------

BENCH = [
    # name, (B, S, H, d), causal, ours' features, the reference's keywords
    ("window(1023,0)", (1, 16384, 16, 128), False, dict(window_left=1023, window_right=0),
     dict(window_size=(1023, 0))),
    ("softcap30", (2, 8192, 16, 128), True, dict(softcap=30.0), dict(softcap=30.0)),
    ("sink", (2, 8192, 16, 128), True, dict(sink=True), dict(learnable_sink=True)),
    ("causal", (2, 8192, 16, 128), True, {}, {}),
]


def unmasked_pairs(S: int, causal: bool, window_left=-1, window_right=-1) -> int:
    """Visible (query, key) pairs of an S x S problem: the FLOPs' region (Problem.visible_pairs)."""
    return Problem(1, S, S, 1, 1, 64, 64, causal=causal, window_left=window_left,
                   window_right=window_right).visible_pairs()


def _reference_bwd(q, k, v, out, dout, lse, scale, causal, ref_kw):
    """The reference FA4's backward launch itself (what its autograd Function's backward calls, with
    the same arguments), so both sides are timed as launches on saved tensors."""
    from flash_attn.cute.interface import _flash_attn_bwd

    left, right = ref_kw.get("window_size", (None, None))
    return _flash_attn_bwd(q, k, v, out, dout, lse, scale, causal, ref_kw.get("softcap", 0.0),
                           window_size_left=left, window_size_right=right,
                           learnable_sink=ref_kw.get("learnable_sink"))


def bench():
    import triton.testing as tt

    from flash_attn.cute import flash_attn_func as ref_fa

    from fa4.launch import bwd_config_for
    from fa4.sm90.bwd_launch import launch_bwd

    rows = []
    for name, (B, S, H, d), causal, ours_feat, ref_kw in BENCH:
        try:
            dtype = torch.bfloat16
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, S, H, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
            dout = torch.randn(B, S, H, d, device="cuda", dtype=dtype, generator=g)
            sink = torch.randn(H, device="cuda", generator=g, dtype=torch.float32) if ours_feat.get("sink") else None
            ref_kw = dict(ref_kw)
            if "learnable_sink" in ref_kw:
                ref_kw["learnable_sink"] = sink
            scale = 1 / math.sqrt(d)
            # The reference's forward gives both sides' out and lse (same inputs, same math).
            with torch.no_grad():
                res = ref_fa(q, k, v, causal=causal, return_lse=True, **ref_kw)
            out, lse = res[0], res[1].float().contiguous()
            feat = {n: x for n, x in ours_feat.items() if n != "sink"}
            # The config a flash_attn_func call's backward resolves (the features in its problem).
            config = bwd_config_for(q, k, v, causal, False, None, sink=sink is not None, **feat)

            def ours():
                return launch_bwd(dout, q, k, v, out, lse, scale, causal, False, config, sink=sink, **feat)

            def ref():
                return _reference_bwd(q, k, v, out, dout, lse, scale, causal, ref_kw)

            # Both sides agree before they are timed (the same gradients within bf16 noise).
            a, b = ours(), ref()
            diff = max((x.float() - y.float()).abs().max().item() / max(y.float().abs().max().item(), 1e-6)
                       for x, y in zip(a, b))
            t_ours = tt.do_bench(ours, warmup=10, rep=100, return_mode="median")
            t_ref = tt.do_bench(ref, warmup=10, rep=100, return_mode="median")
            pairs = unmasked_pairs(S, causal, feat.get("window_left", -1), feat.get("window_right", -1))
            flops = 2.5 * 2 * 2 * B * H * pairs * d
            row = dict(name=name, B=B, S=S, H=H, d=d, causal=causal, ours_ms=t_ours, ref_ms=t_ref,
                       ours_tflops=flops / t_ours / 1e9, ref_tflops=flops / t_ref / 1e9, ratio=t_ref / t_ours,
                       max_rel_diff_vs_ref=diff, config=str(config))
            print(f"{name:16s} ours {row['ours_tflops']:6.0f} TFLOP/s ({t_ours:.3f} ms)  reference "
                  f"{row['ref_tflops']:6.0f} ({t_ref:.3f} ms)  ours/ref {row['ratio']:.3f}  "
                  f"max rel diff {diff:.2e}", flush=True)
        except Exception as e:  # one failing shape must not hide the others
            row = dict(name=name, error=f"{type(e).__name__}: {e}")
            print(f"{name:16s} FAILED {row['error']}", flush=True)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = [] if args.no_bench else bench()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
