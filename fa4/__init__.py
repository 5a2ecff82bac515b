"""fa4: FlashAttention-4-style attention kernels for Hopper, written with the CuTe DSL."""

__version__ = "0.1.0"


def flash_attn_func(*args, **kwargs):
    """See :func:`fa4.interface.flash_attn_func` (imported lazily: torch/CuTe load only on use)."""
    from fa4.interface import flash_attn_func as _f

    return _f(*args, **kwargs)
