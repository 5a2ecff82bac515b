"""CPU tests of the packed varlen forward's host side: argument checks, the no-launch answers, and
the tile schedule (which tiles run, which KV tiles they load) against a brute-force scan."""

from __future__ import annotations

import math
import random

import pytest
import torch

import fa4
from fa4.varlen import cu_seqlens, tile_schedule, validate, varlen_forward


def packed(lens_q, lens_k=None, hq=4, hkv=4, d=64, dtype=torch.bfloat16):
    lens_k = lens_k or lens_q
    q = torch.randn(sum(lens_q), hq, d, dtype=dtype)
    k = torch.randn(sum(lens_k), hkv, d, dtype=dtype)
    v = torch.randn(sum(lens_k), hkv, d, dtype=dtype)
    return q, k, v, cu_seqlens(lens_q, "cpu"), cu_seqlens(lens_k, "cpu")


def test_validation_names_the_argument():
    q, k, v, cq, ck = packed([5, 7])
    args = dict(max_seqlen_q=7, max_seqlen_k=7, seqused_q=None, seqused_k=None, require_cuda=False)
    assert validate(q, k, v, cq, ck, **args) == 2
    with pytest.raises(ValueError, match="cu_seqlens_k is required"):
        validate(q, k, v, cq, None, **args)
    with pytest.raises(ValueError, match="int32"):
        validate(q, k, v, cq.long(), ck, **args)
    with pytest.raises(ValueError, match=r"\(batch \+ 1,\)"):
        validate(q, k, v, cq, ck[:2], **args)
    with pytest.raises(ValueError, match="q must be 3-D"):
        validate(q[None], k, v, cq, ck, **args)
    with pytest.raises(ValueError, match="multiple of heads_kv"):
        validate(q, k[:, :3], v[:, :3], cq, ck, **args)
    with pytest.raises(ValueError, match="head_dim 48"):
        validate(q[..., :48], k[..., :48], v[..., :48], cq, ck, **args)
    with pytest.raises(ValueError, match="seqused_q"):
        validate(q, k, v, cq, ck, **{**args, "seqused_q": torch.tensor([5], dtype=torch.int32)})
    with pytest.raises(ValueError, match="max_seqlen_q"):
        validate(q, k, v, cq, ck, **{**args, "max_seqlen_q": 7.0})
    with pytest.raises(ValueError, match="CUDA"):
        validate(q, k, v, cq, ck, **{**args, "require_cuda": True})


def test_gradient_path_is_taken_for_any_differentiable_input():
    # With a gradient required (q, or only the sink) the call goes to the autograd path, whose
    # first check on this CPU machine is the device (tests/fa4/test_varlen_bwd_host.py fakes it).
    q, k, v, cq, ck = packed([5, 7])
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="CUDA devices only"):
        fa4.flash_attn_varlen_func(q, k, v, cq, ck, 7, 7, causal=True)
    sink = torch.zeros(4, requires_grad=True)
    with pytest.raises(ValueError, match="CUDA devices only"):
        fa4.flash_attn_varlen_func(q.detach(), k, v, cq, ck, 7, 7, learnable_sink=sink)


def test_empty_batches_answer_without_a_launch():
    # No query row at all: zeros and LSE -inf, no kernel (the CPU tensors would fail a launch).
    q, k, v, _, _ = packed([1])
    none = torch.zeros(1, dtype=torch.int32)
    out, lse = varlen_forward(q[:0], k[:0], v[:0], none, none, 0, 0, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    zeros = torch.zeros(3, dtype=torch.int32)
    out, lse = varlen_forward(q[:0], k, v, zeros, torch.tensor([0, 1, 1], dtype=torch.int32), 0, 1, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    # seqused_q all zero with max_seqlen_q 0: rows exist, none is used.
    out, lse = varlen_forward(q, k, v, torch.tensor([0, 1], dtype=torch.int32),
                              torch.tensor([0, 1], dtype=torch.int32), 0, 1,
                              seqused_q=torch.zeros(1, dtype=torch.int32), return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and bool((lse == -math.inf).all())


def test_packed_path_keeps_the_decode_spelling_apart():
    q, k, v, cq, ck = packed([5, 7])
    with pytest.raises(NotImplementedError, match="page_table"):
        fa4.flash_attn_varlen_func(q, k, v, cq, ck, 7, 7, page_table=torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="num_splits"):
        fa4.flash_attn_varlen_func(q, k, v, cq, ck, 7, 7, num_splits=4)
    with pytest.raises(ValueError, match="CUDA"):
        fa4.flash_attn_varlen_func(q, k, v, cq, ck, 7, 7)


def brute_tiles(lens_q, lens_k, tile_m, tile_n, causal, left, right):
    """(sequence, m_block) -> the KV tiles holding a visible (row, key) pair, by scanning every pair
    (bottom-right alignment per sequence)."""
    want = {}
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        o = lk - lq
        for m in range((lq + tile_m - 1) // tile_m):
            seen = set()
            for i in range(m * tile_m, min((m + 1) * tile_m, lq)):
                for j in range(lk):
                    if causal and j > i + o:
                        continue
                    if right >= 0 and j > i + o + right:
                        continue
                    if left >= 0 and j < i + o - left:
                        continue
                    seen.add(j // tile_n)
            want[(b, m)] = seen
    return want


@pytest.mark.parametrize("seed", range(12))
def test_tile_schedule_matches_brute_force(seed):
    rng = random.Random(seed)
    nseq = rng.randint(1, 6)
    lens_q = [rng.choice([0, 1, rng.randint(1, 300)]) for _ in range(nseq)]
    lens_k = [lq if rng.random() < 0.6 else rng.choice([0, 1, rng.randint(1, 300)]) for lq in lens_q]
    tile_m, tile_n = rng.choice([(128, 128), (128, 176), (192, 64)])
    causal = rng.random() < 0.5
    left = rng.choice([-1, -1, rng.randint(0, 200)])
    right = -1 if causal else rng.choice([-1, rng.randint(0, 100)])
    cq = [0, *torch.tensor(lens_q).cumsum(0).tolist()]
    ck = [0, *torch.tensor(lens_k).cumsum(0).tolist()]
    got = tile_schedule(cq, ck, max(lens_q), tile_m, tile_n, causal, left, right)
    want = brute_tiles(lens_q, lens_k, tile_m, tile_n, causal, left, right)
    # The same tiles run (none of a sequence's empty or past-the-end tiles)...
    assert set(got) == set(want), (lens_q, lens_k)
    for t, ns in got.items():
        # ... each loads every KV tile with a visible pair, contiguous, highest first; a tile with
        # none runs one fully masked tile (its rows: O = 0, LSE = -inf).
        assert set(ns) >= want[t] and ns == sorted(ns, reverse=True) and len(ns) >= 1
        assert len(ns) == len(set(ns)) and (not want[t] or (max(ns) == max(want[t]) and min(ns) == min(want[t])))
        lk = lens_k[t[0]]
        assert all(n * tile_n < max(lk, 1) for n in ns)  # never a tile past the sequence's keys (bar the one)


# -- the launch path with the GPU faked: the compiled kernel replaced by a per-sequence reference
# that reads the arguments as the kernel does (views, scale, feature scalars, cu_seqlens).


def _kernel_model(q4, k4, v4, o4, lse3, sink, cu_q, cu_k, used_q, used_k, scale_log2, softcap_scale, wl, wr,
                  max_sq, *runtime, causal, softcap):
    from tests.fa4.cpu_kernels import _scores

    assert q4.shape[0] == 1 and o4.shape[0] == 1 and (lse3 is None or lse3.shape[0] == 1)
    assert max_sq == max((used_q if used_q is not None else cu_q[1:] - cu_q[:-1]).tolist())
    rep = q4.shape[2] // k4.shape[2]
    # The kernel's scalars: without softcap scale_log2 = scale log2(e); with it c log2(e) and scale / c.
    cap = scale_log2 / 1.4426950408889634 if softcap else 0.0
    scale = softcap_scale * cap if softcap else scale_log2 / 1.4426950408889634
    for b in range(cu_q.shape[0] - 1):
        a, ka = int(cu_q[b]), int(cu_k[b])
        n = int(used_q[b]) if used_q is not None else int(cu_q[b + 1]) - a
        nk = int(used_k[b]) if used_k is not None else int(cu_k[b + 1]) - ka
        if n == 0:
            continue
        s = _scores(q4[:, a:a + n], k4[:, ka:ka + nk], scale, causal, wl, wr, cap)
        if sink is not None:
            s = torch.cat([s, sink.float()[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)[..., :nk]
        vv = v4[:, ka:ka + nk].float().transpose(1, 2).repeat_interleave(rep, dim=1)
        o4[:, a:a + n] = (p @ vv).transpose(1, 2).to(o4.dtype)
        if lse3 is not None:
            lse3[:, :, a:a + n] = lse


def install_fake_forward(monkeypatch) -> list:
    """fa4.varlen's launch with the GPU faked: the kernel is _kernel_model, the tensors count as on
    an sm90 device, a fresh plan cache. Returns the compile keys asked for, in order."""
    import contextlib

    from fa4 import varlen
    from fa4.arch import SM90

    keys = []

    def compiled(key, build):
        keys.append(key)
        return lambda *a: _kernel_model(*a, causal=key.causal, softcap=key.has_softcap)

    monkeypatch.setattr(varlen, "compiled", compiled)
    monkeypatch.setattr(varlen, "arch_of", lambda device: SM90)
    monkeypatch.setattr(varlen, "_on_cuda", lambda t: True)
    monkeypatch.setattr(varlen, "_on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(varlen, "_plans", {})
    return keys


@pytest.fixture
def fake_launch(monkeypatch):
    return install_fake_forward(monkeypatch)


def _dense_ref(q, k, v, cq, ck, causal, window_size=(None, None), softcap=0.0, sink=None):
    """Each sequence through the dense CPU reference (tests/fa4/cpu_kernels)."""
    from fa4.features import normalize
    from tests.fa4.cpu_kernels import _scores

    f = normalize(q[None], causal, window_size, sink, softcap)
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qs, ks, vs = q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]]
        s = _scores(qs, ks, 1 / math.sqrt(q.shape[2]), f.causal, f.window_left, f.window_right, f.softcap)
        if sink is not None:
            s = torch.cat([s, sink.float()[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)[..., :ks.shape[1]]
        rep = q.shape[1] // k.shape[1]
        outs.append((p @ vs.float().transpose(1, 2).repeat_interleave(rep, dim=1)).transpose(1, 2)[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=-1)


@pytest.mark.parametrize("feat", [dict(causal=True), dict(causal=False, window_size=(20, 3), softcap=10.0, sink=True)])
def test_launch_path_maps_arguments(fake_launch, feat):
    lens_q, lens_k = [37, 0, 1, 90], [50, 3, 1, 90]
    q, k, v, cq, ck = packed(lens_q, lens_k, hq=4, hkv=2, d=64)
    sink = torch.randn(4) if feat.pop("sink", False) else None
    o, lse = fa4.flash_attn_varlen_func(q, k, v, cq, ck, 90, 90, return_lse=True, learnable_sink=sink, **feat)
    want, want_lse = _dense_ref(q, k, v, cq.tolist(), ck.tolist(), sink=sink, **feat)
    assert o.shape == (128, 4, 64) and lse.shape == (4, 128)
    torch.testing.assert_close(o.float(), want, atol=1e-2, rtol=0)
    fin = torch.isfinite(want_lse)
    torch.testing.assert_close(lse[fin], want_lse[fin], atol=1e-4, rtol=0)
    key = fake_launch[-1]
    assert key.varlen and not key.config.persistent and key.has_lse
    # The plan is cached: a second call with the same shapes compiles nothing more.
    fa4.flash_attn_varlen_func(q, k, v, cq, ck, 90, 90, return_lse=True, learnable_sink=sink, **feat)
    assert len(fake_launch) == 1


def test_problem_and_config_know_varlen():
    import dataclasses

    from fa4.problem import Problem
    from fa4.sm90.fwd_config import default_config, violations
    from fa4.varlen import problem_of
    from fa4.features import normalize

    q, k, v, _, _ = packed([300, 100, 12], [300, 200, 12])
    p = problem_of(q, k, v, 3, 300, 300, normalize(q[None], True, (None, None), None, 0.0))
    assert (p.varlen, p.batch, p.seqlen_q, p.varlen_mean_q, p.varlen_mean_k) == (True, 3, 300, 137, 171)
    assert p.key().endswith("_varlen137_171") and "varlen" not in Problem.standard(4096, 128).key()
    cfg = default_config(p)
    assert not violations(cfg, p)
    assert any("persistent" in r for r in violations(dataclasses.replace(cfg, persistent=True), p))
    for bad in (dict(varlen_mean_q=5), dict(varlen=True, varlen_mean_q=0, varlen_mean_k=1),
                dict(varlen=True, varlen_mean_q=5000, varlen_mean_k=1)):
        with pytest.raises(ValueError, match="varlen"):
            Problem(3, 300, 300, 4, 4, 64, 64, **bad)
