"""The host side of a decode step: ``flash_attn_with_kvcache`` (and the reference's
``flash_attn_varlen_func``-style ``page_table=`` / ``seqused_k=`` spelling of the same call).

Fast path: a call with the same shapes, strides, dtypes, devices and knobs as an earlier one
looks its plan up in one dict (kernels, split count, workspace shapes) and launches; nothing
reads cache_seqlens or page_table on the host, and the workspace has a size fixed by the
shapes, so a step captures into a CUDA graph and replays with new cache_seqlens contents. A
fused combine's tickets (one int32 per sequence and row block) are allocated zeroed once per plan
and left at zero by every launch, so replays need no memset; two streams must not run the same
plan at once (they would share the tickets).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fa4.common.constants import LOG2_E
from fa4.compile_cache import compiled
from fa4.decode_problem import DecodeProblem
from fa4.dispatch import decode_entry
from fa4.knobs import as_config
from fa4.tensors import DTYPES, arch_of, device_guard

_plans: dict = {}
MAX_PLANS = 4096  # the plan cache starts over past this many keys
# Tickets of fused plans dropped from the cache: a CUDA graph captured with one still updates it
# at each replay, so its memory must never go back to the allocator (a few int32 per plan).
_retired_tickets: list = []
# The launches' device context; a name of its own so CPU tests of the host path can stand it in.
_on_device = device_guard


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """Everything a launch needs beyond the tensors, derived once per fast-path key."""

    decode: object  # the compiled decode kernel
    combine: object | None  # the compiled combine kernel (split, combine "kernel" or "pdl")
    num_splits: int
    qh_per_cta: int
    workspace: tuple | None  # (num_splits, B, Hq, Sq, D) of the fp32 partial O; None unsplit
    problem: DecodeProblem
    config: object
    tickets: torch.Tensor | None = None  # (B, row blocks x CTA heads) int32 zeros; fused combine only


def _sm_count(device) -> int:
    from fa4.launch import _sm_count as count

    return count(device)


def _check_tensor(name, t, rank, dtypes, device=None):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}; supported: {', '.join(map(str, dtypes))}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")


def _check_tma(name, t):
    for d in range(t.dim() - 1):
        if (t.stride(d) * t.element_size()) % 16:
            raise ValueError(f"{name}.stride({d}) = {t.stride(d)} elements is not a multiple of 16 bytes")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} is not 16-byte aligned")


def decode_problem_of(q, k_cache, v_cache, cache_seqlens, page_table, causal, require_cuda=True) -> DecodeProblem:
    """Validate a decode call's tensors (shapes, dtypes, devices, layouts) and return its problem."""
    _check_tensor("q", q, 4, tuple(DTYPES))
    if require_cuda and q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}; fa4 kernels run on CUDA devices only")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t, 4, (q.dtype,), q.device)
        _check_tma(name, t)
    _check_tma("q", q)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    b, sq, hq, d = q.shape
    if sq < 1 or b < 1:
        raise ValueError(f"q must hold at least one sequence and one new token, got shape {tuple(q.shape)}")
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"head_dim mismatch: q {d}, k_cache {k_cache.shape[3]}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"heads_q ({hq}) must be a multiple of the cache's heads_kv ({hkv})")
    if page_table is not None:
        _check_tensor("page_table", page_table, 2, (torch.int32,), q.device)
        if page_table.shape[0] != b or page_table.shape[1] < 1:
            raise ValueError(f"page_table must be (batch={b}, max_pages >= 1), got {tuple(page_table.shape)}")
        page_size = k_cache.shape[1]
        capacity = page_size * page_table.shape[1]
    else:
        if k_cache.shape[0] != b:
            raise ValueError(f"without page_table k_cache must be (batch={b}, seqlen_k, heads_kv, head_dim), "
                             f"got {tuple(k_cache.shape)}")
        page_size = 0
        capacity = k_cache.shape[1]
    if capacity < 1:
        raise ValueError("the KV cache holds no key")
    if cache_seqlens is not None:
        _check_tensor("cache_seqlens", cache_seqlens, 1, (torch.int32,), q.device)
        if cache_seqlens.shape[0] != b:
            raise ValueError(f"cache_seqlens must be (batch={b},), got {tuple(cache_seqlens.shape)}")
    return DecodeProblem(batch=b, seqlen_q=sq, seqlen_k=capacity, heads_q=hq, heads_kv=hkv, head_dim=d,
                         page_size=page_size, dtype=DTYPES[q.dtype], causal=bool(causal))


def _resolve(entry, problem: DecodeProblem, config, num_splits, pack_gqa, device=None):
    from fa4.sm90.decode_config import MAX_SPLITS

    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or not 0 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be an int in [0, {MAX_SPLITS}] (0 = auto), got {num_splits!r}")
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise ValueError(f"pack_gqa must be None or a bool, got {pack_gqa!r}")
    if config is None:  # the lookup chain: the local results DB's tuned config, else the default
        from fa4.lookup import resolve_decode_config

        cfg = resolve_decode_config(problem, arch_of(device))
    else:
        cfg = as_config(entry.config_cls, config)
    # The call's own arguments win over the config's (the reference's meanings); num_splits is taken
    # as given here (any count, not only the knob's menu), checked against MAX_SPLITS above.
    if pack_gqa is not None:
        cfg = dataclasses.replace(cfg, pack_gqa=pack_gqa)
    reasons = entry.violations(cfg, problem)
    if reasons:
        raise ValueError("decode config infeasible for this problem: " + "; ".join(reasons))
    return cfg, (num_splits or cfg.num_splits)


def plan_for(problem: DecodeProblem, config, num_splits, pack_gqa, has_seqlens, return_lse, device) -> DecodePlan:
    """The plan of a call (the fast path's miss): config, split count, kernels, workspace shape."""
    from fa4.sm90.decode_compile import CombineKernelKey
    from fa4.sm90.decode_config import num_splits_auto, rows_per_cta_head

    entry = decode_entry(arch_of(device))
    cfg, splits = _resolve(entry, problem, config, num_splits, pack_gqa, device)
    qh = problem.group if cfg.pack_gqa else 1
    if splits == 0:
        splits = num_splits_auto(problem.batch, problem.heads_q // qh, rows_per_cta_head(problem, cfg.pack_gqa),
                                 problem.seqlen_k, _sm_count(device), cfg.tile_n)
    split = splits > 1
    key = entry.compile_key(problem.dtype, problem.head_dim, problem.causal, problem.paged, has_seqlens, split,
                            return_lse, cfg)
    decode = compiled(key, lambda: entry.compile(key))
    combine = None
    workspace = None
    tickets = None
    if split:
        workspace = (splits, problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
        if cfg.combine == "fused":
            blocks = math.ceil(rows_per_cta_head(problem, cfg.pack_gqa) / 64) * (problem.heads_q // qh)
            tickets = torch.zeros(problem.batch, blocks, dtype=torch.int32, device=device)
        else:
            ckey = CombineKernelKey(problem.dtype, problem.head_dim, return_lse, cfg.combine == "pdl")
            combine = compiled(ckey, lambda: entry.compile_combine(ckey))
    return DecodePlan(decode, combine, splits, qh, workspace, problem, cfg, tickets)


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    config=None,
):
    """Attention of new query tokens against a KV cache; returns ``out`` or ``(out, lse)``.

    q (B, Sq_new, Hq, D): Sq_new new tokens per sequence (1 decoding, 2-16 speculative, more for
    appends). k_cache/v_cache (num_pages, page_size, Hkv, D) with ``page_table`` (B, max_pages)
    int32, or (B, Sk_max, Hkv, D) without one. ``cache_seqlens`` (B,) int32 on the device: the
    valid keys of each sequence (the new tokens' keys included, as the reference's seqused_k);
    None = the whole capacity. ``causal``: bottom-right per sequence (token t of Sq_new sees keys
    j <= t + cache_seqlens[b] - Sq_new). ``num_splits``: KV splits per sequence, 0 = the heuristic;
    ``pack_gqa``: None = pack when Hq > Hkv. ``lse`` is (B, Hq, Sq_new) fp32, natural log.
    ``config`` (a DecodeConfigSm90 or dict of its knobs) overrides the default knobs; the call's
    num_splits / pack_gqa, when given, win over it. Pages must hold whole KV tiles: page sizes
    that are multiples of 16 (tile_n picks the widest of 128/64/32/16 that divides the page).
    """
    fast_key = (
        q.shape, k_cache.shape, v_cache.shape, q.stride(), k_cache.stride(), v_cache.stride(), q.dtype, k_cache.dtype,
        v_cache.dtype, q.device, k_cache.device, v_cache.device,
        None if cache_seqlens is None else (cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.device),
        None if page_table is None else (page_table.shape, page_table.stride(), page_table.dtype,
                                         page_table.device),
        bool(causal), num_splits, pack_gqa, bool(return_lse),
        config if not isinstance(config, dict) else tuple(sorted(config.items())),
    )
    plan = _plans.get(fast_key)
    if plan is None:
        problem = decode_problem_of(q, k_cache, v_cache, cache_seqlens, page_table, causal)
        plan = plan_for(problem, config, num_splits, pack_gqa, cache_seqlens is not None, bool(return_lse),
                        q.device)
        if len(_plans) > MAX_PLANS:
            _retired_tickets.extend(p.tickets for p in _plans.values() if p.tickets is not None)
            _plans.clear()
        _plans[fast_key] = plan
    elif q.data_ptr() % 16 or k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16:
        raise ValueError("q, k_cache and v_cache must be 16-byte aligned")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[3])
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride() != q.stride():
        raise ValueError("out must match q in shape, dtype, device and strides")
    b, sq, hq, _ = q.shape
    lse = torch.empty(b, hq, sq, device=q.device, dtype=torch.float32) if return_lse else None
    with _on_device(q):
        if plan.workspace is None:
            plan.decode(q, k_cache, v_cache, out, lse, page_table, cache_seqlens, None, None, None,
                        softmax_scale * LOG2_E, 1, plan.qh_per_cta)
        else:
            o_part = torch.empty(plan.workspace, device=q.device, dtype=torch.float32)
            lse_part = torch.empty(plan.workspace[:4], device=q.device, dtype=torch.float32)
            if plan.combine is None:  # fused: the last split CTA of each row block writes out
                plan.decode(q, k_cache, v_cache, out, lse, page_table, cache_seqlens, o_part, lse_part,
                            plan.tickets, softmax_scale * LOG2_E, plan.num_splits, plan.qh_per_cta)
            else:
                plan.decode(q, k_cache, v_cache, None, None, page_table, cache_seqlens, o_part, lse_part, None,
                            softmax_scale * LOG2_E, plan.num_splits, plan.qh_per_cta)
                plan.combine(o_part, lse_part, out, lse)
    return (out, lse) if return_lse else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                           seqused_q=None, seqused_k=None, page_table=None, softmax_scale=None, causal=False,
                           window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                           deterministic=False, return_lse=False, config=None, bwd_config=None, **unsupported):
    """The reference's variable-length entry, its names and positional order.

    ``config`` overrides the tuned forward config (packed: a FwdConfigSm90, decode: a
    DecodeConfigSm90, or a dict of its knobs) and ``bwd_config`` the packed backward's (a
    BwdConfigSm90 or dict; checked at the forward call, as flash_attn_func's): what the tuner
    measures a config with.

    Built: packed sequences, q (total_q, Hq, D) with ``cu_seqlens_q``/``cu_seqlens_k`` (and
    ``seqused_q``/``seqused_k``), causal/window/softcap/sinks, forward and backward (fa4.varlen:
    gradients of q, k, v, the sink and through the returned LSE; ``deterministic`` gives bitwise
    reproducible ones); and the paged-decode spelling, q (B, Sq,
    Hq, D) with ``page_table`` and ``seqused_k`` (= cache_seqlens), k/v the paged (or per-sequence)
    cache; same defaults as the reference (num_splits=1). Not built (NotImplementedError): window,
    softcap, sinks or seqused_q on the decode path."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None or q.dim() != 4:
        # Packed sequences (fa4.varlen), forward only.
        if page_table is not None:
            raise NotImplementedError("fa4.flash_attn_varlen_func: page_table with packed sequences is not built")
        given = sorted(k_ for k_, v_ in unsupported.items() if v_ is not None)
        if num_splits not in (0, 1) or pack_gqa:
            given += ["num_splits" if num_splits not in (0, 1) else "pack_gqa"]
        if given:
            raise NotImplementedError(f"fa4.flash_attn_varlen_func's packed path does not take {', '.join(given)}")
        if deterministic not in (False, True):
            raise ValueError(f"deterministic must be a bool, got {deterministic!r}")
        if torch.compiler.is_compiling():
            # Dynamo cannot trace a CuTe DSL launch: the graph keeps fa4::varlen_fwd / varlen_bwd.
            from fa4.ops import traced_varlen

            return traced_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                                 seqused_k, softmax_scale, causal, window_size, softcap, learnable_sink, return_lse,
                                 config, deterministic, bwd_config)
        from fa4.varlen import varlen_forward

        return varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                              softmax_scale, causal, window_size, softcap, learnable_sink, return_lse, config=config,
                              deterministic=deterministic, bwd_config=bwd_config)
    given = sorted(k_ for k_, v_ in unsupported.items() if v_ is not None)
    given += [n for n, v_, off in (("seqused_q", seqused_q, None), ("window_size", tuple(window_size), (None, None)),
                                   ("learnable_sink", learnable_sink, None), ("softcap", softcap or 0.0, 0.0),
                                   ("bwd_config", bwd_config, None))
              if v_ != off]
    if given:
        raise NotImplementedError(f"fa4.flash_attn_varlen_func's decode path does not take {', '.join(given)}")
    return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqused_k, page_table=page_table,
                                   softmax_scale=softmax_scale, causal=causal, num_splits=num_splits,
                                   pack_gqa=pack_gqa, return_lse=return_lse, config=config)
