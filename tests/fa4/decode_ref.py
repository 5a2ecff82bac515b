"""Decode-step inputs and the fp32 reference for the decode kernel's tests (CPU and GPU).

The reference gathers each sequence's valid keys out of its pages and runs bench/check_fwd.py's
attention reference on them (causal bottom-right per sequence), so a paged cache, ragged lengths
(0 and 1 included) and GQA are checked against the same equations as the forward.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location(
    "check_fwd", Path(__file__).resolve().parents[2] / "bench" / "check_fwd.py")


@functools.lru_cache(maxsize=1)
def check_fwd():
    mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(mod)
    return mod


def make_case(batch, seqlen_q, heads_q, heads_kv, head_dim, lens, page_size, dtype=torch.bfloat16,
              device="cpu", seed=0, spare_pages=3, poison_tail=False):
    """(q, k_cache, v_cache, cache_seqlens, page_table): ``page_size`` 0 = a contiguous cache of
    max(lens) (at least 1) keys per sequence; otherwise pages dealt to the sequences in a shuffled
    order, a few spare pages never referenced, unused table entries pointing at page 0.
    ``poison_tail``: every cache slot past a sequence's length (and every spare page) is NaN, as
    a cache from torch.empty may be; no valid key may be touched by them."""
    q, k, v, seqlens, table = _make(batch, seqlen_q, heads_q, heads_kv, head_dim, lens, page_size, dtype,
                                    seed, spare_pages)
    if poison_tail:
        for cache in (k, v):
            live = torch.zeros(cache.shape[:2], dtype=torch.bool)
            for b, n in enumerate(lens):
                if table is None:
                    live[b, :n] = True
                else:
                    for i in range(n):
                        live[table[b, i // page_size], i % page_size] = True
            cache[~live] = float("nan")
    return q.to(device), k.to(device), v.to(device), seqlens.to(device), None if table is None else table.to(device)


def _make(batch, seqlen_q, heads_q, heads_kv, head_dim, lens, page_size, dtype, seed, spare_pages):
    g = torch.Generator().manual_seed(seed)
    cap = max(max(lens), 1)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, generator=g).to(dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    if not page_size:
        k = torch.randn(batch, cap, heads_kv, head_dim, generator=g).to(dtype)
        v = torch.randn(batch, cap, heads_kv, head_dim, generator=g).to(dtype)
        return q, k, v, seqlens, None
    max_pages = math.ceil(cap / page_size)
    need = [math.ceil(n / page_size) for n in lens]
    num_pages = sum(need) + spare_pages
    order = torch.randperm(num_pages, generator=g)
    table = torch.zeros(batch, max_pages, dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = order[at:at + n].to(torch.int32)
        at += n
    k = torch.randn(num_pages, page_size, heads_kv, head_dim, generator=g).to(dtype)
    v = torch.randn(num_pages, page_size, heads_kv, head_dim, generator=g).to(dtype)
    return q, k, v, seqlens, table


def gather_kv(cache, page_table, b, length):
    """(length, heads_kv, head_dim): sequence b's first ``length`` keys (or values)."""
    if page_table is None:
        return cache[b, :length]
    pages = page_table[b, : math.ceil(length / cache.shape[1])].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:length]


def reference(q, k_cache, v_cache, lens, page_table, causal, scale, dtype=torch.float32):
    """(out (B, Sq, Hq, D), lse (B, Hq, Sq)) in ``dtype`` math (fp32 LSE)."""
    ref = check_fwd().reference
    outs, lses = [], []
    for b, n in enumerate(lens):
        k = gather_kv(k_cache, page_table, b, n)[None]
        v = gather_kv(v_cache, page_table, b, n)[None]
        o, lse = ref(q[b:b + 1], k, v, causal, scale, dtype)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def errors(out, lse, q, k_cache, v_cache, lens, page_table, causal, scale):
    """The forward's error rule: max |out - fp32 ref| <= 2 x PyTorch's own same-dtype error + 1e-4,
    LSE within 1e-3 where finite and exactly -inf where no key is visible; NaN never passes."""
    ref, ref_lse = reference(q, k_cache, v_cache, lens, page_table, causal, scale)
    low, _ = reference(q, k_cache, v_cache, lens, page_table, causal, scale, q.dtype)
    err = (out.float() - ref).abs().max().item()
    err_pt = (low.float() - ref).abs().max().item()
    nan = bool(torch.isnan(out).any().item())
    info = dict(err=err, err_torch=err_pt, nan=nan)
    ok = not nan and err <= 2 * err_pt + 1e-4
    if lse is not None:
        fin = torch.isfinite(ref_lse)
        info["lse_err"] = (lse[fin] - ref_lse[fin]).abs().max().item() if fin.any() else 0.0
        info["lse_masked_ok"] = bool((lse[~fin] == float("-inf")).all().item()) if (~fin).any() else True
        ok = ok and info["lse_err"] <= 1e-3 and info["lse_masked_ok"] and not bool(torch.isnan(lse).any())
    return ok, info
