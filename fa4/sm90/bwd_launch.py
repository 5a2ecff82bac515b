"""Host side of the Hopper backward: buffers, compile cache, the three launches.

    dq, dk, dv = flash_attn_bwd(dout, q, k, v, out, lse, causal=True, deterministic=True)

fa4.flash_attn_func's autograd calls launch_bwd (through fa4.launch._backward, with the config
the forward call resolved from the lookup chain); bench/check_bwd.py checks it on a GPU.
"""

from __future__ import annotations

import math

import torch

from fa4.arch import SM90
from fa4.common import softcap_bwd
from fa4.common.constants import LOG2_E
from fa4.compile_cache import compiled
from fa4.knobs import as_config, runtime_args
from fa4.problem import Problem
from fa4.tensors import DTYPES, check_bwd_head_dims, device_guard, problem_of, validate
from fa4.sm90.bwd_compile import (
    compile_bwd_main,
    compile_bwd_post,
    compile_bwd_post_dq,
    compile_bwd_pre,
    SEQ_PAD,
    compile_key,
    padded,
)
from fa4.sm90.bwd_config import BwdConfigSm90, dkv_sums, violations
from fa4.sm90.bwd_defaults import default_config
from fa4.common.bwd_schedule import dq_zero_rows

# The preprocess's row count where every dQ accumulator row is zeroed (no first-turn stores).
ZERO_ALL_ROWS = 2**31 - 1


def right_bound(causal: bool, has_window_right: bool, window_right: int) -> int:
    """The right bound as dq_zero_rows takes it (window_flags' output): 0 causal, -1 none."""
    return 0 if causal else (window_right if has_window_right else -1)


def varlen_zero_tile(config: BwdConfigSm90, deterministic: bool) -> int:
    """The varlen preprocess's det_tile_m: deterministic, each sequence's dQ rows to zero are
    computed on the device from its lengths (the host knows only the longest); 0 zeroes every row."""
    return config.tile_m if deterministic else 0

def resolve_config(problem: Problem, config) -> BwdConfigSm90:
    """``config`` (None: the heuristic default) as a feasible BwdConfigSm90 for ``problem``."""
    config = as_config(BwdConfigSm90, default_config(problem, SM90) if config is None else config)
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
    **features,
):
    """Gradients (dq, dk, dv) of softmax(q k^T * scale) v given the forward's out and lse.

    Shapes as fa4.flash_attn_func: q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv),
    out/dout (B, Sq, Hq, Dv), lse (B, Hq, Sq) fp32 natural log. Causal is bottom-right aligned.
    ``features``: launch_bwd's dlse, window_left, window_right, softcap, sink (then dsink is
    returned fourth).
    """
    validate(q, k, v)
    check_bwd_head_dims(q, v)
    o_shape = (*q.shape[:3], v.shape[3])
    for name, t in (("dout", dout), ("out", out)):
        if tuple(t.shape) != o_shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must be {o_shape} (q's batch, seqlen, heads; v's head_dim) with q's dtype "
                             "and device")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if lse.shape != (q.shape[0], q.shape[2], q.shape[1]) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be fp32 of shape {(q.shape[0], q.shape[2], q.shape[1])}")
    config = resolve_config(problem_of(q, k, v, causal, pass_="bwd", deterministic=deterministic), config)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[3])
    return launch_bwd(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, config, **features)


def window_flags(causal: bool, window_left, window_right, seqlen_q: int | None = None,
                 seqlen_k: int | None = None) -> tuple[bool, bool, bool, int, int]:
    """(causal, has_window_left, has_window_right, window_left, window_right) for the kernel from
    the bounds (-1 or None: unbounded). Causal is right = 0: a right bound beside it is dropped
    (one kernel for causal, whatever window_right says), and a right bound of 0 is causal (the
    Mistral-style window (left, 0) runs the causal kernel, as the reference does). With the
    sequence lengths, a bound that hides no key is dropped too (left >= seqlen_k, right >=
    seqlen_q): no mask work for it, and no Int32 overflow of a huge bound in the kernel's tile
    arithmetic."""
    left = -1 if window_left is None else int(window_left)
    right = -1 if window_right is None else int(window_right)
    if seqlen_k is not None and left >= seqlen_k:
        left = -1
    if seqlen_q is not None and right >= seqlen_q:
        right = -1
    causal = causal or right == 0
    has_right = right >= 0 and not causal
    return causal, left >= 0, has_right, max(left, 0), right if has_right else 0


class _Plan:
    """Everything of a backward launch that is a pure function of its key (shapes, dtypes, device,
    flags, config, scale): the compiled kernels, their scalar arguments and the buffer sizes. Built
    once per key; a launch with a plan allocates its buffers (three allocations at most) and calls
    the kernels."""

    __slots__ = ("pre", "main", "post_dq", "post", "post_v", "main_scalars", "gqa", "last", "ws", "acc", "sems",
                 "f32", "zero_rows", "kv_zeros")
    # gqa: dK/dV are fp32 accumulators (GQA with gqa_reduce 'atomic'); 'loop' stores them like MHA.
    # last: gqa_finish 'last_cta', the main kernel finishes them (not zeroed, no postprocess).

    def __init__(self, q, k, v, softmax_scale, causal, deterministic, config, has_dlse, window_left,
                 window_right, softcap, has_sink):
        dtype = DTYPES[q.dtype]
        b, sq, hq, d = q.shape
        sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
        gqa = hq != hkv
        sums = dkv_sums(config, gqa)  # the kernel's answer too (fa4.sm90.bwd)
        self.gqa = atomic = sums != "store"
        self.last = last = sums == "last_cta"
        # 'postprocess' sums: zeroed, unless deterministic, where the first head's CTA stores its tiles.
        self.kv_zeros = not deterministic
        causal, has_wl, has_wr, wl, wr = window_flags(bool(causal), window_left, window_right, sq, sk)
        has_softcap = bool(softcap) and softcap > 0
        softcap_inv, softcap_log2 = softcap_bwd.host_args(softmax_scale, softcap if has_softcap else 0.0)
        key = compile_key(dtype, d, bool(causal), gqa, bool(deterministic), config, dv, has_wl, has_wr,
                          has_softcap, has_sink)
        self.main = compiled(key, lambda: compile_bwd_main(key))
        # The keys of before dLSE (and head_dim_v) existed name the plain preprocess.
        pre_key = ("bwd_pre", dtype, d) + ((dv,) if dv != d else ()) + (("dlse",) if has_dlse else ()) + (
            ("sink",) if has_sink else ())
        self.pre = compiled(pre_key, lambda: compile_bwd_pre(dtype, d, head_dim_v=dv, has_dlse=has_dlse,
                                                             has_sink=has_sink))
        if sums == "bulk":
            # The sums' tiles are in the fragment order of dK's (2, 1, 1) x (64, d) MMA, dQ 'rows''s at
            # tile_n rows (dv == d: bwd_config.violations): the dQ postprocess converts them.
            self.post = compiled(("bwd_post_dq", dtype, d, config.tile_n, "rows"),
                                 lambda: compile_bwd_post_dq(dtype, d, config.tile_n, "rows"))
            self.post_v = self.post
        else:
            self.post = compiled(("bwd_post", dtype, d), lambda: compile_bwd_post(dtype, d))
            self.post_v = self.post if dv == d else compiled(("bwd_post", dtype, dv),
                                                             lambda: compile_bwd_post(dtype, dv))
        # (cluster_exchange: the accumulator's tiles are two column halves; keys of before it unchanged.)
        pair = config.cluster_exchange
        self.post_dq = compiled(
            ("bwd_post_dq", dtype, d, config.tile_m, config.dq_split) + (("pair",) if pair else ()),
            lambda: compile_bwd_post_dq(dtype, d, config.tile_m, config.dq_split, pair=pair),
        )
        self.main_scalars = (softmax_scale * LOG2_E, softmax_scale, wl, wr, softcap_inv, softcap_log2, 0,
                             *runtime_args(config))
        sq_pad, sk_pad = padded(sq), padded(sk)
        # Deterministic: the first dQ turn of a query tile stores, so only the tiles no key tile
        # reaches need zeros (the prefix where rows see no key), not the whole accumulator.
        self.zero_rows = sq_pad
        if deterministic:
            self.zero_rows = dq_zero_rows(sq, sk, config.tile_m, right_bound(causal, has_wr, wr))
        # One fp32 workspace for LSE * log2(e), D and the dQ accumulator (the preprocess writes all
        # three, the dQ accumulator's zeros included): (sizes, shapes) of its views. Each starts at
        # a multiple of SEQ_PAD elements, so every view keeps the 16-byte alignment TMA needs.
        # With a sink, a fourth view: each row's term of the sink's gradient (the preprocess's).
        rows = b * hq * sq_pad
        views = ((b, hq, sq_pad), (b, hq, sq_pad), (b, hq, sq_pad, d)) + (((b, hq, sq_pad),) if has_sink else ())
        self.ws = (rows * (2 + d + has_sink), _layout(views))
        # GQA 'atomic': dK and dV accumulate in fp32 over a group's query heads (zeroed), then are
        # converted; 'loop' CTAs own a (key tile, K/V head) and store the finished tiles.
        self.acc = (b * hkv * sk_pad * (d + dv), _layout(((b, hkv, sk_pad, d), (b, hkv, sk_pad, dv)))) if atomic else None
        # int32 semaphores, zeroed: deterministic dQ turns; GQA 'atomic' dK/dV turns (deterministic) or
        # 'last_cta''s ticket counters.
        self.sems = None
        if deterministic or last:
            nq = b * hq * _round4(-(-sq // config.tile_m)) if deterministic else 0
            kv = atomic and (deterministic or last)
            nkv = b * hkv * _round4(-(-sk // config.tile_n)) if kv else 0
            self.sems = (nq + nkv, nq, (b, hq, _round4(-(-sq // config.tile_m))) if deterministic else None,
                         (b, hkv, _round4(-(-sk // config.tile_n))) if kv else None)
        self.f32 = torch.float32


def _layout(shapes) -> tuple:
    """(shape, stride, offset) of contiguous views of ``shapes`` laid end to end in one buffer:
    computed once per plan, so a launch makes each view with one as_strided (a slice then a
    view cost the host twice as much, per call)."""
    out, at = [], 0
    for shape in shapes:
        stride, acc = [], 1
        for n in reversed(shape):
            stride.append(acc)
            acc *= n
        out.append((tuple(shape), tuple(reversed(stride)), at))
        at += acc
    return tuple(out)


def _views(buf: torch.Tensor, layout) -> list[torch.Tensor]:
    return [buf.as_strided(shape, stride, offset) for shape, stride, offset in layout]


def _semaphores(sems, dev):
    """(sem_q, sem_kv) views of one zeroed int32 buffer (deterministic mode), or (None, None)."""
    if sems is None:
        return None, None
    buf = torch.zeros(sems[0], device=dev, dtype=torch.int32)
    sem_kv = buf[sems[1]:].view(sems[3]) if sems[3] is not None else None
    return (buf[:sems[1]].view(sems[2]) if sems[2] is not None else None), sem_kv


def _row_stats(lse, dlse):
    """LSE and its gradient as the preprocess reads them: unit inner stride, dLSE in fp32."""
    if lse.stride(-1) != 1:
        lse = lse.contiguous()
    if dlse is not None:
        dlse = dlse.to(torch.float32)
        if dlse.stride(-1) != 1:
            dlse = dlse.contiguous()
    return lse, dlse


_plans: dict = {}


def launch_bwd(dout, q, k, v, out, lse, softmax_scale: float, causal: bool, deterministic: bool,
               config: BwdConfigSm90, dlse=None, window_left=-1, window_right=-1, softcap: float = 0.0,
               sink=None):
    """The three launches, for inputs and a config already checked (fa4.flash_attn_func's
    autograd resolved them at the forward call; flash_attn_bwd above checks them itself).

    ``dlse``: the gradient of the returned LSE (B, Hq, Sq), or None where the loss does not use it.
    Issue 18's features, with the forward's meaning (fa4.common.masking_range): ``window_left`` /
    ``window_right`` (-1 or None: unbounded), ``softcap`` (0: none), ``sink`` (Hq,) learnable
    sink logits; with a sink the result is (dq, dk, dv, dsink), dsink in the sink's dtype.
    """
    key = (q.shape, k.shape, v.shape, q.dtype, q.device, causal, deterministic, config, dlse is not None,
           window_left, window_right, softcap, sink is not None, softmax_scale)
    plan = _plans.get(key)
    if plan is None:
        plan = _Plan(q, k, v, softmax_scale, causal, deterministic, config, dlse is not None, window_left,
                     window_right, softcap, sink is not None)
        if len(_plans) > 4096:
            _plans.clear()
        _plans[key] = plan
    dev = q.device
    f32 = plan.f32
    lse2, dsum, dq_acc, *sink_term = _views(torch.empty(plan.ws[0], device=dev, dtype=f32), plan.ws[1])
    sink_term = sink_term[0] if sink_term else None
    dq = torch.empty_like(q)
    dk = dv_ = None
    if plan.last:
        # The first CTA of each group stores its tiles: the sums need no zeros.
        dk_out, dv_out = _views(torch.empty(plan.acc[0], device=dev, dtype=f32), plan.acc[1])
        dk, dv_ = torch.empty_like(k), torch.empty_like(v)
    elif plan.gqa:
        dk_out, dv_out = _views((torch.zeros if plan.kv_zeros else torch.empty)(plan.acc[0], device=dev, dtype=f32),
                                plan.acc[1])
    else:
        dk_out = torch.empty_like(k)
        dv_out = torch.empty_like(v)
    sem_q, sem_kv = _semaphores(plan.sems, dev)
    lse, dlse = _row_stats(lse, dlse)
    with _on_device(q):
        plan.pre(out, dout, lse, lse2, dsum, dq_acc, dlse, None, None, _sink_arg(sink), sink_term, 0, plan.zero_rows,
                 None, None, -1)
        plan.main(q, k, v, dout, lse2, dsum, dq_acc, dk_out, dv_out, sem_q, sem_kv, dk, dv_, None, None, None, None,
                  *plan.main_scalars)
        plan.post_dq(dq_acc, dq, softmax_scale, None, None, 0)
        if plan.last:
            dk_out, dv_out = dk, dv_
        elif plan.gqa:
            dk = torch.empty_like(k)
            dv_ = torch.empty_like(v)
            # dK was scaled in the main kernel; dV needs none.
            plan.post(dk_out, dk, 1.0, None, None, 0)
            plan.post_v(dv_out, dv_, 1.0, None, None, 0)
            dk_out, dv_out = dk, dv_
        if sink is None:
            return dq, dk_out, dv_out
        return dq, dk_out, dv_out, sink_grad(sink, sink_term)


def _sink_arg(sink):
    """The sink logits as the preprocess reads them: fp32, contiguous, 16-byte aligned (or None)."""
    if sink is None:
        return None
    s = sink.float().contiguous()
    return s if s.data_ptr() % 16 == 0 else s.clone()


def sink_grad(sink: torch.Tensor, sink_term: torch.Tensor) -> torch.Tensor:
    """dsink_h = -sum over batch and rows of exp(sink_h - LSE) * D, D = rowsum(dO * O) - dLSE (the
    sink's share of each row's softmax times the row's D). The preprocess wrote each row's term
    (0 on padded rows and rows that saw nothing); one fixed-order sum: deterministic."""
    return sink_term.sum(dim=(0, 2)).to(sink.dtype)


class _VarlenPlan:
    """A packed-sequence backward launch's key-pure part (as _Plan): the varlen kernels, their
    scalars and the sizes of the side buffers, whose rows are each sequence's padded region
    (fa4.common.varlen.padded_offset: whole SEQ_PAD tiles per sequence, so the main kernel loads
    and reduces whole tiles and the dQ accumulator keeps its fragment-ordered tiles)."""

    __slots__ = ("pre", "main", "post_dq", "post", "post_v", "main_scalars", "gqa", "ws", "acc", "sems", "f32",
                 "zero_tile", "zero_right")

    def __init__(self, q, k, v, b, max_seqlen_q, max_seqlen_k, used_q, used_k, softmax_scale, causal, deterministic,
                 config, has_dlse, window_left, window_right, softcap, has_sink):
        from fa4.common.varlen import padded_total

        dtype = DTYPES[q.dtype]
        tq, hq, d = q.shape
        tk, hkv, dv = k.shape[0], k.shape[1], v.shape[2]
        self.gqa = gqa = hq != hkv
        # The longest lengths bound every sequence's: a bound that hides no key of the longest hides none.
        causal, has_wl, has_wr, wl, wr = window_flags(bool(causal), window_left, window_right, max_seqlen_q,
                                                      max_seqlen_k)
        has_softcap = bool(softcap) and softcap > 0
        softcap_inv, softcap_log2 = softcap_bwd.host_args(softmax_scale, softcap if has_softcap else 0.0)
        key = compile_key(dtype, d, bool(causal), gqa, bool(deterministic), config, dv, has_wl, has_wr,
                          has_softcap, has_sink, varlen=True, seqused_q=used_q, seqused_k=used_k)
        self.main = compiled(key, lambda: compile_bwd_main(key))
        # Deterministic: the first dQ turn stores, and each sequence's rows to zero come from its
        # lengths on the device (a variant reading cu_seqlens_k / seqused_k).
        self.zero_tile = zero_tile = varlen_zero_tile(config, deterministic)
        self.zero_right = right_bound(causal, has_wr, wr)
        pre_key = ("bwd_pre_varlen", dtype, d, dv, has_dlse, used_q) + (("sink",) if has_sink else ()) + (
            (("zero_tile", zero_tile, used_k),) if zero_tile else ())
        self.pre = compiled(pre_key, lambda: compile_bwd_pre(dtype, d, head_dim_v=dv, has_dlse=has_dlse, varlen=True,
                                                             seqused=used_q, has_sink=has_sink, det_tile_m=zero_tile,
                                                             seqused_k=used_k))
        self.post = compiled(("bwd_post_varlen", dtype, d, used_k),
                             lambda: compile_bwd_post(dtype, d, varlen=True, seqused=used_k))
        self.post_v = self.post if dv == d else compiled(
            ("bwd_post_varlen", dtype, dv, used_k), lambda: compile_bwd_post(dtype, dv, varlen=True, seqused=used_k))
        self.post_dq = compiled(
            ("bwd_post_dq_varlen", dtype, d, config.tile_m, config.dq_split, used_q),
            lambda: compile_bwd_post_dq(dtype, d, config.tile_m, config.dq_split, varlen=True, seqused=used_q),
        )
        self.main_scalars = (softmax_scale * LOG2_E, softmax_scale, wl, wr, softcap_inv, softcap_log2, max_seqlen_k,
                             *runtime_args(config))
        tq_pad, tk_pad = padded_total(tq, b, SEQ_PAD), padded_total(tk, b, SEQ_PAD)
        views = ((1, hq, tq_pad), (1, hq, tq_pad), (1, hq, tq_pad, d)) + (((1, hq, tq_pad),) if has_sink else ())
        self.ws = (hq * tq_pad * (2 + d + has_sink), _layout(views))
        self.acc = (hkv * tk_pad * (d + dv), _layout(((1, hkv, tk_pad, d), (1, hkv, tk_pad, dv)))) if gqa else None
        self.sems = None
        if deterministic:
            # Turns per (sequence, head, tile): the sequence is the semaphores' batch index.
            nm, nn = _round4(-(-max_seqlen_q // config.tile_m)), _round4(-(-max_seqlen_k // config.tile_n))
            nq, nkv = b * hq * nm, (b * hkv * nn if gqa else 0)
            self.sems = (nq + nkv, nq, (b, hq, nm), (b, hkv, nn) if gqa else None)
        self.f32 = torch.float32


_varlen_plans: dict = {}
# The launch's device context; a name of its own so CPU tests of the host path can stand it in
# (tests/fa4/test_varlen_bwd_host.py), as fa4.varlen's.
_on_device = device_guard


def launch_bwd_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                      seqused_q, seqused_k, softmax_scale: float, causal: bool, deterministic: bool,
                      config: BwdConfigSm90, dlse=None, window_left=-1, window_right=-1, softcap: float = 0.0,
                      sink=None):
    """Gradients of a packed-sequence forward (fa4.varlen), for inputs already checked there.

    q (total_q, Hq, D), k/v (total_k, Hkv, D/Dv), out/dout (total_q, Hq, Dv), lse and ``dlse``
    (Hq, total_q) fp32; cu_seqlens_q/k (B+1,), seqused_q/k (B,) or None, int32 with 16-byte
    aligned bases. Returns (dq, dk, dv), and dsink fourth with a ``sink``. Rows no sequence uses
    (past seqused) get zero gradients; empty sequences touch nothing."""
    b = cu_seqlens_q.shape[0] - 1
    tq, tk = q.shape[0], k.shape[0]
    if b == 0 or tq == 0 or tk == 0 or max_seqlen_q == 0 or max_seqlen_k == 0:
        # No (query, key) pair: zero gradients, no launch (a zero grid is an error).
        grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v))
        return grads + ((torch.zeros_like(sink),) if sink is not None else ())
    key = (q.shape, k.shape, v.shape, q.dtype, q.device, b, max_seqlen_q, max_seqlen_k, seqused_q is not None,
           seqused_k is not None, causal, deterministic, config, dlse is not None, window_left, window_right, softcap,
           sink is not None, softmax_scale)
    plan = _varlen_plans.get(key)
    if plan is None:
        plan = _VarlenPlan(q, k, v, b, max_seqlen_q, max_seqlen_k, seqused_q is not None, seqused_k is not None,
                           softmax_scale, causal, deterministic, config, dlse is not None, window_left, window_right,
                           softcap, sink is not None)
        if len(_varlen_plans) > 4096:
            _varlen_plans.clear()
        _varlen_plans[key] = plan
    dev = q.device
    f32 = plan.f32
    lse2, dsum, dq_acc, *sink_term = _views(torch.empty(plan.ws[0], device=dev, dtype=f32), plan.ws[1])
    sink_term = sink_term[0] if sink_term else None
    if sink_term is not None:
        # The sink's gradient sums over the whole buffer: rows outside every sequence's written
        # tiles (no preprocess CTA reaches them) must add 0.
        sink_term.zero_()
    # Rows past seqused are never written by the kernels: zeros, as the reference leaves them.
    dq = torch.zeros_like(q) if seqused_q is not None else torch.empty_like(q)
    new_k = torch.zeros_like if seqused_k is not None else torch.empty_like
    if plan.gqa:
        dk_out, dv_out = _views(torch.zeros(plan.acc[0], device=dev, dtype=f32), plan.acc[1])
    else:
        dk_out, dv_out = new_k(k).unsqueeze(0), new_k(v).unsqueeze(0)
    sem_q, sem_kv = _semaphores(plan.sems, dev)
    lse, dlse = _row_stats(lse, dlse)
    if dlse is not None:
        dlse = dlse.unsqueeze(0)
    q4, k4, v4, o4, do4 = (t.unsqueeze(0) for t in (q, k, v, out, dout))
    with _on_device(q):
        plan.pre(o4, do4, lse.unsqueeze(0), lse2, dsum, dq_acc, dlse, cu_seqlens_q, seqused_q, _sink_arg(sink),
                 sink_term, max_seqlen_q, ZERO_ALL_ROWS, cu_seqlens_k if plan.zero_tile else None,
                 seqused_k if plan.zero_tile else None, plan.zero_right)
        plan.main(q4, k4, v4, do4, lse2, dsum, dq_acc, dk_out, dv_out, sem_q, sem_kv, None, None, cu_seqlens_q,
                  cu_seqlens_k,
                  seqused_q, seqused_k, *plan.main_scalars)
        plan.post_dq(dq_acc, dq.unsqueeze(0), softmax_scale, cu_seqlens_q, seqused_q, max_seqlen_q)
        if plan.gqa:
            dk, dv_ = new_k(k), new_k(v)
            # dK was scaled in the main kernel; dV needs none.
            plan.post(dk_out, dk.unsqueeze(0), 1.0, cu_seqlens_k, seqused_k, max_seqlen_k)
            plan.post_v(dv_out, dv_.unsqueeze(0), 1.0, cu_seqlens_k, seqused_k, max_seqlen_k)
        else:
            dk, dv_ = dk_out[0], dv_out[0]
    if sink is None:
        return dq, dk, dv_
    return dq, dk, dv_, sink_grad(sink, sink_term)
