"""fa4 as a Hugging Face transformers attention implementation.

    import fa4.integrations.transformers as fa4_hf
    fa4_hf.register()                      # once per process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa4")

``register`` adds ``"fa4"`` to transformers' ``AttentionInterface`` (the attention call) and to
its ``AttentionMaskInterface`` (the mask builder: like the FlashAttention implementations, a
2D padding mask or nothing, since fa4 applies causality and windows itself). transformers hands
the attention function (B, H, S, D) tensors with the key/value heads not repeated, the module's
scaling, and per model family: ``sliding_window`` (Mistral, Gemma-2/3: the window counts the
query's own token, so it is fa4's ``window_size=(sliding_window - 1, ...)``), ``softcap``
(Gemma-2's ``attn_logit_softcapping``) and ``s_aux`` (GPT-OSS's per-head sinks, fa4's
``learnable_sink``). Padded batches (a 2D mask with zeros) and packed sequences
(``cu_seq_lens_*``/``max_length_*`` kwargs, or position ids that restart) need
``fa4.flash_attn_varlen_func``; a paged KV cache (``block_table``) needs fa4's decode path.
"""

from __future__ import annotations

import os

import torch

NAME = "fa4"


def _packed(position_ids, batch: int) -> bool:
    """Several sequences packed in one row: position ids that restart (transformers' rule)."""
    if position_ids is None or batch != 1 or position_ids.shape[-1] == 1:
        return False
    return bool((torch.diff(position_ids.reshape(-1)) < 0).any())


def _target_dtype(query: torch.Tensor, module) -> torch.dtype | None:
    # An fp32 query comes from layer norms kept in fp32 (PEFT, autocast): the kernels take the
    # 16-bit dtype the model computes in.
    if query.dtype != torch.float32:
        return None
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear) and layer.weight.dtype in (torch.bfloat16, torch.float16):
            return layer.weight.dtype
    raise ValueError("fa4 computes in bf16 or fp16; this model's weights are fp32 (load it in bf16/fp16)")


def window_of(sliding_window: int | None, causal: bool, key_length: int) -> tuple[int | None, int | None]:
    """transformers' sliding window (tokens seen, the query's own included) as fa4's window_size."""
    if sliding_window is None or key_length <= sliding_window:
        return (None, None)
    left = sliding_window - 1
    return (left, 0 if causal else left)


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: (B, H, S, D) in, (B, S, H, Dv) out and no weights."""
    import fa4

    if dropout and module.training:
        raise ValueError("fa4 has no attention dropout: set the model's attention_dropout to 0")
    if kwargs.get("output_attentions"):
        raise ValueError("fa4 does not return attention weights (output_attentions=True needs 'eager')")
    if kwargs.get("block_table") is not None:
        raise NotImplementedError("fa4's transformers integration has no paged-KV (continuous batching) path yet")
    batch = query.shape[0]
    varlen = all(kwargs.get(n) is not None for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"))
    padded = attention_mask is not None and not bool(attention_mask.all())
    if varlen or padded or _packed(kwargs.get("position_ids"), batch):
        # Padded batches (an attention mask with zeros) and packed sequences: fa4's packed varlen
        # kernels, forward and backward (flash_attn_varlen_func).
        return _varlen(module, query, key, value, attention_mask, scaling, sliding_window, softcap, is_causal,
                       s_aux, kwargs)
    causal = bool(module.is_causal if is_causal is None else is_causal)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    dtype = _target_dtype(q, module)
    if dtype is not None:
        q, k, v = (t.to(dtype) for t in (q, k, v))
    out = fa4.flash_attn_func(q, k, v, softmax_scale=scaling, causal=causal,
                              deterministic=_deterministic(kwargs.get("deterministic")),
                              **_features(sliding_window, causal, k.shape[1], softcap, s_aux))
    return out, None


def _features(sliding_window, causal, key_length, softcap, s_aux) -> dict:
    """The window / softcap / sink arguments a layer needs, only those it needs."""
    kw = {}
    window = window_of(sliding_window, causal, key_length)
    if window != (None, None):
        kw["window_size"] = window
    if softcap:
        kw["softcap"] = float(softcap)
    if s_aux is not None:
        kw["learnable_sink"] = s_aux
    return kw


def _deterministic(flag) -> bool:
    # transformers' convention for the FlashAttention implementations.
    return bool(flag) if flag is not None else os.getenv("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"


def _varlen(module, query, key, value, attention_mask, scaling, sliding_window, softcap, is_causal, s_aux, kwargs):
    """Packed (cu_seq_lens) or padded batches through fa4.flash_attn_varlen_func."""
    import fa4

    causal = bool(module.is_causal if is_causal is None else is_causal)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    b, sq, hq, _ = q.shape
    sk = k.shape[1]
    if kwargs.get("cu_seq_lens_q") is not None:
        cu_q, cu_k = kwargs["cu_seq_lens_q"].to(torch.int32), kwargs["cu_seq_lens_k"].to(torch.int32)
        max_q, max_k = int(kwargs["max_length_q"]), int(kwargs["max_length_k"])
        idx_q = idx_k = None
    elif attention_mask is None:  # packed: position ids restart at each sequence
        pos = kwargs["position_ids"].reshape(-1)
        starts = (pos == pos.min()).nonzero().reshape(-1)
        cu_q = cu_k = torch.cat([starts, torch.tensor([pos.numel()], device=pos.device)]).to(torch.int32)
        max_q = max_k = int(cu_q.diff().max())
        idx_q = idx_k = None
    else:  # padded: a 2D mask over the keys (its last sq columns are the queries)
        mask_k = attention_mask[:, -sk:].bool()
        mask_q = mask_k[:, -sq:]
        idx_k, idx_q = mask_k.reshape(-1).nonzero().reshape(-1), mask_q.reshape(-1).nonzero().reshape(-1)
        lens_k, lens_q = mask_k.sum(1, dtype=torch.int32), mask_q.sum(1, dtype=torch.int32)
        zero = torch.zeros(1, dtype=torch.int32, device=q.device)
        cu_k, cu_q = torch.cat([zero, lens_k.cumsum(0, dtype=torch.int32)]), torch.cat([zero, lens_q.cumsum(0, dtype=torch.int32)])
        max_q, max_k = int(lens_q.max()), int(lens_k.max())
    flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
    if idx_q is not None:
        flat = [flat[0][idx_q], flat[1][idx_k], flat[2][idx_k]]
    dtype = _target_dtype(flat[0], module)
    if dtype is not None:
        flat = [t.to(dtype) for t in flat]
    out = fa4.flash_attn_varlen_func(*flat, cu_q, cu_k, max_q, max_k, softmax_scale=scaling, causal=causal,
                                     deterministic=_deterministic(kwargs.get("deterministic")),
                                     **_features(sliding_window, causal, max_k, softcap, s_aux))
    if idx_q is None:
        return out.reshape(b, sq, hq, out.shape[-1]), None
    full = out.new_zeros(b * sq, hq, out.shape[-1])
    full[idx_q] = out
    return full.reshape(b, sq, hq, out.shape[-1]), None


def register(name: str = NAME) -> str:
    """Registers fa4 with transformers (attention and mask interfaces); returns the name to use."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
