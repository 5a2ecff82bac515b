"""fa4: FlashAttention-4-style attention kernels for Hopper, written with the CuTe DSL."""

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["__version__", "explain", "explain_auto", "explain_decode", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "record_shapes"]

if TYPE_CHECKING:  # what IDEs and type checkers read; at run time __getattr__ loads it on first use
    from fa4.decode import flash_attn_varlen_func, flash_attn_with_kvcache
    from fa4.interface import flash_attn_func
    from fa4.record import record_shapes


def __getattr__(name: str):
    # Lazy, so that importing fa4 (the tuner and the service read fa4.knobs, fa4.problem) does
    # not load torch; the attribute is then the function itself, signature and docstring included.
    if name == "flash_attn_func":
        from fa4.interface import flash_attn_func

        globals()[name] = flash_attn_func
        return flash_attn_func
    if name in ("flash_attn_with_kvcache", "flash_attn_varlen_func"):
        from fa4 import decode

        fn = getattr(decode, name)
        globals()[name] = fn
        return fn
    if name == "record_shapes":
        from fa4.record import record_shapes

        globals()[name] = record_shapes
        return record_shapes
    raise AttributeError(f"module 'fa4' has no attribute {name!r}")


def explain(q=None, k=None, v=None, causal: bool = False, *, problem=None, arch=None, device=None, config=None,
            pass_: str = "fwd", deterministic: bool = False, timing=None, window_size=(None, None),
            learnable_sink=None, softcap: float = 0.0, provider: str = "fa4"):
    """Which config ``flash_attn_func(q, k, v, causal=...)`` would use, and why.

    ``pass_="bwd"`` (with ``deterministic``) asks about the backward's config instead.

    Returns a :class:`fa4.lookup.Resolution`: ``.config``, ``.provenance`` and ``.steps``
    (every source asked, in order, with what it said); ``print()`` it for a summary.
    Instead of tensors, ``problem=`` (a :class:`fa4.problem.Problem`) works without a GPU;
    ``arch`` defaults to the tensors' GPU (else sm90), ``device`` names the GPU to look
    results up for. ``timing`` names the timing mode to explain (fa4.timing, e.g. "graph-cold");
    default: the one a launch made here now asks for ($FA4_TUNING_TIMING, graph under capture).
    ``window_size``, ``learnable_sink`` and ``softcap`` as flash_attn_func takes them.
    This is the config of our kernels; which implementation a plain call runs (flash_attn_func's
    default provider, "auto", may run a measured faster peer) is what ``provider="auto"`` explains
    instead (see :func:`explain_auto`).
    """
    from fa4 import lookup

    if provider == "auto":
        return explain_auto(q, k, v, causal, problem=problem, arch=arch, device=device, deterministic=deterministic,
                            timing=timing)
    if problem is None:
        if q is None or k is None or v is None:
            raise TypeError("explain() needs q, k and v, or problem=")
        from fa4.tensors import arch_of, problem_of

        from fa4.features import normalize, problem_fields

        feat = normalize(q, causal, window_size, learnable_sink, softcap)
        problem = problem_of(q, k, v, feat.causal, pass_=pass_, deterministic=deterministic, **problem_fields(feat))
        if arch is None and q.device.type == "cuda":
            arch = arch_of(q.device)
    return lookup.explain_problem(problem, arch, device=device, config=config, timing=timing)


def explain_decode(q=None, k_cache=None, v_cache=None, cache_seqlens=None, page_table=None, causal: bool = False, *,
                   problem=None, arch=None, device=None, config=None, timing=None):
    """Which config ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=, page_table=, causal=)``
    would use (no ``config=``, ``num_splits=0``), and why: a :class:`fa4.lookup.Resolution` as
    :func:`explain` returns. ``problem=`` (a :class:`fa4.decode_problem.DecodeProblem`) instead
    of tensors works without a GPU; so do CPU tensors (their shapes are all it reads)."""
    from fa4 import lookup

    if problem is None:
        if q is None or k_cache is None or v_cache is None:
            raise TypeError("explain_decode() needs q, k_cache and v_cache, or problem=")
        from fa4.decode import decode_problem_of

        problem = decode_problem_of(q, k_cache, v_cache, cache_seqlens, page_table, causal, require_cuda=False)
        if arch is None and q.device.type == "cuda":
            from fa4.tensors import arch_of

            arch = arch_of(q.device)
    return lookup.explain_problem(problem, arch, device=device, config=config, timing=timing)


def explain_auto(q=None, k=None, v=None, causal: bool = False, *, problem=None, arch=None, device=None,
                 deterministic: bool = False, return_lse: bool = False, timing=None):
    """Which implementation ``flash_attn_func(q, k, v, causal=..., provider="auto")`` runs, and why.

    Returns a :class:`fa4.auto.Choice`: ``.fwd`` (a call without grad), ``.train`` (with grad),
    the measured milliseconds of each provider and a note per source asked; ``print()`` it.
    ``problem=`` works without a GPU (its ``deterministic`` flag selects the backward rows);
    ``device`` names the GPU whose measurements count.
    """
    from fa4 import auto
    from fa4.arch import SM90
    from fa4.timing import Timing

    if problem is None:
        if q is None or k is None or v is None:
            raise TypeError("explain_auto() needs q, k and v, or problem=")
        from fa4.tensors import arch_of, problem_of

        problem = problem_of(q, k, v, causal, deterministic=deterministic)
        if arch is None and q.device.type == "cuda":
            arch = arch_of(q.device)
    return auto.choose(problem, arch or SM90, return_lse=return_lse, device=device,
                       timing=None if timing is None else Timing.parse(timing).name, remember=device is None)
