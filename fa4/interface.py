"""The user-facing API: ``fa4.flash_attn_func`` with the reference FA4's argument names."""

from __future__ import annotations

import torch

from fa4 import features, launch
from fa4.lookup import launch_timing, launch_timings
from fa4.tensors import is_empty

# Bound once: the two checks flash_attn_func makes on every call (~0.2 us together).
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int | None, int | None] = (None, None),
    learnable_sink: torch.Tensor | None = None,
    softcap: float = 0.0,
    return_lse: bool = False,
    config=None,
    out: torch.Tensor | None = None,
    deterministic: bool = False,
    bwd_config=None,
    provider: str = "auto",
):
    """Exact attention softmax(q k^T * scale) v; q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D).

    Causal masking is aligned bottom-right when Sq != Sk. Returns ``out`` or
    ``(out, lse)`` with ``lse`` of shape (B, Hq, Sq) in fp32 (natural log; a loss that uses it
    gets its gradient). ``config`` (a FwdConfigSm90 or a dict of its knobs) overrides the tuned
    choice; ``out`` is an optional preallocated output shaped like ``q``.

    When q, k or v requires grad, the output's backward runs our backward kernel:
    ``deterministic=True`` makes dq/dk/dv bitwise reproducible; ``bwd_config`` (a
    BwdConfigSm90 or a dict of its knobs) overrides the tuned backward config, which
    otherwise comes from the same lookup chain as the forward's (``fa4.explain(...,
    pass_="bwd")``). Both are checked at the forward call and unused without grad.
    Under ``torch.compile`` the call goes through the custom ops ``fa4::fwd``/``fa4::bwd`` (ours: no
    provider dispatch inside a compiled graph).
    An empty batch, no query rows or no keys launch no kernel: the output is zeros, the LSE
    -inf and the gradients zeros (as the reference FA4 returns).

    ``provider="auto"`` (the default) runs, per shape, the fastest implementation measured on this
    device (ours, the reference FA4, cuDNN or FlashAttention-2 through SDPA; see fa4.auto and
    ``fa4.explain_auto``): ours unless the results DB holds our measurement of the shape and a
    peer's faster one (``fa4-tune --provider NAME`` measures a peer). With ``config=``,
    ``bwd_config=``, ``out=`` or any of the features below it runs ours. ``provider="fa4"``
    always runs ours; a peer's name runs that peer's plain call.

    Issue 18's features, with the reference FA4's names and meanings (fa4.features): with
    o = Sk - Sq, query row i sees key j iff i + o - left <= j <= i + o + right, a side ``None``
    being unbounded; ``causal=True`` sets right = 0 (whatever window_size says, as the
    reference), so ``window_size=(left, 0)`` is the causal sliding window. ``softcap`` c > 0
    replaces each scaled score s by c * tanh(s / c). ``learnable_sink`` (heads_q,) adds one
    logit per head to every softmax denominator (in the LSE, not in the output). A row that
    sees no key gets output 0 and LSE -inf (LSE = its sink with a sink). Their backward is ours
    too (the learnable sink gets its gradient), deterministic mode included.
    """
    feat = features.normalize(q, causal, window_size, learnable_sink, softcap)
    if _is_compiling():
        # Imported here, not at module load: fa4.ops pulls in torch._dynamo (~1 s), which
        # only a torch.compile run needs, and by then it is loaded anyway.
        from fa4.ops import traced_flash_attn

        return traced_flash_attn(q, k, v, softmax_scale, feat.causal, return_lse, config, out, deterministic,
                                 bwd_config, feat.window_left, feat.window_right, feat.softcap, feat.sink)
    grad = _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                or (learnable_sink is not None and learnable_sink.requires_grad))
    if provider != "fa4":
        chosen = _provider_for(provider, q, k, v, feat.causal, return_lse, deterministic, grad,
                               config is not None or bwd_config is not None or out is not None or not feat.plain)
        if chosen != "fa4":
            from fa4.auto import run_peer

            return run_peer(chosen, q, k, v, softmax_scale, feat.causal, return_lse, deterministic)
    if is_empty(q, k):
        from fa4 import empty

        launch.check_bwd_args(deterministic, bwd_config)
        return empty.attention(q, k, v, return_lse, out, grad, sink=feat.sink)
    if grad:
        return launch._with_grad(q, k, v, softmax_scale, feat.causal, return_lse, config, out, deterministic,
                                 bwd_config, window_size=(feat.window_left, feat.window_right),
                                 softcap=feat.softcap, learnable_sink=feat.sink)
    return launch._forward(q, k, v, softmax_scale, feat.causal, return_lse, config, out, feat.window_left,
                           feat.window_right, feat.softcap, feat.sink)


_chosen: dict = {}


def _provider_for(provider, q, k, v, causal, return_lse, deterministic, grad, ours_only) -> str:
    """The implementation a call with ``provider`` runs, cached per shape like the launch fast path.

    A hit costs the key's tuple and a dict lookup (~1 us on the 2-core CPU build machine): where the
    choice is the same in every timing mode a launch can ask for (always, unless the DB holds a peer
    faster in one mode only), the entry is the provider itself, and no call asks whether the stream
    is capturing a CUDA graph (a CUDA runtime call) or reads $FA4_TUNING_TIMING. Otherwise the entry
    maps each mode to its choice. The timing environment is read when a shape is first dispatched,
    as the launch fast path resolves a shape's config once."""
    key = (provider, q.shape, k.shape, v.shape, q.dtype, q.device, bool(causal), bool(return_lse),
           bool(deterministic), grad, ours_only)
    hit = _chosen.get(key)
    if hit.__class__ is str:
        return hit
    timing = launch_timing()
    if hit is not None and timing in hit:
        return hit[timing]
    # A first dispatch of the shape decides every mode of this process at once; one provider for all
    # stores a plain entry. A mode the entry lacks ($FA4_TUNING_TIMING changed since) joins its map.
    modes = dict.fromkeys((timing, *launch_timings())) if hit is None else (timing,)
    per_mode = {**(hit or {}),
                **{t: _dispatch(provider, q, k, v, causal, return_lse, deterministic, grad, ours_only, t)
                   for t in modes}}
    chosen = per_mode[timing]
    entry = chosen if len(set(per_mode.values())) == 1 else per_mode
    if len(_chosen) > 4096:
        _chosen.clear()
    _chosen[key] = entry
    return chosen


def _dispatch(provider, q, k, v, causal, return_lse, deterministic, grad, ours_only, timing) -> str:
    """The provider a call runs in timing mode ``timing`` (the cache's miss)."""
    from fa4 import auto
    from fa4.tensors import arch_of, problem_of, validate

    if provider == "auto":
        if ours_only or is_empty(q, k):
            return "fa4"
        validate(q, k, v)
        choice = auto.choose(problem_of(q, k, v, causal, deterministic=deterministic), arch_of(q.device),
                             return_lse=return_lse, timing=timing)
        return choice.train if grad else choice.fwd
    if provider in auto.PEERS:
        if ours_only:
            raise ValueError(f"config=, bwd_config= and out= apply to fa4's kernels, not to provider {provider!r}")
        validate(q, k, v)
        problem = problem_of(q, k, v, causal, pass_="bwd" if grad else "fwd", deterministic=deterministic)
        bad = auto.problem_errors(provider, problem, return_lse)
        if bad:
            raise ValueError(f"provider {provider!r} cannot run this call: " + "; ".join(bad))
        return provider
    raise ValueError(f"provider must be 'fa4', 'auto' or one of {', '.join(auto.PEERS)}; got {provider!r}")
