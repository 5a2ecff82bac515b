"""Packed varlen under torch.compile: fa4::varlen_fwd / fa4::varlen_bwd on the CPU machine, the
kernels replaced by the per-sequence models of test_varlen_host / test_varlen_bwd_host (the GPU
faked). A compiled call keeps both ops in its graphs (fullgraph: no break), and its output, LSE and
every gradient equal the eager call's bit for bit; both run the same models, so equality checks the
argument mapping across the op boundary, and the eager gradients are checked against the fp32
reference per sequence."""

from __future__ import annotations

import math

import pytest
import torch

import fa4
from tests.fa4 import test_varlen_bwd_host as bwd_host
from tests.fa4.test_varlen_bwd_host import assert_close, packed, reference

# Both directions' kernels replaced by the CPU models (fixtures of test_varlen_bwd_host).
fake_bwd = bwd_host.fake_bwd
fake_gpu = bwd_host.fake_gpu

CASES = [
    pytest.param([90, 0, 1, 140], [90, 4, 1, 100], 4, 2, dict(causal=True), False, None, id="causal-gqa-0-1"),
    pytest.param([70, 33], [50, 81], 4, 4, dict(causal=False, window_size=(20, 5), softcap=6.0), True, "bf16",
                 id="window-softcap-bf16sink"),
    pytest.param([64, 129, 3], None, 8, 2, dict(causal=True, window_size=(30, 0)), True, "fp32", id="causal-window"),
]


def _leaves(q, k, v, s, sink_dtype):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if s is not None:
        leaves.append(s.to(torch.bfloat16 if sink_dtype == "bf16" else torch.float32, copy=True).requires_grad_())
    return leaves


@pytest.mark.parametrize("lens_q,lens_k,hq,hkv,feat,sink,sink_dtype", CASES)
def test_compile_fullgraph_goes_through_the_ops_and_matches_eager(fake_gpu, lens_q, lens_k, hq, hkv, feat, sink,
                                                                  sink_dtype):
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    torch._dynamo.reset()
    q, k, v, dout, s, dl, cq, ck = packed(lens_q, lens_k, hq, hkv, sink=sink, dlse=True)
    max_q, max_k = max(lens_q), max(lens_k or lens_q)

    def f(q, k, v, sink):
        o, lse = fa4.flash_attn_varlen_func(q, k, v, cq, ck, max_q, max_k, learnable_sink=sink, return_lse=True,
                                            **feat)
        return (o.float() * dout.float()).sum() + (lse * dl).sum(), o, lse

    runs = []
    for fn in (f, torch.compile(f, backend=(backend := AotEagerAndRecordGraphs()), fullgraph=True)):
        leaves = _leaves(q, k, v, s, sink_dtype)
        loss, o, lse = fn(*leaves[:3], leaves[3] if sink else None)
        loss.backward()
        runs.append((o.detach(), lse.detach(), [t.grad for t in leaves], leaves))
    fw_ops = {n.target for g in backend.fw_graphs for n in g.graph.nodes}
    bw_ops = {n.target for g in backend.bw_graphs for n in g.graph.nodes}
    assert torch.ops.fa4.varlen_fwd.default in fw_ops and torch.ops.fa4.varlen_bwd.default in bw_ops
    (o_e, lse_e, g_e, leaves), (o_c, lse_c, g_c, _) = runs
    assert torch.equal(o_c, o_e) and torch.equal(lse_c, lse_e)
    for a, b, t in zip(g_e, g_c, leaves):
        assert b is not None and b.dtype == t.dtype and torch.equal(a, b)
    # The eager gradients (so the compiled ones) against the fp32 reference per sequence.
    window = feat.get("window_size", (None, None))
    f32 = dict(causal=feat["causal"] or window[1] == 0, window_left=-1 if window[0] is None else window[0],
               window_right=-1 if window[1] in (None, 0) else window[1], softcap=feat.get("softcap", 0.0))
    s_used = leaves[3].detach().float() if sink else None
    _, _, want = reference(q, k, v, dout, s_used, dl, cq, ck, out=o_e, **f32)
    assert_close([g.float() for g in g_e], want)


def test_compiled_call_without_grad_and_seqused(fake_gpu):
    """No gradient (inference under compile): the forward op alone; rows past seqused_q are zeros."""
    torch._dynamo.reset()
    q, k, v, _, _, _, cq, ck = packed([100, 60], [80, 60], 4, 2)
    uq, uk = torch.tensor([70, 60], dtype=torch.int32), torch.tensor([80, 10], dtype=torch.int32)

    def f(q, k, v):
        return fa4.flash_attn_varlen_func(q, k, v, cq, ck, 70, 80, seqused_q=uq, seqused_k=uk, causal=True)

    with torch.no_grad():
        o_e = f(q, k, v)
        o_c = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    assert torch.equal(o_c, o_e)
    assert torch.equal(o_c[70:100], torch.zeros_like(o_c[70:100])) and o_c[:70].abs().sum() > 0


def test_empty_batch_under_compile_gives_zeros(fake_gpu):
    """No query row: zeros, LSE -inf and zero gradients through both ops, and no kernel built."""
    torch._dynamo.reset()
    q, k, v, _, _, _, _, _ = packed([5], [5], 4, 4)
    none = torch.zeros(1, dtype=torch.int32)
    leaves = [t[:0].clone().requires_grad_() for t in (q, k, v)]

    def f(q, k, v):
        return fa4.flash_attn_varlen_func(q, k, v, none, none, 0, 0, causal=True, return_lse=True)

    o, lse = torch.compile(f, backend="aot_eager", fullgraph=True)(*leaves)
    assert o.shape == (0, 4, 64) and lse.shape == (4, 0)
    (o.float().sum() + lse.sum()).backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in leaves)
    assert not any(isinstance(key, tuple) or getattr(key, "varlen", False) for key in fake_gpu)


def test_fake_outputs_follow_the_kernels_allocation():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(300, 8, 192, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(500, 2, 192, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(500, 2, 128, dtype=torch.bfloat16, device="cuda")
        cu = torch.empty(4, dtype=torch.int32, device="cuda")
        out, lse = torch.ops.fa4.varlen_fwd(q, k, v, cu, cu, 200, 300, None, None, None, True, -1, -1, 0.0, None,
                                            None, False, None)
        assert out.shape == (300, 8, 128) and out.dtype == q.dtype and out.is_contiguous()
        assert lse.shape == (8, 300) and lse.dtype == torch.float32
        sink = torch.empty(8, dtype=torch.float32, device="cuda")
        dq, dk, dv, dsink = torch.ops.fa4.varlen_bwd(torch.empty_like(out), q, k, v, out, lse, cu, cu, 200, 300,
                                                     None, None, 0.1, True, False, None, None, -1, -1, 0.0, sink)
        assert (dq.shape, dk.shape, dv.shape, dsink.shape) == (q.shape, k.shape, v.shape, (8,))
        *_, dsink = torch.ops.fa4.varlen_bwd(torch.empty_like(out), q, k, v, out, lse, cu, cu, 200, 300, None, None,
                                             0.1, True, False, None, None, -1, -1, 0.0, None)
        assert dsink.shape == (0,)


def test_opcheck_with_cpu_launches(fake_gpu):
    q, k, v, dout, s, _, cq, ck = packed([37, 0, 50], [40, 3, 50], 4, 2, sink=True)
    args = (q, k, v, cq, ck, 50, 50, None, None, 1 / math.sqrt(64), True, 10, -1, 5.0, s, None, False, None)
    torch.library.opcheck(torch.ops.fa4.varlen_fwd, args)
    out, lse = torch.ops.fa4.varlen_fwd(*args)
    torch.library.opcheck(torch.ops.fa4.varlen_bwd, (dout, q, k, v, out, lse, cq, ck, 50, 50, None, None,
                                                     1 / math.sqrt(64), True, False, None, None, 10, -1, 5.0, s))
