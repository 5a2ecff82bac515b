"""The 2-CTA dS exchange (cluster_exchange): its ownership model and its feasibility (CPU only).

fa4.common.bwd_pair says which (query row, key, dQ column) terms each CTA of a pair reduces;
here that is checked against a brute-force scan of the mask: every visible term lands in dQ
exactly once, the pair's shared query range covers both halves' visible tiles, and no tile
that either half must mask is walked unmasked.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import pytest

from fa4.common import bwd_pair
from fa4.problem import Problem
from fa4.sm90.bwd_config import BwdConfigSm90, smem_bytes, violations
from tests.fa4.test_bwd_config import visible  # (query, key) under the bottom-right causal mask

SEQS = [(1, 1), (65, 1), (1, 300), (128, 128), (333, 777), (777, 333), (64, 640), (200, 64), (130, 192)]
D = 8  # dQ columns of the model (any even head_dim splits the same way)


@pytest.mark.parametrize("sq,sk", SEQS)
@pytest.mark.parametrize("tile_m", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_every_visible_dq_term_is_reduced_exactly_once(sq, sk, tile_m, causal):
    tn = bwd_pair.TILE_N
    num_n = -(-sk // tn)
    terms = Counter()
    for pair, rank in itertools.product(range(bwd_pair.num_pairs(num_n)), range(bwd_pair.PAIR)):
        m_start, m_masked_end, m_unmasked_end, m_end = bwd_pair.pair_segments(pair, tile_m, sq, sk, causal)
        assert 0 <= m_start <= m_masked_end <= m_unmasked_end <= m_end
        lo, hi = bwd_pair.dq_columns(rank, D)
        for m in range(m_start, m_end):
            rows = range(m * tile_m, (m + 1) * tile_m)
            # Both CTAs compute S^T/dS for their own key tile at every step of the pair's range,
            # masking in [m_start, m_masked_end); dQ sums the two tiles' dS.
            for n in bwd_pair.dq_key_tiles(pair, rank):
                keys = range(n * tn, (n + 1) * tn)
                if not m < m_masked_end:
                    bad = [(i, j) for i in rows for j in keys if i < sq and not visible(i, j, sq, sk, causal)]
                    assert not bad, (pair, rank, m, n, "masked terms in an unmasked step")
                for i, j, c in itertools.product(rows, keys, range(lo, hi)):
                    if visible(i, j, sq, sk, causal):
                        terms[(i, j, c)] += 1
    want = {(i, j, c) for i in range(sq) for j in range(sk) for c in range(D) if visible(i, j, sq, sk, causal)}
    assert set(terms) == want
    assert set(terms.values()) <= {1}


@pytest.mark.parametrize("sq,sk", SEQS)
@pytest.mark.parametrize("causal", [False, True])
def test_the_pair_walks_the_union_of_its_halves(sq, sk, causal):
    """Each CTA's own dK/dV still see every query tile its key tile needs (the pair's range is
    the 128-key tile's), and the odd tail's empty CTA holds no visible key."""
    tile_m, tn = 64, bwd_pair.TILE_N
    num_n = -(-sk // tn)
    for pair in range(bwd_pair.num_pairs(num_n)):
        m_start, _, _, m_end = bwd_pair.pair_segments(pair, tile_m, sq, sk, causal)
        for rank in range(bwd_pair.PAIR):
            n = bwd_pair.n_block_of(pair, rank)
            keys = range(n * tn, (n + 1) * tn)
            if n >= num_n:
                assert num_n % 2 == 1 and rank == 1 and all(j >= sk for j in keys)
            for m in range(-(-sq // tile_m)):
                rows = range(m * tile_m, (m + 1) * tile_m)
                if any(visible(i, j, sq, sk, causal) for i in rows for j in keys):
                    assert m_start <= m < m_end, (pair, rank, m)


def test_dq_bytes_halve():
    # hd256 at tile_m 64: 64 KiB of fp32 adds per CTA step, 32 KiB with the exchange.
    assert bwd_pair.dq_bytes_per_step(64, 256, False) == 65536
    assert bwd_pair.dq_bytes_per_step(64, 256, True) == 32768
    assert [bwd_pair.dq_columns(r, 192) for r in (0, 1)] == [(0, 96), (96, 192)]


def bwd(hd, hdv=None, **kw) -> Problem:
    return Problem.standard(8192, hd, head_dim_v=hdv, pass_="bwd", **kw)


def pair_cfg(**kw) -> BwdConfigSm90:
    base = dict(tile_m=64, stages=1, ds_stages=2, dkv_split="head_dim", dv_operand="smem", cluster_exchange=True)
    return BwdConfigSm90(**{**base, **kw})


def test_cluster_exchange_is_the_default_at_hd256_only():
    """On at head_dim 256 where cluster_violations() allows it (the H200: +14% / +17% over the same
    config without it), off at 192 and 192/128 (it lost 6-9% there) and below; deterministic,
    windowed, softcapped and 'loop' problems fall back to the config without it."""
    import dataclasses

    from fa4.sm90.bwd_defaults import default_config

    for hd, hdv in ((64, 64), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)):
        for causal in (False, True):
            for group in (1, 4):
                heads = 2048 // hd // 4 * 4 or 4
                prob = bwd(hd, hdv, causal=causal, heads_q=heads, heads_kv=heads // group)
                cfg = default_config(prob)
                assert not violations(cfg, prob)
                assert cfg.cluster_exchange == (hd == 256), (hd, hdv, causal, group)
                if hd == 256:
                    # The measured ring: the same as without the exchange.
                    off = dataclasses.replace(cfg, cluster_exchange=False)
                    assert not violations(off, prob) and (cfg.stages, cfg.ds_stages, cfg.dq_accum) == (1, 2, "bulk")
    p256 = bwd(256, causal=True)
    for other in (dict(deterministic=True), dict(window_left=1023, window_right=0), dict(softcap=30.0)):
        prob = dataclasses.replace(p256, **other)
        cfg = default_config(prob)
        assert not cfg.cluster_exchange and not violations(cfg, prob), other
    loop = Problem(2, 1024, 4096, 16, 4, 256, 256, causal=True, pass_="bwd")
    cfg = default_config(loop)
    assert cfg.gqa_reduce == "loop" and not cfg.cluster_exchange and not violations(cfg, loop)


def test_cluster_exchange_feasibility():
    """What the design refuses, and its budgets."""
    assert not violations(pair_cfg(), bwd(192))
    assert not violations(pair_cfg(), bwd(192, 128))
    assert not violations(pair_cfg(), bwd(256))
    assert not violations(pair_cfg(), bwd(256, causal=True, heads_kv=4))  # GQA, causal
    assert not violations(pair_cfg(), bwd(256, sink=True))  # the sink's gradient is the host's
    assert any("dkv_split 'head_dim'" in v for v in violations(
        BwdConfigSm90(tile_m=64, stages=1, cluster_exchange=True), bwd(128)))
    assert any("deterministic" in v for v in violations(pair_cfg(), bwd(256, deterministic=True)))
    assert any("sliding window" in v for v in violations(pair_cfg(), bwd(256, window_left=512)))
    assert any("softcap" in v for v in violations(pair_cfg(), bwd(256, softcap=30.0)))
    assert any("gqa_reduce 'loop'" in v for v in violations(pair_cfg(gqa_reduce="loop"), bwd(256, heads_kv=4)))
    packed = dataclasses.replace(bwd(256), varlen=True, varlen_mean_q=2048, varlen_mean_k=2048)
    assert any("varlen" in v for v in violations(pair_cfg(), packed))
    assert not violations(pair_cfg(cluster_exchange=False), packed)
    # Shared memory: the peer's K columns (64 x d/2) and dS tiles beside a half-width dQ tile.
    base = pair_cfg(cluster_exchange=False)
    p = bwd(256)
    assert smem_bytes(pair_cfg(), p) - smem_bytes(base, p) == 64 * 128 * 2 + 2 * 64 * 64 * 2 - 64 * 128 * 4
    # hd256: the default's one-deep Q/dO ring with bulk adds and two dS buffers, exchanged, in
    # the same bytes; a two-deep ring fits neither way.
    from fa4.sm90.bwd_defaults import default_config

    d256 = default_config(p)
    assert (d256.stages, d256.ds_stages, d256.dq_accum) == (1, 2, "bulk")
    assert not violations(dataclasses.replace(d256, cluster_exchange=True), p)
    assert any("shared memory" in v for v in violations(pair_cfg(stages=2, ds_stages=1, dq_accum="red_v2"), p))
    # hd192: the default's two-deep ring and two dS buffers no longer fit exchanged; one dS buffer
    # does. 192/128 keeps the default's.
    assert any("shared memory" in v for v in violations(pair_cfg(stages=2), bwd(192)))
    assert not violations(pair_cfg(stages=2, ds_stages=1), bwd(192))
    assert not violations(pair_cfg(stages=2), bwd(192, 128))


@pytest.mark.parametrize("hd,names", [(256, {"off", "on"}), (192, {"off", "on", "off ds1"})])
def test_bench_harness_on_cpu(monkeypatch, hd, names):
    """bench/bench_cluster.py's bench_shape with the GPU faked (tests/fa4/cpu_kernels' forward, the
    backward by its equations after bwd_launch.resolve_config has accepted the config, do_bench a
    single call of 1 ms): each config is run as named (the exchange only in "on", one dS buffer
    beside it at hd192), on and off compared, and the reference's absence reported, not raised."""
    import sys

    from fa4.sm90 import bwd_launch
    from fa4.tensors import problem_of
    from tests.fa4 import cpu_kernels

    cpu_kernels.install(monkeypatch)
    seen = []

    def fake_bwd(dout, q, k, v, out, lse, softmax_scale=None, causal=False, deterministic=False, config=None):
        config = bwd_launch.resolve_config(problem_of(q, k, v, causal, pass_="bwd"), config)
        seen.append((config.cluster_exchange, config.ds_stages))
        return cpu_kernels.backward_math(dout, q, k, v, softmax_scale or q.shape[3] ** -0.5, causal)

    monkeypatch.setattr(bwd_launch, "flash_attn_bwd", fake_bwd)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # the reference: not importable here
    mod = cpu_kernels.bench_module(monkeypatch, "bench_cluster")
    row = mod.bench_shape(128, hd, True, device="cpu", tokens=128, width=2 * hd)
    assert set(row["configs"]) == names and "ref FA4" not in row
    assert row["configs"]["on"]["cluster_exchange"] and not row["configs"]["off"]["cluster_exchange"]
    assert {on for on, _ in seen} == {False, True}
    assert {ds for on, ds in seen if on} == {1 if hd == 192 else 2}
    assert row["on_vs_off"] == {"dq": 0.0, "dk": 0.0, "dv": 0.0}
    flops = Problem(1, 128, 128, 2, 2, hd, hd, causal=True, pass_="bwd").flops
    assert all(row[n] == pytest.approx(flops / 1e9) for n in names)
