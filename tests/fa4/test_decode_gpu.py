"""The decode kernel on the GPU against the fp32 reference (the forward's error rule).

Page sizes 16/64/256 and a contiguous cache; ragged cache_seqlens with 0 and 1 in the batch;
1/2/4/16 new tokens; GQA ratios 1/4/8 (16 tokens x 8 heads = two 64-row blocks); causal
bottom-right or not; split counts 1, 3, auto and the maximum (most splits then empty). The output
is poisoned with NaN first, and so is the memory the split workspace is carved from, and every
cache slot past a sequence's length (a cache from torch.empty); NaN never passes. The default
combine is fused for the shapes of at most 16 rows per KV head and PDL for 16 tokens x 8 heads;
each combine (kernel, pdl, fused) is also forced over the shapes and split counts 2..max, fused
with two row blocks per KV head, and over repeated calls (the tickets must be back at 0). Then:
pack_gqa off, fp16, hd64, hd 96/192/256, no cache_seqlens, and a decode step captured in a CUDA graph (for each
combine) and replayed with new cache_seqlens (and query) contents.
"""

from __future__ import annotations

import math

import pytest

from tests.fa4 import decode_ref

pytestmark = pytest.mark.gpu

LENS = [0, 1, 700, 3000]  # batch 4, ragged, capacity 3000
SHAPES = [(1, 32, 8), (2, 8, 8), (4, 16, 4), (16, 8, 1)]  # (new tokens, heads_q, heads_kv)


def _poison_workspace(q, splits):
    """Hand the caching allocator a NaN-filled block of the workspace's size, so the kernel's partials
    land on NaN unless it writes every one of them (empty splits included)."""
    import torch

    if splits > 1:
        b, sq, hq, d = q.shape
        torch.full((splits, b, hq, sq, d), float("nan"), device="cuda")
        torch.full((splits, b, hq, sq), float("nan"), device="cuda")


def config_with(q, k, v, seqlens, table, causal, combine):
    """The default config of the call's problem with ``combine`` forced (None: the default's own)."""
    import dataclasses

    from fa4.decode import decode_problem_of
    from fa4.sm90.decode_config import default_config

    if combine is None:
        return None
    return dataclasses.replace(default_config(decode_problem_of(q, k, v, seqlens, table, causal)), combine=combine)


def run_case(batch_lens, sq, hq, hkv, d, page_size, causal, num_splits, dtype=None, pack_gqa=None,
             with_seqlens=True, seed=0, combine=None):
    import torch

    import fa4

    dtype = dtype or torch.bfloat16
    q, k, v, seqlens, table = decode_ref.make_case(len(batch_lens), sq, hq, hkv, d, batch_lens, page_size,
                                                   dtype, "cuda", seed, poison_tail=with_seqlens)
    out = torch.full_like(q, float("nan"))
    _poison_workspace(q, num_splits or 128)
    o, lse = fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens if with_seqlens else None,
                                         page_table=table, causal=causal, num_splits=num_splits,
                                         pack_gqa=pack_gqa, return_lse=True, out=out,
                                         config=config_with(q, k, v, seqlens, table, causal, combine))
    torch.cuda.synchronize()
    lens = batch_lens if with_seqlens else [k.shape[1] * (table.shape[1] if table is not None else 1)] * len(batch_lens)
    return decode_ref.errors(o, lse, q, k, v, lens, table, causal, 1 / math.sqrt(d))


@pytest.mark.parametrize("splits", [1, 3, 0, 128])
@pytest.mark.parametrize("sq,hq,hkv", SHAPES)
@pytest.mark.parametrize("page_size", [0, 16, 64, 256])
def test_decode_matches_reference(page_size, sq, hq, hkv, splits):
    causal = (page_size // 16 + sq + splits) % 2 == 0  # both, spread over the grid
    ok, info = run_case(LENS, sq, hq, hkv, 128, page_size, causal, splits)
    assert ok, info


@pytest.mark.parametrize("splits", [2, 128])
@pytest.mark.parametrize("sq,hq,hkv", SHAPES)
@pytest.mark.parametrize("combine", ["kernel", "pdl", "fused"])
def test_decode_each_combine(combine, sq, hq, hkv, splits):
    # Fused at 16 tokens x 8 heads: two row blocks per KV head, each with its own ticket.
    causal = (sq + splits) % 2 == 1
    ok, info = run_case(LENS, sq, hq, hkv, 128, 64, causal, splits, combine=combine)
    assert ok, info


def test_fused_combine_over_repeated_calls():
    """One plan called again and again (new lengths each time, 0 and 1 among them): every call must find
    its tickets at 0 and leave them so; a stale ticket would skip or double a combine (NaN output)."""
    import torch

    import fa4
    from fa4 import decode

    # Every sequence owns 3000 keys of pages (NaN past them); the calls use any length up to that.
    q, k, v, seqlens, table = decode_ref.make_case(4, 4, 16, 2, 128, [3000] * 4, 256, torch.bfloat16, "cuda", 5,
                                                   poison_tail=True)
    config = config_with(q, k, v, seqlens, table, True, "fused")
    for step, new_lens in enumerate(([3000, 1, 0, 700], [1, 2999, 256, 0], [0, 0, 0, 0], [257, 3000, 1, 1],
                                     [3000, 3000, 3000, 3000])):
        seqlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        out = torch.full_like(q, float("nan"))
        _poison_workspace(q, 24)
        fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, causal=True, num_splits=24,
                                    out=out, config=config)
        torch.cuda.synchronize()
        ok, info = decode_ref.errors(out, None, q, k, v, new_lens, table, True, 1 / math.sqrt(128))
        assert ok, (step, info)
    (plan,) = [p for p in decode._plans.values() if p.tickets is not None and p.num_splits == 24]
    assert plan.combine is None and plan.tickets.shape == (4, 2) and int(plan.tickets.abs().sum()) == 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("splits", [1, 5])
def test_decode_unpacked_gqa(causal, splits):
    ok, info = run_case(LENS, 2, 16, 4, 128, 64, causal, splits, pack_gqa=False)
    assert ok, info


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("page_size", [0, 32, 128])
def test_decode_hd64_fp16(page_size, splits):
    import torch

    ok, info = run_case([5, 1000, 0], 1, 16, 2, 64, page_size, True, splits, dtype=torch.float16)
    assert ok, info
    ok, info = run_case([5, 1000, 0], 4, 16, 2, 64, page_size, False, splits)
    assert ok, info


@pytest.mark.parametrize("splits", [1, 3, 0])
@pytest.mark.parametrize("hd", [96, 192, 256])
@pytest.mark.parametrize("page_size", [0, 64, 256])
def test_decode_other_head_dims(hd, page_size, splits):
    """Phi-3's 96, 192 and Gemma's 256: the widest tile the smem and register budgets take (hd256:
    64 keys x 3 stages), packed GQA and unpacked, causal and not, bf16 and fp16."""
    import torch

    causal = (hd // 32 + page_size // 64 + splits) % 2 == 0
    ok, info = run_case(LENS, 2, 16, 4, hd, page_size, causal, splits)
    assert ok, info
    ok, info = run_case([1, 0, 777], 1, 8, 8, hd, page_size, not causal, splits, dtype=torch.float16)
    assert ok, info


@pytest.mark.parametrize("page_size", [0, 256])
def test_decode_without_cache_seqlens(page_size):
    ok, info = run_case([512, 300], 1, 32, 8, 128, page_size, False, 0, with_seqlens=False)
    assert ok, info


def test_decode_long_append_and_large_scores():
    # 200 new tokens x 4 heads: 13 row blocks; keys up to 2k.
    ok, info = run_case([2048, 999], 200, 8, 2, 128, 256, True, 2)
    assert ok, info


@pytest.mark.parametrize("combine", [None, "kernel", "pdl", "fused"])
def test_decode_step_in_a_cuda_graph(combine):
    import torch

    import fa4

    lens = [4000, 17, 0, 2500]
    q, k, v, seqlens, table = decode_ref.make_case(4, 1, 32, 8, 128, lens, 256, torch.bfloat16, "cuda", 3)
    config = config_with(q, k, v, seqlens, table, False, combine)
    out = torch.full_like(q, float("nan"))
    fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, out=out,
                                config=config)  # plan + compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, out=out, config=config)
    from fa4 import decode

    (plan,) = [p for key, p in decode._plans.items() if p.problem.batch == 4 and p.problem.seqlen_k == 4096
               and p.problem.heads_q == 32 and key[-1] == config]
    assert plan.num_splits > 1  # the graph holds the combine too
    if combine is not None:  # (None: whatever the lookup chain serves; the default is fused here)
        assert plan.config.combine == combine
    assert (plan.tickets is not None) == (plan.config.combine == "fused")
    for step, new_lens in enumerate(([4001, 18, 1, 2501], [1, 4096, 255, 256], [0, 0, 0, 3])):
        seqlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(q.dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ok, info = decode_ref.errors(out, None, q, k, v, new_lens, table, False, 1 / math.sqrt(128))
        assert ok, (step, info)
    if plan.tickets is not None:  # the replays left the self-resetting tickets at 0
        assert int(plan.tickets.abs().sum()) == 0


@pytest.mark.parametrize("page_size", [0, 16])
def test_decode_cache_shorter_than_a_tile(page_size):
    # A contiguous cache of 5 keys: the 128-key TMA box reaches past the tensor (zero fill).
    ok, info = run_case([1, 5], 4, 8, 2, 128, page_size, True, 0)
    assert ok, info
