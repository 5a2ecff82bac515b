"""Host side of the Hopper backward: buffers, compile cache, the three launches.

    dq, dk, dv = flash_attn_bwd(dout, q, k, v, out, lse, causal=True, deterministic=True)

fa4.flash_attn_func's autograd calls it (through fa4.interface._backward, with the config
from the lookup chain); bench/check_bwd.py checks it on a GPU.
"""

from __future__ import annotations

import math
import threading

import torch

from fa4.arch import SM90
from fa4.interface import _DTYPES, check_bwd_head_dims, validate
from fa4.knobs import config_from_dict
from fa4.problem import Problem
from fa4.sm90.bwd_compile import (
    compile_bwd_main,
    compile_bwd_post,
    compile_bwd_post_dq,
    compile_bwd_pre,
    compile_key,
    padded,
)
from fa4.sm90.bwd_config import BwdConfigSm90, default_config, violations

_LOG2E = 1.4426950408889634
_compiled: dict = {}
_lock = threading.Lock()


def _get(key, build):
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                fn = build()
                _compiled[key] = fn
    return fn


def bwd_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, deterministic: bool) -> Problem:
    return Problem(
        batch=q.shape[0], seqlen_q=q.shape[1], seqlen_k=k.shape[1], heads_q=q.shape[2], heads_kv=k.shape[2],
        head_dim=q.shape[3], head_dim_v=v.shape[3], dtype=_DTYPES[q.dtype], causal=bool(causal),
        deterministic=bool(deterministic), pass_="bwd",
    )


def resolve_config(problem: Problem, config) -> BwdConfigSm90:
    if config is None:
        config = default_config(problem, SM90)
    elif isinstance(config, dict):
        config = config_from_dict(BwdConfigSm90, config)
    if not isinstance(config, BwdConfigSm90):
        raise ValueError("config must be a BwdConfigSm90 or a dict of its knobs")
    bad = violations(config, problem, SM90)
    if bad:
        raise ValueError("infeasible config: " + "; ".join(bad))
    return config


def _round4(n: int) -> int:
    # int32 semaphore rows are 16-byte aligned (the kernel's fake tensors promise it).
    return (n + 3) // 4 * 4


def flash_attn_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    deterministic: bool = False,
    config=None,
):
    """Gradients (dq, dk, dv) of softmax(q k^T * scale) v given the forward's out and lse.

    Shapes as fa4.flash_attn_func: q/out/dout (B, Sq, Hq, D), k/v (B, Sk, Hkv, D), lse
    (B, Hq, Sq) fp32 natural log. Causal is bottom-right aligned.
    """
    validate(q, k, v)
    check_bwd_head_dims(q, v)
    for name, t in (("dout", dout), ("out", out)):
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must match q in shape, dtype and device")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if lse.shape != (q.shape[0], q.shape[2], q.shape[1]) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be fp32 of shape {(q.shape[0], q.shape[2], q.shape[1])}")
    problem = bwd_problem(q, k, v, causal, deterministic)
    config = resolve_config(problem, config)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[3])
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    gqa = hq != hkv
    key = compile_key(problem.dtype, d, problem.causal, gqa, config)
    main = _get(key, lambda: compile_bwd_main(key))
    pre = _get(("pre", problem.dtype, d), lambda: compile_bwd_pre(problem.dtype, d))
    post = _get(("post", problem.dtype, d), lambda: compile_bwd_post(problem.dtype, d))
    post_dq = _get(
        ("post_dq", problem.dtype, d, config.tile_m, config.dq_split),
        lambda: compile_bwd_post_dq(problem.dtype, d, config.tile_m, config.dq_split),
    )

    dev = q.device
    f32 = torch.float32
    sq_pad, sk_pad = padded(sq), padded(sk)
    lse2 = torch.empty(b, hq, sq_pad, device=dev, dtype=f32)
    dsum = torch.empty(b, hq, sq_pad, device=dev, dtype=f32)
    dq_acc = torch.empty(b, hq, sq_pad, d, device=dev, dtype=f32)  # zeroed by the preprocess
    dq = torch.empty_like(q)
    if gqa:
        dk_out = torch.zeros(b, hkv, sk_pad, d, device=dev, dtype=f32)
        dv_out = torch.zeros(b, hkv, sk_pad, d, device=dev, dtype=f32)
    else:
        dk_out = torch.empty_like(k)
        dv_out = torch.empty_like(v)
    sem_q = sem_kv = None
    if config.deterministic:
        num_m = -(-sq // config.tile_m)
        num_n = -(-sk // config.tile_n)
        sem_q = torch.zeros(b, hq, _round4(num_m), device=dev, dtype=torch.int32)
        if gqa:
            sem_kv = torch.zeros(b, hkv, _round4(num_n), device=dev, dtype=torch.int32)
    lse = lse if lse.stride(-1) == 1 else lse.contiguous()
    with torch.cuda.device(dev):
        pre(out, dout, lse, lse2, dsum, dq_acc)
        main(
            q, k, v, dout, lse2, dsum, dq_acc, dk_out, dv_out, sem_q, sem_kv,
            softmax_scale * _LOG2E, softmax_scale, config.head_swizzle, 1 if config.spt_order else 0,
        )
        post_dq(dq_acc, dq, softmax_scale)
        if gqa:
            dk = torch.empty_like(k)
            dv = torch.empty_like(v)
            # dK was scaled in the main kernel; dV needs none.
            post(dk_out, dk, 1.0)
            post(dv_out, dv, 1.0)
            return dq, dk, dv
    return dq, dk_out, dv_out
