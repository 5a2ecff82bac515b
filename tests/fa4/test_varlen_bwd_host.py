"""CPU tests of the packed varlen backward's host side, with the GPU faked.

The padded side-buffer regions (fa4.common.varlen) never overlap and fit the buffer; the four
kernel launches of fa4.sm90.bwd_launch.launch_bwd_varlen are replaced by fp32 models that read and
write their arguments as the kernels do (the packed tensors as a batch of one, the fp32 side buffers
at each sequence's padded offset, the key tiles of a sequence with no key skipped), so what runs is
the real host code: plans, buffer sizes, argument order, the sink's reduction, zeroed rows past
seqused, GQA's accumulate-then-convert, and flash_attn_varlen_func's autograd. Gradients are held to
bench/check_bwd_feat.rounded_out_grads (the exact fp32 gradients of a backward given ``out``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import random
from pathlib import Path

import pytest
import torch

import fa4
from fa4.common import bwd_schedule
from fa4.common.varlen import compact_tiles, padded_offset, padded_total, tile_start
from fa4.sm90 import bwd_launch
from fa4.sm90.bwd_compile import SEQ_PAD, BwdKernelKey
from fa4.sm90.bwd_config import BwdConfigSm90
from fa4.varlen import cu_seqlens

_spec = importlib.util.spec_from_file_location(
    "check_bwd_feat", Path(__file__).resolve().parents[2] / "bench" / "check_bwd_feat.py")
cbf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cbf)

LOG2E = 1.4426950408889634


@pytest.mark.parametrize("seed", range(20))
def test_padded_regions_never_overlap(seed):
    rng = random.Random(seed)
    lens = [rng.choice([0, 1, 127, 128, 129, rng.randint(0, 5000)]) for _ in range(rng.randint(1, 12))]
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]
    end = 0
    for b, n in enumerate(lens):
        start = padded_offset(cu[b], b, SEQ_PAD)
        assert start % SEQ_PAD == 0 and start >= end, (lens, b)
        end = start + -(-n // SEQ_PAD) * SEQ_PAD
    assert end <= padded_total(cu[-1], len(lens), SEQ_PAD)


@pytest.mark.parametrize("tile", [64, 80, 128])
@pytest.mark.parametrize("seed", range(20))
def test_compact_grid_covers_every_key_tile_once(seed, tile):
    """The compact varlen grid's map (fa4.common.varlen.tile_start; the kernel's tile_sequence is the
    binary search for the last b with tile_start(b) <= t): over the (total_k // tile + B) tiles a
    head, every key tile of every sequence comes out exactly once, each sequence has at most one
    spare tile, and every other tile lands past its sequence's keys (those CTAs exit)."""
    rng = random.Random(seed)
    lens = [rng.choice([0, 1, tile - 1, tile, tile + 1, 2 * tile, rng.randint(0, 5000)])
            for _ in range(rng.randint(1, 40))]
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]
    starts = [tile_start(cu, b, tile) for b in range(len(lens))]
    assert starts[0] == 0 and starts == sorted(starts)
    seen, spare = set(), [0] * len(lens)

    def search(t):  # the kernel's loop, step by step
        lo, hi = 0, len(lens)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if tile_start(cu, mid, tile) <= t else (lo, mid)
        return lo

    assert compact_tiles(cu[-1], len(lens), tile) == tile_start(cu, len(lens), tile)
    for t in range(compact_tiles(cu[-1], len(lens), tile)):
        b = search(t)
        assert b == max(i for i in range(len(lens)) if starts[i] <= t)
        n = t - starts[b]
        if n * tile < lens[b]:
            assert (b, n) not in seen
            seen.add((b, n))
        elif b < len(lens) - 1 or t < tile_start(cu, len(lens), tile):
            spare[b] += 1
    assert seen == {(b, n) for b, ln in enumerate(lens) for n in range(-(-ln // tile))}
    assert max(spare) <= 1, spare


def test_compact_grid_size_at_the_issue_mix():
    """Issue 18's 8 documents (512-4096 keys, 16k): the padded grid launches 8 x 32 = 256 CTAs a
    head for 128 key tiles; the compact one 16384 // 128 + 8 = 136 (8 spare)."""
    lens = [2048, 512, 4096, 1024, 3072, 1536, 2560, 1536]
    cu = [0, *torch.tensor(lens).cumsum(0).tolist()]
    real = sum(-(-n // 128) for n in lens)
    compact = compact_tiles(cu[-1], len(lens), 128)
    assert (real, compact, len(lens) * -(-max(lens) // 128)) == (128, 136, 256)
    assert [tile_start(cu, b, 128) for b in range(len(lens))] == [0, 17, 22, 55, 64, 89, 102, 123]


# -- the four launches as fp32 models ----------------------------------------------------------------


def _seqs(cu, used):
    cu = cu.tolist()
    used = None if used is None else used.tolist()
    return [(cu[b], used[b] if used is not None else cu[b + 1] - cu[b]) for b in range(len(cu) - 1)]


def _tiles(n):
    return -(-n // 128) * 128


def pre_model(key, o4, do4, lse3, lse2, dsum, dq_acc, dlse3, cu, used, sink, sink_term, max_q, zero_rows, cu_k, used_k,
              right):
    """The preprocess (fa4.sm90.bwd_prepost.BwdPreprocess) on the packed layout: per sequence, its
    padded rows of D, LSE2, the dQ accumulator's rows to zero and, with a sink, each row's term of
    the sink's gradient, -2^(sink_h log2 e - LSE2) D (0 on padded rows and where LSE2 is +inf).
    Every row of the accumulator is zeroed, or with the deterministic variant (its key names the
    main kernel's tile_m) those below dq_zero_rows of the sequence's lengths: the rest keep what the
    allocation held, NaN here."""
    assert o4.shape[0] == lse3.shape[0] == 1 and max_q == max(n for _, n in _seqs(cu, used))
    tile = dict(k[:2] for k in key if isinstance(k, tuple)).get("zero_tile", 0)
    assert (cu_k is not None) == (tile > 0) and (zero_rows == bwd_launch.ZERO_ALL_ROWS)
    lens_k = list(_seqs(cu_k, used_k)) if tile else None
    assert (sink is None) == (sink_term is None)
    if sink is not None:
        assert sink.dtype == torch.float32 and sink_term.shape == dsum.shape
    for b, (off, n) in enumerate(_seqs(cu, used)):
        if n == 0:
            continue
        pad, rows = padded_offset(off, b, SEQ_PAD), _tiles(n)
        assert pad + rows <= lse2.shape[2]
        d = (do4[0, off:off + n].float() * o4[0, off:off + n].float()).sum(-1).T  # (H, n)
        if dlse3 is not None:
            d = d - dlse3[0, :, off:off + n]
        lse = lse3[0, :, off:off + n] * LOG2E
        dsum[0, :, pad:pad + rows] = 0.0
        dsum[0, :, pad:pad + n] = d
        lse2[0, :, pad:pad + rows] = math.inf
        lse2[0, :, pad:pad + n] = torch.where(torch.isneginf(lse), math.inf, lse)
        zero = rows if not tile else bwd_schedule.dq_zero_rows(n, lens_k[b][1], tile, right)
        dq_acc[0, :, pad:pad + rows] = math.nan
        dq_acc[0, :, pad:pad + min(zero, rows)] = 0.0
        if sink is not None:
            sink_term[0, :, pad:pad + rows] = -torch.exp2(sink[:, None] * LOG2E - lse2[0, :, pad:pad + rows]) \
                * dsum[0, :, pad:pad + rows]


def main_model(key: BwdKernelKey, q4, k4, v4, do4, lse2, dsum, dq_acc, dk_out, dv_out, sem_q, sem_kv, dk_last,
               dv_last, cu_q, cu_k, used_q, used_k, scale_log2, scale, wl, wr, softcap_inv, softcap_log2, max_k, *runtime):
    assert key.varlen and key.seqused_q == (used_q is not None) and key.seqused_k == (used_k is not None)
    assert len(runtime) == 2 and max_k == max(n for _, n in _seqs(cu_k, used_k))
    assert (sem_q is not None) == key.deterministic and (sem_kv is not None) == (key.deterministic and key.gqa)
    assert dk_last is None and dv_last is None  # gqa_finish 'last_cta' is not built for varlen
    if sem_q is not None:
        assert sem_q.shape[:2] == (cu_q.shape[0] - 1, q4.shape[2]) and not sem_q.any()
    hq, hkv = q4.shape[2], k4.shape[2]
    rep = hq // hkv
    for b, ((oq, n), (ok, nk)) in enumerate(zip(_seqs(cu_q, used_q), _seqs(cu_k, used_k))):
        if nk == 0:
            continue  # every CTA of the sequence exits
        pq, pk = padded_offset(oq, b, SEQ_PAD), padded_offset(ok, b, SEQ_PAD)
        qb, dob = (t[0, oq:oq + n].float().transpose(0, 1) for t in (q4, do4))  # (H, n, d)
        kb, vb = (t[0, ok:ok + nk].float().transpose(0, 1).repeat_interleave(rep, 0) for t in (k4, v4))
        raw = qb @ kb.transpose(1, 2)
        if key.has_softcap:
            t = torch.tanh(raw * softcap_inv)
            logit2 = t * softcap_log2
        else:
            logit2 = raw * scale_log2
        seen = cbf.visible(n, nk, key.causal, wl if key.has_window_left else -1, wr if key.has_window_right else -1)
        logit2 = logit2.masked_fill(~seen, -math.inf)
        p = torch.exp2(logit2 - lse2[0, :, pq:pq + n, None])
        ds = p * (dob @ vb.transpose(1, 2) - dsum[0, :, pq:pq + n, None])
        if key.has_softcap:
            ds = ds * (1 - t * t)
        dv = (p.transpose(1, 2) @ dob).reshape(hkv, rep, nk, -1).sum(1)
        dk = (ds.transpose(1, 2) @ qb).reshape(hkv, rep, nk, -1).sum(1) * scale
        # (scaled by the postprocess) Deterministic, a query tile's first turn stores: every tile a
        # key tile reaches; the prefix of whole tiles whose rows see no key gets no turn.
        first = n
        if key.deterministic:
            right = bwd_launch.right_bound(key.causal, key.has_window_right, wr)
            first = bwd_schedule.dq_zero_rows(n, nk, key.config.tile_m, right)
            dq_acc[0, :, pq + first:pq + n] = (ds @ kb)[:, first:]
        dq_acc[0, :, pq:pq + first] += (ds @ kb)[:, :first]
        if key.gqa:
            assert pk + _tiles(nk) <= dk_out.shape[2]
            dk_out[0, :, pk:pk + nk] += dk
            dv_out[0, :, pk:pk + nk] += dv
        else:
            dk_out[0, ok:ok + nk] = dk.transpose(0, 1).to(dk_out.dtype)
            dv_out[0, ok:ok + nk] = dv.transpose(0, 1).to(dv_out.dtype)


def post_model(acc, out4, scale, cu, used, max_len):
    for b, (off, n) in enumerate(_seqs(cu, used)):
        pad = padded_offset(off, b, SEQ_PAD)
        out4[0, off:off + n] = (acc[0, :, pad:pad + n] * scale).transpose(0, 1).to(out4.dtype)


def model_for(key):
    """The CPU model standing in for the compiled kernel of ``key``."""
    if isinstance(key, BwdKernelKey):
        return lambda *a: main_model(key, *a)
    if key[0] == "bwd_pre_varlen":
        return lambda *a: pre_model(key, *a)
    return {"bwd_post_varlen": post_model, "bwd_post_dq_varlen": post_model}[key[0]]


@pytest.fixture
def fake_bwd(monkeypatch):
    built = []

    def compiled(key, build):
        built.append(key)
        return model_for(key)

    monkeypatch.setattr(bwd_launch, "compiled", compiled)
    monkeypatch.setattr(bwd_launch, "_on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(bwd_launch, "_varlen_plans", {})
    return built


def packed(lens_q, lens_k=None, hq=4, hkv=4, d=64, dtype=torch.bfloat16, seed=0, sink=False, dlse=False, **feat):
    lens_k = lens_k or lens_q
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, d, generator=g).to(dtype)
    k, v = (torch.randn(tk, hkv, d, generator=g).to(dtype) for _ in range(2))
    dout = torch.randn(tq, hq, d, generator=g).to(dtype)
    s = torch.randn(hq, generator=g) * 2 if sink else None
    dl = torch.randn(hq, tq, generator=g) if dlse else None
    return q, k, v, dout, s, dl, cu_seqlens(lens_q, "cpu"), cu_seqlens(lens_k, "cpu")


def reference(q, k, v, dout, sink, dlse, cq, ck, used_q=None, used_k=None, out=None, **feat):
    """(out, lse) of the fp32 forward and the rounded-out gradients, per sequence, packed."""
    scale = 1 / math.sqrt(q.shape[2])
    o_all = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    lse_all = torch.full((q.shape[1], q.shape[0]), -math.inf)
    grads = [torch.zeros(t.shape) for t in (q, k, v)] + ([torch.zeros(q.shape[1])] if sink is not None else [])
    spans = list(zip(_seqs(cq, used_q), _seqs(ck, used_k)))
    for (a, n), (ka, nk) in spans:
        if n == 0:
            continue
        o, lse = cbf.attention(q[None, a:a + n].float(), k[None, ka:ka + nk].float(), v[None, ka:ka + nk].float(),
                               scale, sink=sink, **feat)
        o_all[a:a + n] = o[0].to(q.dtype)
        lse_all[:, a:a + n] = lse[0]
        given = o_all[None, a:a + n] if out is None else out[None, a:a + n]
        g = cbf.rounded_out_grads(q[None, a:a + n], k[None, ka:ka + nk], v[None, ka:ka + nk], dout[None, a:a + n],
                                  None if dlse is None else dlse[None, :, a:a + n], given, sink=sink, scale=scale,
                                  **feat)
        grads[0][a:a + n] = g[0][0]
        grads[1][ka:ka + nk] += g[1][0]
        grads[2][ka:ka + nk] += g[2][0]
        if sink is not None:
            grads[3] += g[3]
    return o_all, lse_all, grads


def assert_close(grads, want):
    assert len(grads) == len(want)
    for g, w in zip(grads, want):
        assert not torch.isnan(g).any()
        # Our models run in fp32 from the same inputs; dk/dv are rounded to bf16 outside GQA.
        torch.testing.assert_close(g.float(), w, atol=2e-2 * max(w.abs().max().item(), 1e-3), rtol=2e-2)


CASES = [
    pytest.param([37, 0, 1, 200, 129], None, 4, 4, dict(causal=True), False, False, id="causal-0-1"),
    pytest.param([37, 0, 1, 200], [50, 3, 1, 90], 4, 2, dict(causal=False), False, True, id="gqa-sq!=sk-dlse"),
    pytest.param([150, 1, 300], [150, 2, 250], 8, 2,
                 dict(causal=True, window_left=40, window_right=-1, softcap=10.0), True, True, id="all"),
    pytest.param([130, 64], [64, 200], 4, 4, dict(causal=False, window_left=30, window_right=20), False, False,
                 id="window"),
]


@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("lens_q,lens_k,hq,hkv,feat,sink,dlse", CASES)
def test_launch_maps_arguments_and_buffers(fake_bwd, lens_q, lens_k, hq, hkv, feat, sink, dlse, det):
    """Deterministic too: the preprocess variant zeroes each sequence's rows no first dQ turn stores
    (the models leave the others NaN), from the key lengths and right bound the launch passes."""
    q, k, v, dout, s, dl, cq, ck = packed(lens_q, lens_k, hq, hkv, sink=sink, dlse=dlse)
    out, lse, want = reference(q, k, v, dout, s, dl, cq, ck, **feat)
    cfg = BwdConfigSm90(dkv_store="direct")
    args = (dout, q, k, v, out, lse, cq, ck, max(lens_q), max(lens_k or lens_q), None, None, 1 / math.sqrt(64),
            feat["causal"], det, cfg)
    kw = dict(dlse=dl, sink=s, window_left=feat.get("window_left", -1), window_right=feat.get("window_right", -1),
              softcap=feat.get("softcap", 0.0))
    grads = bwd_launch.launch_bwd_varlen(*args, **kw)
    assert_close(grads, want)
    n_built = len(fake_bwd)
    assert any(isinstance(k_, BwdKernelKey) and k_.varlen for k_ in fake_bwd)
    # The plan is cached: a second call builds nothing.
    bwd_launch.launch_bwd_varlen(*args, **kw)
    assert len(fake_bwd) == n_built


def test_seqused_rows_get_zero_gradients(fake_bwd):
    q, k, v, dout, _, _, cq, ck = packed([100, 60, 90], [80, 60, 90], 4, 2)
    uq, uk = torch.tensor([70, 0, 90], dtype=torch.int32), torch.tensor([80, 10, 1], dtype=torch.int32)
    out, lse, want = reference(q, k, v, dout, None, None, cq, ck, uq, uk, causal=True)
    grads = bwd_launch.launch_bwd_varlen(dout, q, k, v, out, lse, cq, ck, 90, 80, uq, uk, 0.125, True, True,
                                         BwdConfigSm90(dkv_store="direct"))
    assert_close(grads, want)
    assert torch.equal(grads[0][70:160], torch.zeros_like(grads[0][70:160]))  # past seqused_q, and the empty one
    assert torch.equal(grads[1][90:130], torch.zeros_like(grads[1][90:130]))  # past seqused_k of sequence 1


def test_no_pair_answers_zeros_without_a_launch(fake_bwd):
    q, k, v, dout, s, _, cq, ck = packed([5, 7], sink=True)
    lse = torch.zeros(4, 12)
    none = torch.zeros(1, dtype=torch.int32)
    grads = bwd_launch.launch_bwd_varlen(dout[:0], q[:0], k[:0], v[:0], dout[:0], lse[:, :0], none, none, 0, 0, None,
                                         None, 0.1, True, False, BwdConfigSm90(), sink=s)
    assert [g.shape for g in grads] == [q[:0].shape, k[:0].shape, v[:0].shape, s.shape]
    assert not grads[3].any() and fake_bwd == []
    grads = bwd_launch.launch_bwd_varlen(dout, q, k, v, dout, lse, cq, ck, 7, 0, None, None, 0.1, True, False,
                                         BwdConfigSm90())
    assert all(not g.any() for g in grads) and fake_bwd == []


@pytest.fixture
def fake_gpu(fake_bwd, monkeypatch):
    """Both directions faked: the forward's kernel by tests/fa4/test_varlen_host's model."""
    from tests.fa4.test_varlen_host import install_fake_forward

    install_fake_forward(monkeypatch)
    return fake_bwd


@pytest.mark.parametrize("feat,sink", [(dict(causal=True), False),
                                       (dict(causal=True, window_size=(30, 0), softcap=8.0), True)],
                         ids=["causal", "all"])
def test_autograd_through_flash_attn_varlen_func(fake_gpu, feat, sink):
    """Gradients of q, k, v, the sink and through the returned LSE reach the leaves; the backward
    gets the forward's out and lse and the canonical features."""
    q, k, v, dout, s, dl, cq, ck = packed([90, 0, 1, 140], [90, 4, 1, 100], 4, 2, sink=sink, dlse=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([s.clone().requires_grad_()] if sink else [])
    o, lse = fa4.flash_attn_varlen_func(*leaves[:3], cq, ck, 140, 100, learnable_sink=leaves[3] if sink else None,
                                        return_lse=True, **feat)
    torch.autograd.backward([o, lse], [dout, dl])
    f = dict(causal=True, window_left=-1, window_right=-1, softcap=0.0)
    if "window_size" in feat:
        f.update(window_left=30, softcap=8.0)
    _, _, want = reference(q, k, v, dout, s, dl, cq, ck, out=o.detach(), **f)
    assert_close([t.grad for t in leaves], want)
    key = next(k_ for k_ in fake_gpu if isinstance(k_, BwdKernelKey))
    assert key.gqa and key.causal and key.has_sink == sink and key.has_softcap == sink


def test_grad_path_refusals():
    q, k, v, _, _, _, cq, ck = packed([5, 7])
    qg = q.clone().requires_grad_()
    with pytest.raises(ValueError, match="CUDA"):
        fa4.flash_attn_varlen_func(qg, k, v, cq, ck, 7, 7, causal=True)
    with pytest.raises(ValueError, match="out="):
        fa4.varlen.varlen_forward(qg, k, v, cq, ck, 7, 7, out=torch.empty_like(q))
    with pytest.raises(ValueError, match="deterministic"):
        fa4.flash_attn_varlen_func(qg, k, v, cq, ck, 7, 7, deterministic=1)
    # An empty batch has nothing to launch on any device: zero gradients.
    none = torch.zeros(1, dtype=torch.int32)
    qe = q[:0].clone().requires_grad_()
    o = fa4.flash_attn_varlen_func(qe, k[:0], v[:0], none, none, 0, 0)
    o.sum().backward()
    assert qe.grad is None or not qe.grad.any()
