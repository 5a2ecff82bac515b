"""The packed varlen backward on the GPU against PyTorch autograd in fp32, sequence by sequence.

The error rule of tests/fa4/test_bwd_feat_gpu.py (bench/check_bwd_feat.grads_match): each gradient
within 2x the larger of PyTorch's own same-dtype error and the error the rounded ``out`` forces on
any backward using D = rowsum(dO O) (rounded_out_grads), over the whole packed tensor; dsink summed
over every sequence's rows; NaN never passes. The backward's out and lse are the fp32 reference's
(the backward alone), except in the end-to-end autograd tests. The memory the gradients and the
side buffers are carved from is handed back NaN-filled before each run, so a row the kernels
should write and do not shows up.

Cases: the issue's mix (8 documents of 512-4096 tokens, 16k in all, H=16, hd128, causal), documents
of length 0 and 1 inside a packed batch (Sq != Sk per sequence), GQA 4:1, fp16, window + softcap +
sink + the LSE's gradient, seqused_q/seqused_k, deterministic bitwise over 10 runs, and
flash_attn_varlen_func's autograd (the transformers packed path's grads against per-document dense
grads in tests/fa4/test_transformers_integration.py's GPU test).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import fa4  # noqa: E402
from fa4.features import normalize  # noqa: E402
from fa4.sm90.bwd_config import violations  # noqa: E402
from fa4.sm90.bwd_defaults import default_config  # noqa: E402
from fa4.sm90.bwd_launch import launch_bwd_varlen  # noqa: E402
from fa4.varlen import bwd_problem, cu_seqlens  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "check_bwd_feat", Path(__file__).resolve().parents[2] / "bench" / "check_bwd_feat.py")
cbf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cbf)

ISSUE_LENS = [2048, 512, 4096, 1024, 3072, 1536, 2560, 1536]  # 16384 tokens, 512..4096
NAN = float("nan")


def cu(lens):
    return cu_seqlens(lens)


class Case:
    """A packed batch, its fp32 reference forward (out in dtype, lse) and upstream gradients."""

    def __init__(self, lens_q, lens_k=None, hq=4, hkv=4, hd=128, causal=True, window=(None, None), softcap=0.0,
                 sink=False, dlse=False, dtype=torch.bfloat16, used_q=None, used_k=None, seed=0):
        self.lens_q, self.lens_k = list(lens_q), list(lens_k or lens_q)
        self.eff_q, self.eff_k = list(used_q or self.lens_q), list(used_k or self.lens_k)
        self.hq, self.hkv, self.hd, self.dtype = hq, hkv, hd, dtype
        g = torch.Generator(device="cuda").manual_seed(1000 * seed + sum(self.lens_q) + hd)
        tq, tk = sum(self.lens_q), sum(self.lens_k)
        self.q = torch.randn(tq, hq, hd, device="cuda", generator=g).to(dtype)
        self.k = torch.randn(tk, hkv, hd, device="cuda", generator=g).to(dtype)
        self.v = torch.randn(tk, hkv, hd, device="cuda", generator=g).to(dtype)
        self.dout = torch.randn(tq, hq, hd, device="cuda", generator=g).to(dtype)
        self.sink = torch.randn(hq, device="cuda", generator=g) * 2 if sink else None
        self.dlse = torch.randn(hq, tq, device="cuda", generator=g) if dlse else None
        self.cq, self.ck = cu(self.lens_q), cu(self.lens_k)
        self.uq = None if used_q is None else torch.tensor(used_q, dtype=torch.int32, device="cuda")
        self.uk = None if used_k is None else torch.tensor(used_k, dtype=torch.int32, device="cuda")
        self.max_q, self.max_k = max(self.eff_q, default=0), max(self.eff_k, default=0)
        f = normalize(self.q[None], causal, window, self.sink, softcap)
        self.feat = dict(causal=f.causal, window_left=f.window_left, window_right=f.window_right, softcap=f.softcap)
        self.scale = 1 / math.sqrt(hd)
        self.out = torch.zeros(tq, hq, hd, device="cuda", dtype=dtype)
        self.lse = torch.full((hq, tq), -math.inf, device="cuda")
        with torch.no_grad():
            for b, (a, n, ka, nk) in enumerate(self.spans()):
                if n == 0:
                    continue
                o, lse = cbf.attention(self.q[None, a:a + n].float(), self.k[None, ka:ka + nk].float(),
                                       self.v[None, ka:ka + nk].float(), self.scale, sink=self.sink, **self.feat)
                self.out[a:a + n] = o[0].to(dtype)
                self.lse[:, a:a + n] = lse[0].float()

    def spans(self):
        """(offset_q, rows used, offset_k, keys used) per sequence."""
        return [(int(self.cq[b]), self.eff_q[b], int(self.ck[b]), self.eff_k[b]) for b in range(len(self.lens_q))]

    def config(self, deterministic=False, **change):
        window = tuple(None if w < 0 else w for w in (self.feat["window_left"], self.feat["window_right"]))
        feat = normalize(self.q[None], self.feat["causal"], window, self.sink, self.feat["softcap"])
        p = bwd_problem(self.q, self.k, self.v, len(self.lens_q), max(self.max_q, 1), max(self.max_k, 1), feat,
                        deterministic)
        c = dataclasses.replace(default_config(p), **change)
        assert not violations(c, p), violations(c, p)
        return c

    def poison(self):
        """Hand the caching allocator NaN-filled blocks of the gradients' and side buffers' sizes."""
        from fa4.common.varlen import padded_total
        from fa4.sm90.bwd_compile import SEQ_PAD

        tq_pad = padded_total(self.q.shape[0], len(self.lens_q), SEQ_PAD)
        blocks = [torch.full_like(t, NAN) for t in (self.q, self.k, self.v)]
        blocks.append(torch.full((self.hq * tq_pad * (2 + self.hd),), NAN, device="cuda"))
        del blocks

    def run(self, deterministic=False, config=None):
        config = config or self.config(deterministic)
        self.poison()
        grads = launch_bwd_varlen(self.dout, self.q, self.k, self.v, self.out, self.lse, self.cq, self.ck, self.max_q,
                                  self.max_k, self.uq, self.uk, self.scale, self.feat["causal"], deterministic, config,
                                  dlse=self.dlse, window_left=self.feat["window_left"],
                                  window_right=self.feat["window_right"], softcap=self.feat["softcap"], sink=self.sink)
        torch.cuda.synchronize()
        return grads

    def reference(self, out=None):
        """(fp32, same-dtype, rounded-out) gradients, packed like ours; zeros for unused rows."""
        out = self.out if out is None else out
        sets = []
        for kind in ("fp32", "low", "rounded"):
            dq, dk, dv = (torch.zeros_like(t, dtype=torch.float32) for t in (self.q, self.k, self.v))
            dsink = torch.zeros(self.hq, device="cuda") if self.sink is not None else None
            for a, n, ka, nk in self.spans():
                if n == 0:
                    continue
                args = (self.q[None, a:a + n], self.k[None, ka:ka + nk], self.v[None, ka:ka + nk],
                        self.dout[None, a:a + n])
                dl = None if self.dlse is None else self.dlse[None, :, a:a + n]
                kw = dict(sink=self.sink, scale=self.scale, **self.feat)
                if kind == "fp32":
                    g = cbf.reference_grads(*args, dl, torch.float32, **kw)
                elif kind == "low":
                    g = cbf.reference_grads(*args, dl, self.dtype, **kw)
                else:
                    g = cbf.rounded_out_grads(*args, dl, out[None, a:a + n], **kw)
                dq[a:a + n] = g[0][0].float()
                dk[ka:ka + nk] += g[1][0].float()
                dv[ka:ka + nk] += g[2][0].float()
                if dsink is not None:
                    dsink += g[3].float()
            sets.append((dq, dk, dv) + ((dsink,) if dsink is not None else ()))
        return sets

    def check(self, grads, out=None):
        ref, low, floor = self.reference(out)
        info, ok = {}, len(grads) == len(ref)
        for name, g, r, lo, fl in zip(("dq", "dk", "dv", "dsink"), grads, ref, low, floor):
            if g.numel() == 0:
                continue
            err = (g.float() - r).abs().max().item()
            err_pt = (lo - r).abs().max().item()
            err_out = (fl - r).abs().max().item()
            ulp = (r.to(self.dtype).float() - r).abs().max().item()
            nan = bool(torch.isnan(g).any().item())
            good = not nan and g.shape == r.shape and err <= 2 * max(err_pt, err_out) + 2 * ulp + 1e-5
            info[name] = dict(err=err, err_torch=err_pt, err_rounded_out=err_out, nan=nan, ok=good)
            ok &= good
        self.check_unused(grads)
        return ok, info

    def check_unused(self, grads):
        """Rows past seqused: exactly zero gradients (never written, never NaN)."""
        used_q = torch.zeros(self.q.shape[0], dtype=torch.bool, device="cuda")
        used_k = torch.zeros(self.k.shape[0], dtype=torch.bool, device="cuda")
        for a, n, ka, nk in self.spans():
            used_q[a:a + n] = True
            used_k[ka:ka + nk] = True
        assert torch.equal(grads[0][~used_q], torch.zeros_like(grads[0][~used_q]))
        assert torch.equal(grads[1][~used_k], torch.zeros_like(grads[1][~used_k]))
        assert torch.equal(grads[2][~used_k], torch.zeros_like(grads[2][~used_k]))


def test_issue_mix():
    """8 documents of 512-4096 tokens, 16k in all, H=16, hd128, causal, bf16 (with the LSE's gradient)."""
    c = Case(ISSUE_LENS, hq=16, hkv=16, hd=128, causal=True, dlse=True)
    ok, info = c.check(c.run())
    assert ok, info


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_lengths_0_and_1_inside_a_batch(hd, causal):
    """Empty and one-token documents between longer ones, Sq != Sk per document (keys without
    queries get zero dK/dV; queries without keys zero dQ), tiles crossing document ends."""
    lens_q = [300, 0, 1, 129, 0, 64, 1, 200]
    lens_k = [300, 5, 1, 77, 0, 0, 130, 1]
    c = Case(lens_q, lens_k, hq=4, hkv=4, hd=hd, causal=causal, dlse=True)
    grads = c.run()
    ok, info = c.check(grads)
    assert ok, info
    # Keys of a document with no query row: exactly zero.
    assert torch.equal(grads[1][300:305], torch.zeros_like(grads[1][300:305]))


@pytest.mark.parametrize("causal", [False, True])
def test_gqa_4_to_1(causal):
    c = Case([700, 1, 1500, 333, 0, 1024], hq=16, hkv=4, hd=128, causal=causal, dlse=True)
    ok, info = c.check(c.run())
    assert ok, info


@pytest.mark.parametrize("hd", [64, 128])
def test_fp16(hd):
    c = Case([513, 1000, 77, 2048], [600, 1000, 77, 1500], hq=8, hkv=2, hd=hd, causal=True, dtype=torch.float16)
    ok, info = c.check(c.run())
    assert ok, info


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_window_softcap_sink_combined(hd, causal):
    """Window, softcap, a learnable sink and the LSE's gradient at once, GQA 2:1; dsink sums over
    every document's rows."""
    c = Case([900, 1, 0, 400, 1300], [700, 1, 3, 400, 1300], hq=8, hkv=4, hd=hd, causal=causal,
             window=(200, 30), softcap=20.0, sink=True, dlse=True)
    ok, info = c.check(c.run())
    assert ok, info


def test_seqused():
    """seqused_q/seqused_k shorter than the cu_seqlens spans: the unused rows get zero gradients."""
    c = Case([500, 300, 800], [600, 300, 800], hq=4, hkv=2, hd=128, causal=True, used_q=[400, 0, 800],
             used_k=[600, 120, 1])
    ok, info = c.check(c.run())
    assert ok, info


@pytest.mark.parametrize("hd,kw", [(64, dict(causal=True)), (128, dict(causal=True)), (128, dict(causal=False, hkv=2)),
                                   (128, dict(causal=True, window=(150, 0), softcap=20.0, sink=True, hkv=2))],
                         ids=["hd64-causal", "hd128-causal", "hd128-gqa", "hd128-all"])
@pytest.mark.parametrize("spt", [True, False])
def test_deterministic_bitwise(hd, kw, spt):
    """Ten deterministic backwards bitwise identical and right (dQ turns per document and query
    tile; under GQA the dK/dV turns too), under both launch orders."""
    kw = dict(kw)
    c = Case([1000, 1, 0, 513, 1500], hq=8, hkv=kw.pop("hkv", 8), hd=hd, dlse=True, **kw)
    cfg = c.config(True, spt_order=spt)
    first = c.run(True, cfg)
    same = sum(all(torch.equal(a, b) for a, b in zip(first, c.run(True, cfg))) for _ in range(9))
    assert same == 9, same
    ok, info = c.check(first)
    assert ok, info


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=False, window=(64, 10)),
                                dict(causal=True, window=(100, 0), softcap=15.0, sink=True, hkv=2)],
                         ids=["causal", "right-window", "gqa-all"])
@pytest.mark.parametrize("used", [False, True], ids=["full", "seqused"])
def test_deterministic_rows_that_see_no_key(kw, used):
    """Deterministic with Sq > Sk inside sequences: the preprocess zeroes each sequence's own prefix of
    rows that see no key (from its own lengths, seqused included) and the first dQ turn stores the
    rest. A wrong bound leaves NaN from the poisoned allocator or a stale sum in dQ; two runs bitwise
    equal."""
    kw = dict(kw)
    extra = dict(used_q=[900, 200, 0, 640, 130], used_k=[250, 257, 0, 1, 64]) if used else {}
    c = Case([900, 257, 0, 640, 130], [300, 257, 0, 1, 700], hq=4, hkv=kw.pop("hkv", 4), hd=128, **kw, **extra)
    cfg = c.config(True)
    first = c.run(True, cfg)
    assert all(torch.equal(a, b) for a, b in zip(first, c.run(True, cfg)))
    ok, info = c.check(first)
    assert ok, info


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=True, window=(100, 0), softcap=15.0, sink=True)],
                         ids=["causal", "all"])
def test_autograd_end_to_end(kw):
    """flash_attn_varlen_func with requires_grad: our forward, then our backward through autograd,
    with a loss on both out and the returned LSE (and the sink as a learnable parameter)."""
    c = Case([1024, 0, 1, 777, 2000], hq=8, hkv=2, hd=128, dlse=True, **kw)
    q, k, v = (t.detach().clone().requires_grad_() for t in (c.q, c.k, c.v))
    s = None if c.sink is None else c.sink.detach().clone().requires_grad_()
    window = tuple(None if w < 0 else w for w in (c.feat["window_left"], c.feat["window_right"]))
    o, lse = fa4.flash_attn_varlen_func(q, k, v, c.cq, c.ck, c.max_q, c.max_k, causal=c.feat["causal"],
                                        window_size=window, softcap=c.feat["softcap"], learnable_sink=s,
                                        return_lse=True)
    c.poison()
    torch.autograd.backward([o, lse], [c.dout, c.dlse])
    torch.cuda.synchronize()
    grads = [q.grad, k.grad, v.grad] + ([s.grad] if s is not None else [])
    ok, info = c.check(grads, out=o.detach())
    assert ok, info


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=True, window=(100, 0), softcap=15.0, sink=True)],
                         ids=["causal", "all"])
def test_torch_compile_fullgraph_equals_eager(kw):
    """flash_attn_varlen_func under torch.compile(fullgraph=True), deterministic: the graphs keep
    fa4::varlen_fwd / varlen_bwd, and output, LSE and every gradient (the sink's included) equal the
    eager call's bit for bit (same kernels, same configs, fixed reduction order); and they are right."""
    c = Case([1024, 0, 1, 777, 2000], hq=8, hkv=2, hd=128, dlse=True, **kw)
    window = tuple(None if w < 0 else w for w in (c.feat["window_left"], c.feat["window_right"]))

    def f(q, k, v, s):
        o, lse = fa4.flash_attn_varlen_func(q, k, v, c.cq, c.ck, c.max_q, c.max_k, causal=c.feat["causal"],
                                            window_size=window, softcap=c.feat["softcap"], learnable_sink=s,
                                            return_lse=True, deterministic=True)
        return (o.float() * c.dout.float()).sum() + (lse * c.dlse).sum(), o, lse

    runs = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in (c.q, c.k, c.v)]
        s = None if c.sink is None else c.sink.detach().clone().requires_grad_()
        loss, o, lse = fn(*leaves, s)
        loss.backward()
        runs.append((o.detach(), lse.detach(), [t.grad for t in leaves] + ([s.grad] if s is not None else [])))
    (o_e, lse_e, g_e), (o_c, lse_c, g_c) = runs
    assert torch.equal(o_c, o_e) and torch.equal(lse_c, lse_e)
    assert all(torch.equal(a, b) for a, b in zip(g_e, g_c))
    ok, info = c.check(g_c, out=o_c)
    assert ok, info


@pytest.mark.parametrize("hd", [96, 192, 256])
def test_other_head_dims(hd):
    """The head dims of the dense backward beyond 64/128 (192/256: the dkv_split 'head_dim' kernel)."""
    c = Case([300, 1, 0, 700], [350, 1, 2, 700], hq=4, hkv=2, hd=hd, causal=True, dlse=True)
    ok, info = c.check(c.run())
    assert ok, info


# The queries-on-M tiling (qm_tile_n, fa4.sm90.bwd_qm): not the varlen default until these pass on a GPU.
QM_VARLEN = {192: dict(qm_tile_n=96, stages=2, do_single=True, ds_stages=1, dq_accum="bulk"),
             256: dict(qm_tile_n=48, cluster_exchange=False, stages=2, do_single=True, ds_stages=1, dq_accum="bulk",
                       ds_store="sts", dk_before_dq=False)}


@pytest.mark.parametrize("hd", [192, 256])
@pytest.mark.parametrize("kw", [dict(causal=True, hkv=2), dict(causal=False, hkv=4),
                                dict(causal=True, hkv=2, window=(150, 0), softcap=20.0, sink=True)],
                         ids=["causal-gqa", "noncausal", "all-gqa"])
@pytest.mark.parametrize("grid", ["padded", "compact"])
def test_qm_tiling(hd, kw, grid):
    """96- and 48-key tiles crossing document ends (Sq != Sk per document, empty and one-token
    documents), GQA's fp32 dK/dV adds past a document's keys left out, both grids."""
    kw = dict(kw)
    c = Case([300, 1, 0, 700, 97], [350, 1, 2, 700, 95], hq=4, hkv=kw.pop("hkv"), hd=hd, dlse=True, **kw)
    ok, info = c.check(c.run(False, c.config(False, varlen_grid=grid, **QM_VARLEN[hd])))
    assert ok, info


@pytest.mark.parametrize("hd", [192, 256])
def test_qm_tiling_deterministic_bitwise(hd):
    c = Case([1000, 1, 0, 513, 1500], hq=8, hkv=2, hd=hd, causal=True, dlse=True)
    cfg = c.config(True, **QM_VARLEN[hd])
    first = c.run(True, cfg)
    same = sum(all(torch.equal(a, b) for a, b in zip(first, c.run(True, cfg))) for _ in range(9))
    assert same == 9, same
    ok, info = c.check(first)
    assert ok, info


@pytest.mark.parametrize("kw", [{}, dict(sliding_window=128, softcap=30.0)], ids=["causal", "window-softcap"])
def test_transformers_packed_grads_equal_per_document_dense(kw):
    """fa4.integrations.transformers' packed path (position ids that restart, one row) trains: its
    grads equal those of each document through the dense fa4.flash_attn_func, within the dense
    path's own error against the fp32 reference."""
    from fa4.integrations import transformers as fa4_hf

    module = type("Attn", (torch.nn.Module,), {"is_causal": True})()
    lens, h, hkv, d = [300, 1, 700, 129, 513], 8, 2, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    total = sum(lens)
    q = torch.randn(1, h, total, d, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, hkv, total, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    dout = torch.randn(1, total, h, d, device="cuda", generator=g).to(torch.bfloat16)
    pos = torch.cat([torch.arange(n, device="cuda") for n in lens])[None]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = fa4_hf.attention_forward(module, *leaves, None, position_ids=pos, **kw)
    out.backward(dout)
    packed = [t.grad.transpose(1, 2) for t in leaves]  # (1, S, H, D)
    window, softcap = (None, None), 0.0
    if kw:
        window, softcap = fa4_hf.window_of(kw["sliding_window"], True, 10**9), kw["softcap"]
    a = 0
    for n in lens:
        doc = [t[:, :, a:a + n].transpose(1, 2).detach().clone().requires_grad_() for t in (q, k, v)]
        extra = dict(softcap=softcap) if softcap else {}
        if window != (None, None) and n > kw["sliding_window"]:
            extra["window_size"] = window
        o = fa4.flash_attn_func(*doc, causal=True, **extra)
        o.backward(dout[:, a:a + n])
        feat = dict(causal=True, window_left=window[0] if "window_size" in extra else -1, window_right=-1,
                    softcap=softcap)
        ref = cbf.reference_grads(*(t.detach() for t in doc), dout[:, a:a + n], None, torch.float32,
                                  scale=d ** -0.5, **feat)
        low = cbf.reference_grads(*(t.detach() for t in doc), dout[:, a:a + n], None, torch.bfloat16,
                                  scale=d ** -0.5, **feat)
        for name, p, dense, r, lo in zip(("dq", "dk", "dv"), packed, doc, ref, low):
            mine = p[:, a:a + n].float()
            err_dense = (dense.grad.float() - r).abs().max().item()
            err_pt = (lo.float() - r).abs().max().item()
            diff = (mine - dense.grad.float()).abs().max().item()
            assert not torch.isnan(mine).any()
            assert diff <= 2 * max(err_dense, err_pt) + 1e-5, (name, n, diff, err_dense, err_pt)
        a += n


@pytest.mark.parametrize("case", [
    dict(lens_q=[300, 0, 1, 129, 0, 64, 1, 200], lens_k=[300, 5, 1, 77, 0, 0, 130, 1], hq=4, hkv=4, hd=64, causal=False),
    dict(lens_q=[300, 0, 1, 129, 0, 64, 1, 200], lens_k=[300, 5, 1, 77, 0, 0, 130, 1], hq=4, hkv=4, hd=128, causal=True),
    dict(lens_q=[700, 1, 1500, 333, 0, 1024], hq=16, hkv=4, hd=128, causal=True),
    dict(lens_q=[128, 256, 1, 127, 129], hq=4, hkv=4, hd=128, causal=True, window=(100, 0), softcap=20.0, sink=True),
    dict(lens_q=[500, 300, 800], lens_k=[600, 300, 800], hq=4, hkv=2, hd=128, causal=True, used_q=[400, 0, 800],
         used_k=[600, 120, 1]),
], ids=["hd64-0-and-1", "hd128-causal-0-and-1", "gqa", "window-softcap-sink", "seqused"])
@pytest.mark.parametrize("spt", [True, False])
def test_compact_grid(case, spt):
    """varlen_grid 'compact' (no CTA for the key tiles a document lacks; each CTA finds its document
    by a binary search over cu_seqlens_k): right against the fp32 reference under both launch orders,
    documents of 0 and 1 keys, tile-multiple lengths (a spare tile each), seqused, GQA, every feature;
    and the same gradients as the padded grid up to the fp32 reduction order."""
    case = dict(case)
    c = Case(case.pop("lens_q"), case.pop("lens_k", None), dlse=True, **case)
    grads = c.run(False, c.config(False, varlen_grid="compact", spt_order=spt))
    ok, info = c.check(grads)
    assert ok, info
    padded = c.run(False, c.config(False, spt_order=spt))
    for g, p in zip(grads, padded):
        assert torch.allclose(g.float(), p.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("spt", [True, False])
def test_compact_grid_deterministic_bitwise(spt):
    """Deterministic with the compact grid: ten runs bitwise equal and right (the dQ turns of a
    document's key tiles follow the launch order within the document as with the padded grid)."""
    c = Case([1000, 1, 0, 513, 1500, 128], hq=8, hkv=2, hd=128, causal=True, dlse=True)
    cfg = c.config(True, varlen_grid="compact", spt_order=spt)
    first = c.run(True, cfg)
    same = sum(all(torch.equal(a, b) for a, b in zip(first, c.run(True, cfg))) for _ in range(9))
    assert same == 9, same
    ok, info = c.check(first)
    assert ok, info


@pytest.mark.parametrize("hd,change", [(64, {}), (128, {}), (128, dict(varlen_grid="compact")), (192, {}),
                                       (256, dict(cluster_exchange=False)), (192, QM_VARLEN[192])],
                         ids=["hd64", "hd128", "hd128-compact", "hd192", "hd256", "hd192-qm"])
@pytest.mark.parametrize("starts", [4, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_shifted_walks(hd, change, starts, causal):
    """q_starts (fa4.common.bwd_schedule.walk_tile) over each document's own runs of unmasked query
    tiles: documents of 0 and 1 tokens, fewer query tiles than starts, Sq != Sk per document (causal:
    the longest document's keys outnumber its queries, where the knob applies), GQA, the LSE's gradient."""
    c = Case([300, 1, 0, 700, 97, 1500], [350, 1, 2, 900, 95, 2100], hq=8, hkv=2, hd=hd, causal=causal, dlse=True)
    cfg = c.config(False, q_starts=starts, **change)
    ok, info = c.check(c.run(False, cfg))
    assert ok, info


@pytest.mark.parametrize("hd,change", [(64, {}), (128, {}), (128, dict(varlen_grid="compact")), (192, {}),
                                       (256, dict(cluster_exchange=False)), (192, QM_VARLEN[192])],
                         ids=["hd64", "hd128", "hd128-compact", "hd192", "hd256", "hd192-qm"])
@pytest.mark.parametrize("det", [False, True], ids=["nondet", "det"])
def test_walking_down(hd, change, det):
    """walk_down (fa4.common.bwd_schedule.walk_down_tile) over each document's own query tiles, the
    diagonal's masked tiles last: documents of 0 and 1 tokens, Sq != Sk both ways per document, GQA,
    the LSE's gradient; deterministic (longest key tiles first) ten runs bitwise equal and right."""
    c = Case([300, 1, 0, 700, 97, 1500], [350, 1, 2, 900, 95, 1100], hq=8, hkv=2, hd=hd, causal=True, dlse=True)
    cfg = c.config(det, walk_down=True, **(dict(change, spt_order=False) if det else change))
    first = c.run(det, cfg)
    if det:
        same = sum(all(torch.equal(a, b) for a, b in zip(first, c.run(True, cfg))) for _ in range(9))
        assert same == 9, same
    ok, info = c.check(first)
    assert ok, info
