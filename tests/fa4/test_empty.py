"""Empty problems (issue 18): an empty batch, no query rows, no keys. No kernel runs; the output is
zeros, the LSE -inf and the gradients zeros of the inputs' shapes, with the checks of a real call.

These run on CPU: the empty path makes no launch, so the tensors' device does not matter to it.
"""

from __future__ import annotations

import pytest
import torch

import fa4
from fa4 import launch


@pytest.fixture(autouse=True)
def no_kernel(monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("a kernel path ran for an empty problem")

    for name in ("_forward", "_with_grad", "_backward"):
        monkeypatch.setattr(launch, name, must_not_run)


SHAPES = {  # (B, Sq, Sk, Hq, Hkv, D, Dv)
    "empty batch": (0, 128, 128, 8, 2, 128, 128),
    "no query rows": (2, 0, 256, 8, 8, 64, 64),
    "no keys": (2, 5, 0, 8, 2, 128, 128),
    "everything empty, 192/128": (0, 0, 0, 4, 4, 192, 128),
}


def _inputs(b, sq, sk, hq, hkv, d, dv, dtype=torch.bfloat16, grad=True):
    q = torch.randn(b, sq, hq, d, dtype=dtype, requires_grad=grad)
    k = torch.randn(b, sk, hkv, d, dtype=dtype, requires_grad=grad)
    v = torch.randn(b, sk, hkv, dv, dtype=dtype, requires_grad=grad)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", list(SHAPES))
def test_empty_problems_give_zeros_minus_inf_lse_and_zero_gradients(case, causal):
    b, sq, sk, hq, hkv, d, dv = SHAPES[case]
    q, k, v = _inputs(*SHAPES[case])
    out, lse = fa4.flash_attn_func(q, k, v, causal=causal, return_lse=True, deterministic=True)
    assert out.shape == (b, sq, hq, dv) and out.dtype == q.dtype and not out.any()
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32 and bool((lse == float("-inf")).all())
    assert out.requires_grad and not lse.requires_grad
    dout = torch.randn_like(out)
    dq, dk, dv_ = torch.autograd.grad(out, (q, k, v), dout)
    for g, t in ((dq, q), (dk, k), (dv_, v)):
        assert g.shape == t.shape and g.dtype == t.dtype and not g.any()


def test_without_grad_and_into_out():
    q, k, v = _inputs(*SHAPES["no keys"], grad=False)
    out = torch.full((2, 5, 8, 128), 7.0, dtype=torch.bfloat16)
    got = fa4.flash_attn_func(q, k, v, out=out)
    assert got is out and not out.any() and got.grad_fn is None
    with pytest.raises(ValueError, match="out must be"):
        fa4.flash_attn_func(q, k, v, out=torch.empty(2, 5, 8, 64, dtype=torch.bfloat16))


@pytest.mark.parametrize("bad,match", [
    (dict(k_heads=3), "multiple of heads_kv"),
    (dict(dtype=torch.float32), "dtype"),
    (dict(d=100), "head_dim 100"),
])
def test_empty_inputs_are_still_checked(bad, match):
    hkv = bad.get("k_heads", 2)
    dtype = bad.get("dtype", torch.bfloat16)
    d = bad.get("d", 128)
    q = torch.randn(0, 16, 8, d, dtype=dtype)
    k = torch.randn(0, 16, hkv, d, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        fa4.flash_attn_func(q, k, k)
    with pytest.raises(ValueError, match="deterministic must be a bool"):
        fa4.flash_attn_func(torch.randn(0, 1, 8, 128, dtype=torch.bfloat16),
                            torch.randn(0, 1, 8, 128, dtype=torch.bfloat16),
                            torch.randn(0, 1, 8, 128, dtype=torch.bfloat16), deterministic="yes")


@pytest.mark.parametrize("sink_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(SHAPES))
def test_empty_problems_give_a_zero_sink_gradient(case, sink_dtype):
    """A learnable sink (issue 18) on an empty problem: zero gradient of its shape and dtype, beside
    the zero dq, dk, dv (the empty path's own autograd, no launch)."""
    from fa4 import empty

    b, sq, sk, hq, hkv, d, dv = SHAPES[case]
    q, k, v = _inputs(*SHAPES[case])
    sink = torch.randn(hq).to(sink_dtype).requires_grad_()
    out = empty.attention(q, k, v, False, None, True, sink=sink)
    grads = torch.autograd.grad(out, (q, k, v, sink), torch.randn_like(out))
    for g, t in zip(grads, (q, k, v, sink)):
        assert g.shape == t.shape and g.dtype == t.dtype and not g.any()
