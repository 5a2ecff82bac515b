"""bench/llama_step.py's transformers attention adapter, on CPU with fa4's entry faked.

transformers hands an attention function (B, H, S, D) tensors with the key/value heads not
repeated (GQA), the module's ``is_causal`` and its ``scaling``; fa4 takes (B, S, H, D). The adapter
must transpose both ways, pass scale and causality through and return no weights.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import fa4

SPEC = importlib.util.spec_from_file_location("llama_step", Path(__file__).resolve().parents[2] / "bench" / "llama_step.py")
llama_step = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(llama_step)


def _reference(q, k, v, softmax_scale=None, causal=False, **kw):
    """fp32 attention in fa4's layout (B, S, H, D), GQA by repeating K/V heads."""
    b, sq, hq, d = q.shape
    group = hq // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * (softmax_scale or d ** -0.5)
    if causal:
        mask = torch.ones(sq, k.shape[1], dtype=torch.bool).tril(k.shape[1] - sq)
        s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.float()).to(q.dtype)


@pytest.mark.parametrize("causal", [True, False])
def test_adapter_matches_transformers_sdpa_layout(monkeypatch, causal):
    calls = []

    def fake(q, k, v, softmax_scale=None, causal=False, **kw):
        calls.append((q.shape, k.shape, softmax_scale, causal))
        return _reference(q, k, v, softmax_scale, causal)

    monkeypatch.setattr(fa4, "flash_attn_func", fake)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 33, 64, generator=g)  # (B, H, S, D) as transformers passes them
    k = torch.randn(2, 2, 33, 64, generator=g)
    v = torch.randn(2, 2, 33, 64, generator=g)
    module = type("Attn", (), {"is_causal": causal})()
    out, weights = llama_step.fa4_attention(module, q, k, v, None, scaling=0.1)
    assert weights is None and out.shape == (2, 33, 8, 64)  # (B, S, H, D): what transformers reshapes
    assert calls == [((2, 33, 8, 64), (2, 33, 2, 64), 0.1, causal)]
    kk, vv = (t.repeat_interleave(4, dim=1) for t in (k, v))
    want = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=causal, scale=0.1).transpose(1, 2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_adapter_refuses_dropout():
    module = type("Attn", (), {"is_causal": True})()
    x = torch.zeros(1, 1, 4, 64)
    with pytest.raises(ValueError, match="dropout"):
        llama_step.fa4_attention(module, x, x, x, None, dropout=0.1)
