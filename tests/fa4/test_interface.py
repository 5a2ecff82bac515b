"""Input validation of fa4.flash_attn_func: clear ValueErrors, never a launch (CPU tensors)."""

import pytest
import torch

from fa4.tensors import tma_ready, validate


def t(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


def check(q, k, v, match, **kw):
    with pytest.raises(ValueError, match=match):
        validate(q, k, v, require_cuda=False, **kw)


def test_cpu_tensors_are_rejected_by_device():
    with pytest.raises(ValueError, match="CUDA"):
        validate(t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64))


@pytest.mark.parametrize("q,k,v,want", [
    # GQA with Sq != Sk; fp16; one query against many keys; MQA at head_dim 64; a strided layout
    # (heads interleaved differently) whose last dimension is still contiguous.
    (t(2, 100, 8, 128), t(2, 77, 2, 128), t(2, 77, 2, 128), (2, 100, 77, 8, 2, 128, "bf16")),
    (t(1, 8, 2, 64, dtype=torch.float16), t(1, 8, 2, 64, dtype=torch.float16), t(1, 8, 2, 64, dtype=torch.float16),
     (1, 8, 8, 2, 2, 64, "fp16")),
    (t(3, 1, 4, 64), t(3, 513, 1, 64), t(3, 513, 1, 64), (3, 1, 513, 4, 1, 64, "bf16")),
    (t(1, 4, 16, 128).transpose(1, 2).contiguous().transpose(1, 2), t(1, 16, 4, 128), t(1, 16, 4, 128),
     (1, 4, 16, 16, 4, 128, "bf16")),
])
def test_good_inputs_pass(q, k, v, want):
    from fa4.tensors import problem_of

    validate(q, k, v, require_cuda=False)  # no error, and the problem it describes:
    p = problem_of(q, k, v, causal=True)
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.dtype) == want
    assert p.head_dim_v == p.head_dim and p.causal and p.pass_ == "fwd"


@pytest.mark.parametrize(
    "q,k,v,match",
    [
        (t(1, 8, 2, 64), t(1, 8, 2, 64, dtype=torch.float16), t(1, 8, 2, 64), "dtype mismatch"),
        (t(1, 8, 2, 64, dtype=torch.float32), t(1, 8, 2, 64, dtype=torch.float32), t(1, 8, 2, 64, dtype=torch.float32), "dtype"),
        (t(1, 8, 2, 80), t(1, 8, 2, 80), t(1, 8, 2, 80), "head_dim 80 is not supported"),
        (t(1, 8, 2, 256), t(1, 8, 2, 256), t(1, 8, 2, 128), "head_dim_v 128 is not supported with head_dim 256"),
        (t(1, 8, 3, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), "multiple of heads_kv"),
        (t(1, 8, 2, 64), t(2, 8, 2, 64), t(2, 8, 2, 64), "batch mismatch"),
        (t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 9, 2, 64), "seqlen differ"),
        (t(8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), "4-D"),
        (t(1, 8, 2, 128), t(1, 8, 2, 64), t(1, 8, 2, 64), "head_dim mismatch"),
    ],
)
def test_bad_inputs_name_the_problem(q, k, v, match):
    check(q, k, v, match)


def test_non_contiguous_last_dim():
    q = t(1, 8, 2, 128)[..., ::2]
    check(q, t(1, 8, 2, 64), t(1, 8, 2, 64), "contiguous in its last dimension")


# -- autograd, the backward's arguments, the custom ops (CPU: launches replaced, see cpu_kernels) --

import dataclasses  # noqa: E402
import math  # noqa: E402

import fa4  # noqa: E402
from fa4 import launch, ops  # noqa: E402
from fa4.knobs import config_from_dict, random_configs  # noqa: E402
from fa4.problem import Problem  # noqa: E402
from fa4.sm90.bwd_config import BwdConfigSm90  # noqa: E402
from fa4.sm90.bwd_defaults import default_config as bwd_default  # noqa: E402
from fa4.sm90.fwd_config import FwdConfigSm90  # noqa: E402
from tests.fa4 import cpu_kernels  # noqa: E402
from tests.fa4.cpu_kernels import check_bwd, forward_math, inputs  # noqa: E402


@pytest.fixture
def calls(monkeypatch):
    return cpu_kernels.install(monkeypatch)


def bwd_problem(q, k, causal, det):
    return Problem(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], q.shape[3],
                   causal=causal, deterministic=det, pass_="bwd")


def assert_grads_match(grads, q, k, v, dout, causal, scale=None):
    scale = scale or 1.0 / math.sqrt(q.shape[3])
    ok, info = check_bwd().grads_match_reference(grads, q.detach(), k.detach(), v.detach(), dout, causal, scale)
    assert ok, info


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(deterministic="yes"), "deterministic must be a bool"),
        (dict(deterministic=1), "deterministic must be a bool"),
        (dict(bwd_config="fast"), "bwd_config must be a BwdConfigSm90"),
        (dict(bwd_config=FwdConfigSm90()), "bwd_config must be a BwdConfigSm90"),
        (dict(bwd_config={"tile_m": 96}), "BwdConfigSm90.tile_m = 96"),
        (dict(bwd_config={"tau": 1}), "unknown knob"),
        (dict(bwd_config=dict(tile_m=128, stages=1, dv_operand="rmem")), "registers"),
    ],
)
def test_backward_arguments_are_checked_at_the_forward_call(calls, kw, match):
    q, k, v, _ = inputs(d=128)
    with pytest.raises(ValueError, match=match):
        fa4.flash_attn_func(q, k, v, **kw)
    assert calls.fwd == []  # rejected before any launch


def test_without_grad_no_backward_work(calls, monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("backward config resolved for a call that needs no gradient")

    monkeypatch.setattr(launch, "bwd_config_for", must_not_run)
    q, k, v, _ = inputs(grad=False)
    out = fa4.flash_attn_func(q, k, v, causal=True, deterministic=True)
    assert out.grad_fn is None and torch.equal(out, forward_math(q, k, v, 1 / 8, True)[0])
    qg, kg, vg, _ = inputs()
    with torch.no_grad():
        out = fa4.flash_attn_func(qg, kg, vg, causal=True)
    assert not out.requires_grad
    assert calls.fwd == [(False, None, False)] * 2  # plain launches: no LSE asked for


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("shape", [(2, 33, 47, 4, 2), (1, 50, 19, 6, 1), (2, 64, 64, 2, 2)])
def test_autograd_runs_our_backward_with_the_looked_up_config(calls, causal, det, shape):
    b, sq, sk, hq, hkv = shape
    q, k, v, dout = inputs(b, sq, sk, hq, hkv)
    out = fa4.flash_attn_func(q, k, v, causal=causal, deterministic=det)
    assert calls.fwd == [(True, None, False)]  # LSE produced for the backward though not asked for
    assert torch.equal(out, forward_math(q, k, v, 1 / 8, causal)[0])
    out.backward(dout)
    assert_grads_match((q.grad, k.grad, v.grad), q, k, v, dout, causal)
    (call,) = calls.bwd
    want = bwd_default(bwd_problem(q, k, causal, det))
    assert call["config"] == want and call["deterministic"] is det and call["causal"] is causal
    assert call["scale"] == 1 / 8 and call["dout"] is dout
    res = fa4.explain(q, k, v, causal, pass_="bwd", deterministic=det)
    assert res.config == want and res.provenance == "default"


@pytest.mark.parametrize("d,dv", [(96, 96), (192, 192), (192, 128), (256, 256)])
def test_later_head_dims_run_our_backward(calls, d, dv):
    """The head dims the backward gained (96, 192, 192/128, 256): autograd resolves their default
    config at the forward call and the backward runs with it, head_dim_v wide where it differs."""
    q, k, v, dout = inputs(1, 40, 56, 4, 2, d=d, dv=dv)
    out = fa4.flash_attn_func(q, k, v, causal=True)
    assert out.shape == (1, 40, 4, dv) and out.grad_fn is not None
    out.backward(dout)
    assert v.grad.shape == v.shape and k.grad.shape == k.shape
    assert_grads_match((q.grad, k.grad, v.grad), q, k, v, dout, True)
    (call,) = calls.bwd
    want = bwd_default(Problem(1, 40, 56, 4, 2, d, dv, causal=True, pass_="bwd"))
    assert call["config"] == want and want.dkv_split == ("keys" if d == 96 else "head_dim")
    res = fa4.explain(q, k, v, True, pass_="bwd")
    assert res.config == want and res.provenance == "default"


def test_gradient_through_the_returned_lse(calls):
    """A loss that uses the LSE sends its gradient to the backward (the preprocess takes it into D);
    one that does not sends None, and the gradients are those of the output alone."""
    feat = cpu_kernels.check_bwd_feat()
    q, k, v, dout = inputs()
    out, lse = fa4.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.requires_grad and lse.requires_grad
    torch.testing.assert_close(lse, forward_math(q, k, v, 1 / 8, True)[1], rtol=0, atol=0)
    w = torch.randn(lse.shape, generator=torch.Generator().manual_seed(3))
    ((out.float() * dout.float()).sum() + (lse * w).sum()).backward()
    assert torch.equal(calls.bwd[0]["dlse"], w)
    ok, info = feat.grads_match((q.grad, k.grad, v.grad), q, k, v, dout, w, scale=1 / 8, causal=True)
    assert ok, info
    with_lse = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    fa4.flash_attn_func(q, k, v, causal=True).backward(dout)
    assert calls.bwd[1]["dlse"] is None
    assert_grads_match((q.grad, k.grad, v.grad), q, k, v, dout, True)
    assert not all(torch.equal(a, t.grad) for a, t in zip(with_lse, (q, k, v)))
    # Only the LSE in the loss: dO is zeros.
    for t in (q, k, v):
        t.grad = None
    out, lse = fa4.flash_attn_func(q, k, v, causal=True, return_lse=True)
    (lse * w).sum().backward()
    assert torch.equal(calls.bwd[2]["dout"], torch.zeros_like(out))
    ok, info = feat.grads_match((q.grad, k.grad, v.grad), q, k, v, torch.zeros_like(dout), w, scale=1 / 8,
                                causal=True)
    assert ok, info


def test_preallocated_out_with_grad(calls):
    q, k, v, dout = inputs()
    buf = torch.zeros_like(q.detach())
    res = fa4.flash_attn_func(q, k, v, out=buf, softmax_scale=0.05)
    assert res is buf and buf.grad_fn is not None
    assert torch.equal(buf, forward_math(q, k, v, 0.05, False)[0])
    buf.backward(dout)
    assert calls.bwd[0]["scale"] == 0.05
    assert_grads_match((q.grad, k.grad, v.grad), q, k, v, dout, False, 0.05)


@pytest.mark.parametrize("layout", ["transposed", "broadcast", "permuted"])
def test_any_dout_layout_reaches_the_kernel_tma_ready(calls, layout):
    q, k, v, _ = inputs()
    out = fa4.flash_attn_func(q, k, v, causal=True)
    b, s, h, d = out.shape
    if layout == "transposed":  # dO with a strided last dimension
        w = torch.randn(b, s, d, h).to(out.dtype)
        (out.transpose(2, 3) * w).float().sum().backward()
        dout = w.transpose(2, 3)
    elif layout == "broadcast":  # out.sum(): every stride 0
        out.float().sum().backward()
        dout = torch.ones_like(out)
    else:  # dense, heads outermost: already fine for TMA, passed as is
        w = torch.randn(b, h, s, d).to(out.dtype)
        (out.transpose(1, 2) * w).float().sum().backward()
        dout = w.transpose(1, 2)
    seen = calls.bwd[0]["dout"]
    assert tma_ready(seen) and torch.equal(seen, dout)
    if layout == "permuted":
        assert seen.stride() == dout.stride()
    assert_grads_match((q.grad, k.grad, v.grad), q, k, v, dout, True)


def test_explicit_bwd_config_and_one_resolution_per_shape(calls, monkeypatch):
    from fa4 import lookup

    asked = []
    real = lookup.resolve_bwd_config
    monkeypatch.setattr(lookup, "resolve_bwd_config", lambda p, a: asked.append(p) or real(p, a))
    q, k, v, dout = inputs()
    for _ in range(3):
        fa4.flash_attn_func(q, k, v, deterministic=True).backward(dout)
    assert len(asked) == 1 and asked[0].pass_ == "bwd" and asked[0].deterministic
    explicit = {"stages": 1, "deterministic": True, "dq_accum": "red_v2"}
    fa4.flash_attn_func(q, k, v, deterministic=True, bwd_config=explicit).backward(dout)
    assert calls.bwd[-1]["config"] == config_from_dict(BwdConfigSm90, explicit) and len(asked) == 1


# -- the custom ops ---------------------------------------------------------------------------


def test_fake_outputs_follow_the_kernels_allocation():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        # q laid out (batch, heads, seqlen, dim) in memory: out must keep that layout, as
        # empty_like in the real launch does.
        q = torch.empty(2, 8, 300, 128, dtype=torch.float16, device="cuda").transpose(1, 2)
        k = torch.empty(2, 500, 2, 128, dtype=torch.float16, device="cuda")
        v = torch.empty(2, 500, 2, 128, dtype=torch.float16, device="cuda")
        out, lse = torch.ops.fa4.fwd(q, k, v, None, True, None, False, None)
        assert (out.shape, out.stride(), out.dtype, out.device.type) == (q.shape, q.stride(), q.dtype, "cuda")
        assert lse.shape == (2, 8, 300) and lse.dtype == torch.float32 and lse.is_contiguous()
        dq, dk, dv, dsink = torch.ops.fa4.bwd(torch.empty_like(q), q, k, v, out, lse, 0.1, True, True, None)
        assert (dq.shape, dq.stride()) == (q.shape, q.stride())
        assert dk.shape == k.shape == dv.shape == (2, 500, 2, 128) and dk.dtype == torch.float16
        assert dsink.shape == (0,)  # no sink: the op's fixed fourth output is empty
        sink = torch.empty(8, dtype=torch.float32, device="cuda")
        *_, dsink = torch.ops.fa4.bwd(torch.empty_like(q), q, k, v, out, lse, 0.1, True, True, None, sink=sink)
        assert dsink.shape == (8,) and dsink.dtype == torch.float32


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(d=80), "head_dim 80"),
        (dict(dtype=torch.float32), "dtype"),
        (dict(hq=3), "multiple of heads_kv"),
        (dict(dout_s=7), "dout must be"),
        (dict(lse_dtype=torch.float16), "lse must be fp32"),
    ],
)
def test_fake_rejects_what_the_kernel_cannot_take(change, match):
    from torch._subclasses.fake_tensor import FakeTensorMode

    d, dtype, hq = change.get("d", 64), change.get("dtype", torch.bfloat16), change.get("hq", 4)
    with FakeTensorMode(), pytest.raises(ValueError, match=match):
        q = torch.empty(1, 16, hq, d, dtype=dtype, device="cuda")
        k = torch.empty(1, 16, 2, d, dtype=dtype, device="cuda")
        if "dout_s" in change or "lse_dtype" in change:
            dout = torch.empty(1, change.get("dout_s", 16), hq, d, dtype=dtype, device="cuda")
            lse = torch.empty(1, hq, 16, dtype=change.get("lse_dtype", torch.float32), device="cuda")
            torch.ops.fa4.bwd(dout, q, k, k, torch.empty_like(q), lse, None, False, False, None)
        else:
            torch.ops.fa4.fwd(q, k, k, None, False, None, False, None)


def test_opcheck_with_cpu_launches(calls):
    q, k, v, dout = inputs(1, 20, 28, 4, 2)
    torch.library.opcheck(torch.ops.fa4.fwd, (q, k, v, None, True, None, True, None))
    out, lse = torch.ops.fa4.fwd(q.detach(), k.detach(), v.detach(), None, True, None, True, None)
    torch.library.opcheck(torch.ops.fa4.bwd, (dout, q.detach(), k.detach(), v.detach(), out, lse, 0.125, True,
                                              True, None))
    # With issue 18's features: the window, softcap and a learnable sink (whose gradient is the
    # backward op's fourth output).
    sink = torch.randn(4, requires_grad=True)
    torch.library.opcheck(torch.ops.fa4.fwd, (q, k, v, None, True, None, False, None, 5, -1, 2.5, sink))
    out, lse = torch.ops.fa4.fwd(q.detach(), k.detach(), v.detach(), None, True, None, False, None, 5, -1, 2.5,
                                 sink.detach())
    torch.library.opcheck(torch.ops.fa4.bwd, (dout, q.detach(), k.detach(), v.detach(), out, lse, 0.125, True,
                                              False, None, None, 5, -1, 2.5, sink.detach()))


def test_config_encoding_round_trips():
    for cls in (FwdConfigSm90, BwdConfigSm90):
        # 5,000 configs drawn from the space (millions: walking it took minutes).
        for c in random_configs(cls, 5000):
            text = ops.encode_config(c)
            assert config_from_dict(cls, ops.decode_config(text)) == c
            assert ops.encode_config(dataclasses.asdict(c)) == text  # a dict of the same knobs: same string
    assert ops.encode_config({"b": 1, "a": 2}) == ops.encode_config({"a": 2, "b": 1})
    assert ops.encode_config(None) is None and ops.decode_config(None) is None


@pytest.mark.parametrize("gqa", [False, True])
def test_compile_fullgraph_goes_through_the_ops_and_matches_eager(calls, gqa):
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    torch._dynamo.reset()
    fwd_cfg = FwdConfigSm90()
    bwd_cfg = {"deterministic": True, "stages": 1}

    def f(q, k, v, w):
        buf = torch.empty_like(q)
        o, lse = fa4.flash_attn_func(q, k, v, causal=True, return_lse=True, config=fwd_cfg, out=buf,
                                     deterministic=True, bwd_config=bwd_cfg)
        return (o.float() * w).sum() + lse.sum(), o

    q, k, v, dout = inputs(2, 40, 24, 4, 2 if gqa else 4)
    w = dout.float()
    loss, o = f(q, k, v, w)
    loss.backward()
    eager = [o.detach(), *(t.grad.clone() for t in (q, k, v))]
    n_eager = len(calls.bwd)
    for t in (q, k, v):
        t.grad = None
    backend = AotEagerAndRecordGraphs()
    loss_c, o_c = torch.compile(f, backend=backend, fullgraph=True)(q, k, v, w)
    loss_c.backward()
    fw_ops = {n.target for g in backend.fw_graphs for n in g.graph.nodes}
    bw_ops = {n.target for g in backend.bw_graphs for n in g.graph.nodes}
    assert torch.ops.fa4.fwd.default in fw_ops and torch.ops.fa4.bwd.default in bw_ops
    assert torch.equal(loss_c, loss) and torch.equal(o_c, eager[0])
    assert all(torch.equal(a, t.grad) for a, t in zip(eager[1:], (q, k, v)))
    # The configs crossed the op boundary: same forward config dict, same backward config.
    assert calls.fwd[-1][1] == dataclasses.asdict(fwd_cfg)
    assert calls.bwd[-1]["config"] == calls.bwd[n_eager - 1]["config"] == config_from_dict(BwdConfigSm90, bwd_cfg)
    # The loss's lse.sum(): a gradient of ones through the LSE.
    ok, info = cpu_kernels.check_bwd_feat().grads_match(
        (q.grad, k.grad, v.grad), q, k, v, dout.float().to(q.dtype), torch.ones(q.shape[0], q.shape[2], q.shape[1]),
        scale=1 / math.sqrt(q.shape[3]), causal=True)
    assert ok, info


# -- issue 18's features through the autograd Function (the forward's public names in, the
# backward launch's names out, the sink's gradient back in the sink's dtype) ----------------------

FEATURE_CASES = [
    dict(window_size=(5, None)), dict(window_size=(None, 3)), dict(window_size=(7, 2)), dict(window_size=(4, 0)),
    dict(softcap=5.0), dict(learnable_sink="fp32"), dict(learnable_sink="bf16"),
    dict(window_size=(6, 1), softcap=3.0, learnable_sink="fp32"),
]


def with_sink(feat: dict, q):
    """(kwargs, sink): a case's features with its learnable_sink ("fp32"/"bf16") made a leaf
    tensor of shape (heads_q,) in that dtype (None without one)."""
    kw = dict(feat)
    sink = None
    if "learnable_sink" in kw:
        dt = torch.float32 if kw["learnable_sink"] == "fp32" else torch.bfloat16
        sink = torch.randn(q.shape[2], generator=torch.Generator().manual_seed(5)).to(dt).requires_grad_()
        kw["learnable_sink"] = sink
    return kw, sink


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("feat", FEATURE_CASES, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_features_reach_both_launches_and_grads_match(calls, causal, feat):
    q, k, v, dout = inputs(sq=29, sk=41)
    kw, sink = with_sink(feat, q)
    out, lse = launch._with_grad(q, k, v, None, causal, True, None, None, False, None, **kw)
    w = torch.randn(lse.shape, generator=torch.Generator().manual_seed(6))
    ((out.float() * dout.float()).sum() + (lse * w).sum()).backward()
    fwd, = calls.fwd_features
    left, right = kw.get("window_size", (None, None))
    assert fwd["window_size"] == kw.get("window_size", (None, None)) and fwd["softcap"] == kw.get("softcap", 0.0)
    assert fwd["learnable_sink"] is sink
    bwd, = calls.bwd
    assert (bwd["window_left"], bwd["window_right"]) == (-1 if left is None else left, -1 if right is None else right)
    assert bwd["softcap"] == kw.get("softcap", 0.0) and bwd["sink"] is sink and torch.equal(bwd["dlse"], w)
    grads = (q.grad, k.grad, v.grad) + ((sink.grad,) if sink is not None else ())
    if sink is not None:
        assert sink.grad.dtype == sink.dtype and sink.grad.shape == sink.shape
    ok, info = cpu_kernels.check_bwd_feat().grads_match(
        grads, q, k, v, dout, w, sink=sink, scale=1 / 8, causal=causal,
        window_left=-1 if left is None else left, window_right=-1 if right is None else right,
        softcap=kw.get("softcap", 0.0))
    assert ok, info


def test_rows_that_see_no_key_get_zero_grads(calls):
    """Causal with Sq > Sk under a window: the first Sq - Sk rows see no key, their dQ is zero and
    nothing is NaN; the others see up to 4 keys."""
    q, k, v, dout = inputs(sq=40, sk=8)
    out = launch._with_grad(q, k, v, None, True, False, None, None, False, None, window_size=(3, 0))
    out.backward(dout)
    assert not any(torch.isnan(t.grad).any() for t in (q, k, v))
    assert torch.equal(q.grad[:, :32], torch.zeros_like(q.grad[:, :32])) and q.grad[:, 32:].abs().sum() > 0


@pytest.mark.parametrize("feat", [dict(window_size=(7, 2)), dict(window_size=(4, 0), softcap=3.0),
                                  dict(learnable_sink="bf16"), dict(window_size=(6, 1), softcap=3.0,
                                                                    learnable_sink="fp32")],
                         ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_compile_fullgraph_carries_the_features_and_matches_eager(calls, feat):
    """Window, softcap and a learnable sink under torch.compile(fullgraph=True): both custom ops
    are in the graphs, they get the features, and the output, LSE and every gradient (the sink's
    in its own dtype) equal the eager call's bit for bit."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    torch._dynamo.reset()
    q, k, v, dout = inputs(2, 29, 41, 4, 2)
    kw, sink = with_sink(feat, q)
    w = torch.randn(q.shape[0], q.shape[2], q.shape[1], generator=torch.Generator().manual_seed(6))

    def f(q, k, v, sink, w):
        args = dict(kw, learnable_sink=sink) if sink is not None else kw
        o, lse = fa4.flash_attn_func(q, k, v, causal=True, return_lse=True, **args)
        return (o.float() * dout.float()).sum() + (lse * w).sum(), o, lse

    leaves = (q, k, v) + ((sink,) if sink is not None else ())
    loss, o, lse = f(q, k, v, sink, w)
    loss.backward()
    eager = [o.detach(), lse.detach(), *(t.grad.clone() for t in leaves)]
    for t in leaves:
        t.grad = None
    n_eager = len(calls.bwd)
    backend = AotEagerAndRecordGraphs()
    loss_c, o_c, lse_c = torch.compile(f, backend=backend, fullgraph=True)(q, k, v, sink, w)
    loss_c.backward()
    fw_ops = {n.target for g in backend.fw_graphs for n in g.graph.nodes}
    bw_ops = {n.target for g in backend.bw_graphs for n in g.graph.nodes}
    assert torch.ops.fa4.fwd.default in fw_ops and torch.ops.fa4.bwd.default in bw_ops
    assert torch.equal(o_c, eager[0]) and torch.equal(lse_c, eager[1])
    for a, t in zip(eager[2:], leaves):
        assert t.grad is not None and t.grad.dtype == t.dtype and torch.equal(a, t.grad)
    # The backward launch got what the eager one got (causal=True: the right side is causal's).
    (got,), want = calls.bwd[n_eager:], calls.bwd[n_eager - 1]
    left = kw.get("window_size", (None, None))[0]
    assert got["window_left"] == want["window_left"] == (-1 if left is None else left)
    assert got["window_right"] == want["window_right"] and got["causal"] and want["causal"]
    assert got["softcap"] == want["softcap"] == kw.get("softcap", 0.0)
    assert (got["sink"] is None) == (sink is None) and (sink is None or torch.equal(got["sink"], want["sink"]))
