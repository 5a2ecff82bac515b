"""fa4.integrations.transformers on CPU: fa4's entry points faked by an fp32 reference.

What is tested is the argument mapping: that a transformers model of each family that needs a
feature (Llama: GQA and causality; Mistral: sliding window; Gemma-2: softcap and alternating
window layers; GPT-OSS: learnable sinks) computes the same logits with attn_implementation="fa4"
as with transformers' own eager attention, and that each layer asked fa4 for what its config says.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import fa4
from fa4.integrations import transformers as fa4_hf


def reference(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0,
              learnable_sink=None, cu_seqlens=None, **kw):
    """fp32 attention with fa4's semantics, (S, H, D) per sequence in a (B, S, H, D) batch.

    Key j is visible to query i (offset o = Sk - Sq) iff j <= i + o + right (right = 0 when
    causal) and j >= i + o - left; softcap c: scores c * tanh(s / c); a sink adds exp(sink - m) to
    each row's denominator. A row that sees nothing is 0.
    """
    b, sq, hq, d = q.shape
    sk = k.shape[1]
    group = hq // k.shape[2]
    k, v = (t.float().repeat_interleave(group, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) * (softmax_scale or d ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    left, right = window_size
    right = 0 if causal else right
    seen = torch.ones(sq, sk, dtype=torch.bool)
    if right is not None:
        seen &= j <= i + right
    if left is not None:
        seen &= j >= i - left
    if cu_seqlens is not None:  # one packed row: no attention across documents
        doc = torch.bucketize(torch.arange(sk), cu_seqlens[1:], right=True)
        seen &= doc[:, None] == doc[None, :]
    s = s.masked_fill(~seen, float("-inf"))
    if learnable_sink is not None:
        sink = learnable_sink.float().reshape(1, hq, 1, 1).expand(b, hq, sq, 1)
        p = torch.cat([s, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        p = s.softmax(-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, v).to(q.dtype)


@pytest.fixture
def fake_fa4(monkeypatch):
    calls = []

    def flash_attn_func(q, k, v, **kw):
        # Only what a layer needs is passed: a plain call works with any fa4 version.
        calls.append({"shapes": (tuple(q.shape), tuple(k.shape)), "causal": kw["causal"],
                      "deterministic": kw["deterministic"], "window_size": kw.get("window_size", (None, None)),
                      "softcap": kw.get("softcap", 0.0), "sink": kw.get("learnable_sink") is not None})
        return reference(q, k, v, **kw)

    monkeypatch.setattr(fa4, "flash_attn_func", flash_attn_func)
    # The models run in fp32 so that eager and the reference agree to rounding (bf16 flips MoE
    # routes); the kernels' cast of fp32 activations to the weights' dtype is tested below.
    monkeypatch.setattr(fa4_hf, "_target_dtype", lambda query, module: None)
    fa4_hf.register()
    return calls


def _tiny(cls, **kw):
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=64, attention_dropout=0.0,
                initializer_range=0.25)  # sharp enough scores that a window, cap or sink shows in the logits
    base.update(kw)
    return cls(**base)


def _logits(cfg, impl, ids):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


FAMILIES = {
    "llama": (lambda: _tiny(transformers.LlamaConfig), [dict(window_size=(None, None), softcap=0.0, sink=False)] * 2),
    "mistral": (lambda: _tiny(transformers.MistralConfig, sliding_window=8),
                [dict(window_size=(7, 0), softcap=0.0, sink=False)] * 2),
    "gemma2": (lambda: _tiny(transformers.Gemma2Config, sliding_window=8, attn_logit_softcapping=0.5,
                             final_logit_softcapping=None, query_pre_attn_scalar=16),
               [dict(window_size=(7, 0), softcap=0.5, sink=False), dict(window_size=(None, None), softcap=0.5,
                                                                       sink=False)]),
    "gpt_oss": (lambda: _tiny(transformers.GptOssConfig, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
                              layer_types=["sliding_attention", "full_attention"]),
                [dict(window_size=(7, 0), softcap=0.0, sink=True), dict(window_size=(None, None), softcap=0.0,
                                                                      sink=True)]),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_through_fa4_matches_eager_and_asks_for_its_features(fake_fa4, family):
    make, per_layer = FAMILIES[family]
    cfg = make()
    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    want = _logits(cfg, "eager", ids)
    got = _logits(cfg, "fa4", ids)
    assert len(fake_fa4) == cfg.num_hidden_layers
    for call, expect in zip(fake_fa4, per_layer):
        assert call["causal"] is True and call["deterministic"] is False
        assert {n: call[n] for n in expect} == expect
        assert call["shapes"] == ((2, 24, 4, 16), (2, 24, 2, 16))  # (B, S, H, D); K/V heads not repeated
    # Same weights, fp32 throughout: the logits differ by rounding only (a missed window, cap or
    # sink moves them by 20-120% of their range at this initialisation).
    err = (got - want).abs().max().item()
    assert err <= 1e-3 * want.abs().max().item(), err


def test_window_of_follows_transformers_convention():
    # transformers' window counts the query's own token; no window when every key fits in it.
    assert fa4_hf.window_of(8, True, 24) == (7, 0)
    assert fa4_hf.window_of(8, False, 24) == (7, 7)
    assert fa4_hf.window_of(8, True, 8) == (None, None)
    assert fa4_hf.window_of(None, True, 24) == (None, None)


def test_padded_and_packed_batches_say_what_they_need(fake_fa4):
    # A padded batch or packed sequences go to fa4's packed varlen path, never silently to the
    # dense one; training through it reaches the varlen autograd (here: the CUDA check).
    module = type("Attn", (torch.nn.Module,), {"is_causal": True})()
    x = torch.zeros(1, 2, 6, 64, dtype=torch.bfloat16)
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    with pytest.raises(ValueError, match="CUDA devices only"):  # the packed kernel's own check
        fa4_hf.attention_forward(module, x, x, x, mask)
    xg = x.clone().requires_grad_(True)
    with pytest.raises(ValueError, match="CUDA devices only"):
        fa4_hf.attention_forward(module, xg, x, x, None, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]))
    assert fake_fa4 == []
    # A mask without padding is the dense path.
    out, w = fa4_hf.attention_forward(module, x, x, x, torch.ones(1, 6, dtype=torch.bool))
    assert w is None and out.shape == (1, 6, 2, 64) and len(fake_fa4) == 1


def test_varlen_paths_hand_fa4_the_documents(monkeypatch):
    # Once fa4.flash_attn_varlen_func exists, packed rows and padded batches reach it with the
    # cumulative lengths of the real tokens only.
    seen = []

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        seen.append((cu_q.tolist(), cu_k.tolist(), max_q, max_k, tuple(q.shape)))
        outs = []
        for a, z in zip(cu_q.tolist(), cu_q.tolist()[1:]):
            outs.append(reference(q[None, a:z], k[None, a:z], v[None, a:z], **kw)[0])
        return torch.cat(outs)

    monkeypatch.setattr(fa4, "flash_attn_varlen_func", varlen, raising=False)
    module = type("Attn", (torch.nn.Module,), {"is_causal": True})()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    out, _ = fa4_hf.attention_forward(module, q, k, v, None, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2, 3]]))
    assert seen[-1] == ([0, 3, 7], [0, 3, 7], 4, 4, (7, 2, 16))
    want = reference(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, cu_seqlens=torch.tensor([0, 3, 7]))
    torch.testing.assert_close(out.float(), want.float(), rtol=0, atol=1e-2)
    # Left padding: the second row's first two tokens are padding; their outputs are zero.
    qb, kb, vb = (t.expand(2, -1, -1, -1).contiguous() for t in (q, k, v))
    mask = torch.tensor([[1] * 7, [0, 0] + [1] * 5], dtype=torch.bool)
    out, _ = fa4_hf.attention_forward(module, qb, kb, vb, mask)
    assert seen[-1][:4] == ([0, 7, 12], [0, 7, 12], 7, 7)
    assert out[1, :2].abs().max() == 0
    want_row1 = reference(*(t[1:, :, 2:].transpose(1, 2) for t in (qb, kb, vb)), causal=True)
    torch.testing.assert_close(out[1:, 2:].float(), want_row1.float(), rtol=0, atol=1e-2)


def test_fp32_activations_are_cast_to_the_models_half_dtype():
    bf16_model = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 4).to(torch.bfloat16))
    assert fa4_hf._target_dtype(torch.zeros(1, dtype=torch.float32), bf16_model) == torch.bfloat16
    assert fa4_hf._target_dtype(torch.zeros(1, dtype=torch.float16), bf16_model) is None


def test_refusals_are_clear():
    module = type("Attn", (torch.nn.Module,), {"is_causal": True})()
    module.train()
    x = torch.zeros(1, 1, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dropout"):
        fa4_hf.attention_forward(module, x, x, x, None, dropout=0.1)
    with pytest.raises(NotImplementedError, match="paged"):
        fa4_hf.attention_forward(module, x, x, x, None, block_table=torch.zeros(1, 1, dtype=torch.int32))
    fp32_model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="bf16 or fp16"):
        fa4_hf._target_dtype(torch.zeros(1, dtype=torch.float32), fp32_model)
