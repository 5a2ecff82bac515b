"""Host side of the backward (CPU): config resolution, input checks, the dispatch entry."""

import math

import pytest
import torch

from fa4.arch import SM90, SM100
from fa4.dispatch import bwd_entry
from fa4.sm90.bwd_compile import SEQ_PAD, padded
from fa4.sm90.bwd_config import BwdConfigSm90
from fa4.sm90.bwd_defaults import default_config
from fa4.sm90.bwd_launch import flash_attn_bwd, launch_bwd, resolve_config
from fa4.sm90 import bwd_launch
from fa4.tensors import problem_of


def tensors(b=1, sq=100, sk=100, hq=4, hkv=4, d=64, dtype=torch.bfloat16):
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    k = torch.randn(b, sk, hkv, d, dtype=dtype)
    v = torch.randn(b, sk, hkv, d, dtype=dtype)
    return q, k, v


def test_resolve_config():
    q, k, v = tensors()
    prob = problem_of(q, k, v, causal=True, pass_="bwd", deterministic=True)
    assert prob.pass_ == "bwd" and prob.deterministic and prob.causal
    cfg = resolve_config(prob, None)
    assert cfg == default_config(prob)
    # An older client's dict that still names the retired knob reads as the same config.
    assert resolve_config(prob, {"deterministic": True, "dq_accum": "red_v2"}) == BwdConfigSm90(dq_accum="red_v2")
    with pytest.raises(ValueError, match="registers"):
        resolve_config(prob, BwdConfigSm90(tile_m=128, stages=1, dv_operand="rmem"))
    with pytest.raises(ValueError):
        resolve_config(prob, {"tile_m": 96})
    with pytest.raises(ValueError, match="BwdConfigSm90"):
        resolve_config(prob, "fast")


def test_inputs_are_checked_before_any_launch(monkeypatch):
    q, k, v = tensors()
    out = torch.empty_like(q)
    lse = torch.empty(1, 4, 100)
    with pytest.raises(ValueError, match="CUDA"):
        flash_attn_bwd(q, q, k, v, out, lse)
    # The rest with the device check off (CPU tensors here), each with what it names. None of
    # them may reach a compile or a launch: those are replaced by a failure.
    from fa4.tensors import validate
    from fa4.sm90 import bwd_launch

    monkeypatch.setattr(bwd_launch, "validate", lambda q, k, v: validate(q, k, v, require_cuda=False))
    monkeypatch.setattr(bwd_launch, "compiled", lambda *a: pytest.fail("compiled or launched after bad inputs"))
    # Every head dim pair the forward takes, the backward takes too; others it names.
    from fa4.sm90.fwd_config import HEAD_DIMS, head_dims_v
    from fa4.tensors import bwd_head_dim_error

    for d in HEAD_DIMS:
        for dv in head_dims_v(d):
            assert bwd_head_dim_error(torch.empty(1, 1, 1, d), torch.empty(1, 1, 1, dv)) is None, (d, dv)
    assert "not head_dim 80" in bwd_head_dim_error(torch.empty(1, 1, 1, 80), torch.empty(1, 1, 1, 80))
    assert "head_dim_v 64" in bwd_head_dim_error(torch.empty(1, 1, 1, 192), torch.empty(1, 1, 1, 64))
    cases = [
        ((q[:, :50], q, k, v, out, lse), r"dout must be \(1, 100, 4, 64\)"),
        ((q, q, k, v, out.half(), lse), r"out must be \(1, 100, 4, 64\) .* dtype"),
        ((q, q, k, v, out, lse[:, :, :50]), r"lse must be fp32 of shape \(1, 4, 100\)"),
        ((q, q, k, v, out, lse.double()), "lse must be fp32"),
        ((q, q, k, v, out, lse), "infeasible config"),
    ]
    for args, match in cases:
        kw = {"config": {"tile_m": 128, "stages": 1, "dv_operand": "rmem"}} if match == "infeasible config" else {}
        with pytest.raises(ValueError, match=match):
            flash_attn_bwd(*args, **kw)


def test_padding_covers_every_tile():
    for s in (1, 63, 64, 65, 127, 128, 129, 8191, 8192):
        p = padded(s)
        assert p >= s and p % SEQ_PAD == 0 and p - s < SEQ_PAD
        for tile_m in (64, 128):
            assert -(-s // tile_m) * tile_m <= p


def test_dispatch_entry(monkeypatch):
    e = bwd_entry(SM90)
    assert e.config_cls is BwdConfigSm90 and bwd_entry(SM90) is e  # built once per arch
    # The entry's run is launch_bwd, read at each call (so a replaced launch is the one run).
    assert launch_bwd.__module__ == "fa4.sm90.bwd_launch"
    monkeypatch.setattr(bwd_launch, "launch_bwd", lambda *a, **kw: ("ran", a, kw))
    assert e.run(1, 2, x=3) == ("ran", (1, 2), {"x": 3})
    with pytest.raises(NotImplementedError, match="sm100"):
        bwd_entry(SM100)


def test_check_script_reference_matches_sdpa():
    """bench/check_bwd.py's reference (the yardstick of the GPU checks) against PyTorch SDPA on CPU."""
    import torch.nn.functional as F

    from tests.fa4 import cpu_kernels

    mod = cpu_kernels.check_bwd()
    torch.manual_seed(0)
    for causal in (False, True):
        q, k, v = tensors(b=2, sq=37, sk=37, hq=4, hkv=2, d=16, dtype=torch.float64)
        dout = torch.randn_like(q)
        scale = 0.25
        grads = mod.reference_grads(q, k, v, dout, causal, scale, torch.float64)
        qs, ks, vs = (t.transpose(1, 2).clone().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=True)
        want = torch.autograd.grad(o, (qs, ks, vs), dout.transpose(1, 2))
        for g, w in zip(grads, want):
            torch.testing.assert_close(g, w.transpose(1, 2), rtol=1e-9, atol=1e-9)
    # Bottom-right causal with Sq > Sk: the first Sq - Sk query rows see no key and get zero grads.
    q, k, v = tensors(b=1, sq=9, sk=4, hq=2, hkv=1, d=8, dtype=torch.float64)
    dq, dk, dv = mod.reference_grads(q, k, v, torch.randn_like(q), True, 0.5, torch.float64)
    assert torch.equal(dq[:, :5], torch.zeros_like(dq[:, :5])) and dq[:, 5:].abs().sum() > 0
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()


def test_check_script_error_rule_floor_for_a_cancelled_gradient():
    """The error rule on CPU (bf16 inputs, the fp32 reference as "ours" plus a perturbation): with
    one key dK is exactly 0 (dS = P (dP - D) cancels), so fp32 rounding of ~1e-5 there (what the
    H200 shows) passes under fp32_floor (16 epsilons of the largest gradient), while four times
    the floor in dK, or twice dV's bf16 allowance, fails."""
    from tests.fa4 import cpu_kernels

    mod = cpu_kernels.check_bwd()
    torch.manual_seed(0)
    q, k, v = tensors(b=3, sq=65, sk=1, hq=2, hkv=1, d=64, dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    scale = 0.125
    ref = mod.reference_grads(q, k, v, dout, False, scale, torch.float32)
    assert ref[1].abs().max().item() == 0.0  # dK cancels exactly in autograd
    floor = mod.fp32_floor(ref)
    assert floor == 16 * torch.finfo(torch.float32).eps * max(r.abs().max().item() for r in ref) > 1e-5

    def rule(dk_noise, dv_noise=0.0):
        grads = (ref[0], ref[1] + dk_noise, ref[2] + dv_noise)
        return mod.grads_match_reference(grads, q, k, v, dout, False, scale)

    ok, info = rule(1.1e-5)
    assert ok and info["dk"]["err_torch"] == 0.0, info
    assert not rule(4 * floor)[0]
    # dV's allowance is bf16's (its torch error and rounding, ~0.1 at |dV| ~ 30): twice that fails.
    dv_allowed = 2 * info["dv"]["err_torch"] + 2 * (ref[2].bfloat16().float() - ref[2]).abs().max().item() + floor
    assert rule(0.0, 0.5 * dv_allowed)[0] and not rule(0.0, 2 * dv_allowed)[0]


@pytest.mark.parametrize("window,causal", [("1023,0", False), ("-1,-1", True), ("7,-1", False)])
def test_profile_script_runs_the_problem_it_names(monkeypatch, window, causal):
    """bench/profile_bwd.py (what ncu profiles) with the GPU faked: its backward gets the window
    it was given (a bounded side only) and the default config of the windowed problem, and its
    gradients are that problem's (tests/fa4/cpu_kernels' reference math)."""
    from fa4.sm90 import bwd_launch
    from fa4.sm90.bwd_defaults import default_config
    from fa4.tensors import problem_of
    from tests.fa4 import cpu_kernels

    cpu_kernels.install(monkeypatch)
    seen = []

    def fake_bwd(dout, q, k, v, out, lse, scale, causal_, deterministic, config, **feat):
        seen.append((causal_, config, feat))
        left, right = feat.get("window_left", -1), feat.get("window_right", -1)
        return cpu_kernels.backward_math(dout, q, k, v, q.shape[3] ** -0.5, causal_, None, left, right)

    monkeypatch.setattr(bwd_launch, "flash_attn_bwd", fake_bwd)
    mod = cpu_kernels.bench_module(monkeypatch, "profile_bwd")
    argv = ["--seqlen", "40", "--hdim", "64", "--width", "128", f"--window={window}", "--no-ref"]
    a = mod.parse(argv + (["--causal"] if causal else []))
    runs, cfg = mod.backwards(a, device="cpu", tokens=80)  # two heads from --width
    assert set(runs) == {"ours"}
    dq, dk, dv = runs["ours"]()
    left, right = (int(x) for x in window.split(","))
    (c, used, feat), = seen
    assert c == causal and used == cfg
    assert feat == {n: x for n, x in dict(window_left=left, window_right=right).items() if x >= 0}
    g = torch.Generator().manual_seed(7)
    q, k, v, dout = (torch.randn(2, 40, 2, 64, dtype=torch.bfloat16, generator=g) for _ in range(4))
    assert cfg == default_config(problem_of(q, k, v, causal, pass_="bwd", window_left=left, window_right=right))
    want = cpu_kernels.backward_math(dout, q, k, v, 64 ** -0.5, causal, None, left, right)
    for got, ref in zip((dq, dk, dv), want):
        torch.testing.assert_close(got, ref)


def test_feature_check_counts_the_pairs_its_mask_lets_through():
    """bench/check_bwd_feat.unmasked_pairs (its FLOPs) is the number of True entries of its own
    reference mask (visible), at windows, causal and both."""
    import itertools

    from tests.fa4 import cpu_kernels

    feat = cpu_kernels.check_bwd_feat()
    for S, causal, left, right in itertools.product((1, 9, 130), (False, True), (-1, 0, 4, 200), (-1, 0, 3)):
        want = int(feat.visible(S, S, causal, left, right).sum().item())
        assert feat.unmasked_pairs(S, causal, left, right) == want, (S, causal, left, right)


def test_lse_gradient_reaches_the_preprocess(bwd_launches):
    """launch_bwd with dlse hands it (fp32, unit inner stride) to the preprocess compiled with
    has_dlse, and without dlse the plain preprocess gets None: the launches are recorded, not run."""
    q, k, v = tensors(sq=70, sk=90)
    out, dout = torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(1, 4, 70)
    cfg = resolve_config(problem_of(q, k, v, causal=False, pass_="bwd"), None)
    dlse = torch.randn(1, 70, 4).transpose(1, 2)  # strided: made contiguous on the way
    launch_bwd(dout, q, k, v, out, lse, 0.125, False, False, cfg, dlse=dlse)
    (key,), (args,) = bwd_launches.keys("bwd_pre"), bwd_launches.args("bwd_pre")
    # (out, dout, lse, lse2, dsum, dq_acc, dlse, the varlen arguments (none dense), the sink and its
    # row terms (none without a sink), max_seqlen, the dQ sums' rows to zero: all of them, and the
    # varlen deterministic variant's key lengths and right bound, unused dense)
    assert key[-1] == "dlse" and args[6].stride(-1) == 1 and torch.equal(args[6], dlse)
    assert args[6].dtype == torch.float32 and args[7:] == (None, None, None, None, 0, padded(70), None, None, -1)
    bwd_launches.calls.clear()
    launch_bwd(dout, q, k, v, out, lse, 0.125, False, False, cfg)
    (key,), (args,) = bwd_launches.keys("bwd_pre"), bwd_launches.args("bwd_pre")
    assert key == ("bwd_pre", "bf16", 64) and args[6] is None


@pytest.mark.parametrize("sq,sk,causal,window,want", [
    (300, 300, True, (-1, -1), 0),  # every query tile sees a key: its first turn stores it
    (300, 70, False, (-1, -1), 0),
    (300, 70, True, (-1, -1), 192),  # bottom-right: rows 0..229 see no key, tiles 0-2 (64 rows) wholly
    (300, 70, False, (-1, 10), 192),  # a right bound of 10: rows 0..219 see none
    (300, 70, True, (5, -1), 192),  # a left bound hides no row's last key
    (70, 300, True, (-1, -1), 0),
])
def test_deterministic_backward_zeroes_only_the_dq_sums_no_turn_stores(bwd_launches, sq, sk, causal, window, want):
    """Deterministic, the first dQ turn of a query tile stores its tile, so the preprocess zeroes
    only the rows of the query tiles no key tile reaches (fa4.sm90.bwd_prepost.dq_zero_rows);
    non-deterministic, every row of the padded accumulator. The launches are recorded, not run."""
    q, k, v = tensors(sq=sq, sk=sk, d=128)
    out, dout, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(1, 4, sq)
    for det in (False, True):
        bwd_launches.calls.clear()
        cfg = resolve_config(problem_of(q, k, v, causal=causal, pass_="bwd", deterministic=det), None)
        assert cfg.tile_m == 64 and cfg.tile_n == 128
        launch_bwd(dout, q, k, v, out, lse, 0.125, causal, det, cfg, window_left=window[0], window_right=window[1])
        (args,) = bwd_launches.args("bwd_pre")
        assert args[12] == (want if det else padded(sq)), (det, args[12])


@pytest.mark.parametrize("det", [False, True])
def test_gqa_finish_in_the_main_kernel_launches_no_dkv_postprocess(bwd_launches, det):
    """gqa_finish 'last_cta': the fp32 sums are not zeroed and no dK/dV postprocess runs; the main
    kernel gets the outputs the call returns and one zeroed int32 a (batch, K/V head, key tile),
    the ticket counters (deterministic: the turns beside the dQ ones). The default path zeroes
    the sums (deterministic: not, its first turn stores) and converts them in two postprocess
    launches. The launches are recorded, not run."""
    import dataclasses

    # The accumulators come from torch.empty: a sentinel shows they are left as allocated.
    bwd_launches.fill_uninitialized(7)
    b, sq, sk, hq, hkv, d = 2, 70, 300, 8, 2, 64
    q, k, v = tensors(b, sq, sk, hq, hkv, d)
    out, dout, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(b, hq, sq)
    base = resolve_config(problem_of(q, k, v, causal=True, pass_="bwd", deterministic=det), None)
    assert base.gqa_reduce == "atomic" and base.gqa_finish == "postprocess"
    # The row-major sums of the per-thread adds (the bulk adds' fragment-ordered ones: below).
    base = dataclasses.replace(base, gqa_add="red")
    tiles = -(-sk // base.tile_n)
    for finish in ("postprocess", "last_cta"):
        bwd_launches.calls.clear()
        cfg = dataclasses.replace(base, gqa_finish=finish)
        dq, dk, dv = launch_bwd(dout, q, k, v, out, lse, 0.125, True, det, cfg)
        names = bwd_launches.names()
        (main,) = bwd_launches.args("main")
        dk_acc, dv_acc, sem_q, sem_kv, dk_out, dv_out = main[7:13]
        assert dk_acc.dtype == torch.float32 and dk_acc.shape == (b, hkv, padded(sk), d) and dv_acc.shape == dk_acc.shape
        assert (sem_q is not None) == det
        if finish == "last_cta":
            assert names == ["bwd_pre", "main", "bwd_post_dq"]
            assert dk_out is dk and dv_out is dv and dk.dtype == k.dtype and dk.shape == k.shape
            assert bool((dk_acc == 7).all()) and bool((dv_acc == 7).all())
            assert sem_kv.dtype == torch.int32 and sem_kv.shape[:2] == (b, hkv) and sem_kv.shape[2] >= tiles
            assert not sem_kv.any()
        else:
            assert names == ["bwd_pre", "main", "bwd_post_dq", "bwd_post", "bwd_post"]
            assert dk_out is None and dv_out is None
            # Deterministic, the first head's CTA of a group stores its tiles: the sums are left as
            # allocated; otherwise every CTA adds into zeros.
            if det:
                assert bool((dk_acc == 7).all()) and bool((dv_acc == 7).all())
            else:
                assert not dk_acc.any() and not dv_acc.any()
            assert (sem_kv is not None) == det
            post_dk, post_dv = bwd_launches.args("bwd_post")
            assert post_dk[0] is dk_acc and post_dk[1] is dk and post_dv[0] is dv_acc and post_dv[1] is dv



def test_gqa_add_bulk_converts_fragment_ordered_sums_with_the_dq_postprocess(bwd_launches):
    """gqa_add 'bulk': the main kernel adds fragment-ordered fp32 tiles, so the zeroed sums go to
    the dQ postprocess compiled for tile_n rows of dK's (2, 1, 1) x (64, d) MMA ('rows'), once for dK
    and once for dV, in place of the row-major dK/dV postprocess. The launches are recorded, not run."""
    bwd_launches.fill_uninitialized(7)
    b, sq, sk, hq, hkv, d = 2, 70, 300, 8, 2, 64
    q, k, v = tensors(b, sq, sk, hq, hkv, d)
    out, dout, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(b, hq, sq)
    cfg = resolve_config(problem_of(q, k, v, causal=True, pass_="bwd"), None)
    # The non-deterministic default under GQA 'atomic' (bwd_defaults._measured_finish).
    assert cfg.gqa_reduce == "atomic" and cfg.gqa_finish == "postprocess" and cfg.gqa_add == "bulk"
    dq, dk, dv = launch_bwd(dout, q, k, v, out, lse, 0.125, True, False, cfg)
    calls = [(name, key) for name, key, _ in bwd_launches.calls]
    assert [name for name, _ in calls] == ["bwd_pre", "main", "bwd_post_dq", "bwd_post_dq", "bwd_post_dq"]
    main = bwd_launches.args("main")[0]
    dk_acc, dv_acc = main[7:9]
    assert dk_acc.shape == (b, hkv, padded(sk), d) and dv_acc.shape == dk_acc.shape
    assert not dk_acc.any() and not dv_acc.any()
    post_dq, post_dk, post_dv = bwd_launches.args("bwd_post_dq")
    assert post_dq[1] is dq
    assert post_dk[0] is dk_acc and post_dk[1] is dk and post_dv[0] is dv_acc and post_dv[1] is dv
    assert post_dk[2] == 1.0 and post_dv[2] == 1.0  # dK was scaled in the main kernel
    # The dK/dV conversions read tile_n-row tiles in the 'rows' fragment order.
    assert calls[3][1] == calls[4][1] == ("bwd_post_dq", "bf16", d, cfg.tile_n, "rows")
    assert dk.shape == k.shape and dv.shape == v.shape

def test_window_flags():
    from fa4.sm90.bwd_launch import window_flags

    assert window_flags(False, -1, -1) == (False, False, False, 0, 0)
    assert window_flags(False, None, None) == (False, False, False, 0, 0)
    assert window_flags(False, 100, -1) == (False, True, False, 100, 0)
    assert window_flags(False, -1, 5) == (False, False, True, 0, 5)
    assert window_flags(False, 3, 1) == (False, True, True, 3, 1)
    # Causal is right = 0: a right bound beside it is causal's own kernel, and right = 0 is causal.
    assert window_flags(True, 1023, 0) == (True, True, False, 1023, 0)
    assert window_flags(False, 1023, 0) == (True, True, False, 1023, 0)
    assert window_flags(False, 0, 0) == (True, True, False, 0, 0)
    assert window_flags(True, None, 7) == (True, False, False, 0, 0)
    # Bounds that hide no key (left >= Sk, right >= Sq) are no bounds.
    assert window_flags(False, 90, 70, 70, 90) == (False, False, False, 0, 0)
    assert window_flags(False, 89, 69, 70, 90) == (False, True, True, 89, 69)
    assert window_flags(True, 2**40, 0, 70, 90) == (True, False, False, 0, 0)


def test_features_reach_the_main_kernel_and_dsink_is_reduced(bwd_launches):
    """launch_bwd with a window, softcap and a sink: the main kernel's key carries the flags, its
    runtime arguments the bounds and softcap's pre-scaled values; the preprocess gets the sink in
    fp32 and a row-term buffer (here filled by a stand-in with the kernel's rule), and dsink, -sum
    exp(sink - LSE) D over the rows, is their sum, in the sink's dtype."""
    torch.manual_seed(0)
    lse2_val, dsum_val = torch.randn(1, 4, 128), torch.randn(1, 4, 128)

    def preprocess(args):  # the preprocess's writes: LSE * log2(e), D and the sink's row terms
        args[3].copy_(lse2_val)
        args[4].copy_(dsum_val)
        if args[10] is not None:
            assert args[9].dtype == torch.float32 and args[10].shape == args[4].shape
            args[10].copy_(sink_terms(args[9], lse2_val, dsum_val, seqlen=args[0].shape[1]))

    bwd_launches.hooks["bwd_pre"] = preprocess

    def last(name):
        return bwd_launches.keys(name)[-1], bwd_launches.args(name)[-1]
    q, k, v = tensors(sq=70, sk=90)
    out, dout, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(1, 4, 70)
    cfg = resolve_config(problem_of(q, k, v, causal=False, pass_="bwd"), None)
    for dt in (torch.float32, torch.bfloat16):
        sink = torch.randn(4).to(dt)
        res = launch_bwd(dout, q, k, v, out, lse, 0.125, False, False, cfg, window_left=33, window_right=4,
                         softcap=20.0, sink=sink)
        key, args = last("main")
        assert (key.has_window_left, key.has_window_right, key.has_softcap, key.has_sink) == (True,) * 4
        assert last("bwd_pre")[0][-1] == "sink"
        # (q, k, v, dout, lse2, dsum, dq_acc, dk, dv, sem_q, sem_kv, dk/dv outputs of gqa_finish
        # 'last_cta' (none without GQA), 4 varlen tensors: none dense, scale_log2, scale, window_left,
        # window_right, softcap_inv, softcap_log2, max_seqlen_k, ...)
        assert args[11:17] == (None,) * 6 and args[23] == 0
        assert args[19:23] == (33, 4, 0.125 / 20.0, 20.0 * math.log2(math.e))
        assert len(res) == 4 and res[3].dtype == dt and res[3].shape == (4,)
        want = -(torch.exp(sink.float()[None, :, None] - lse2_val[..., :70] / math.log2(math.e))
                 * dsum_val[..., :70]).sum((0, 2))
        torch.testing.assert_close(res[3].float(), want.to(dt).float(), rtol=1e-5, atol=1e-5)
    launch_bwd(dout, q, k, v, out, lse, 0.125, True, False, cfg)
    key, args = last("main")
    assert (key.has_window_left, key.has_window_right, key.has_softcap, key.has_sink) == (False,) * 4
    assert last("bwd_pre")[1][9:11] == (None, None)
    assert args[19:23] == (0, 0, 0.0, 0.0)


def sink_terms(sink, lse2, dsum, seqlen):
    """The preprocess's row terms of the sink's gradient (fa4.sm90.bwd_prepost.BwdPreprocess):
    -2^(sink_h log2 e - LSE2) D on rows below seqlen, 0 past it and where LSE2 is +inf."""
    t = -torch.exp2(sink.float()[None, :, None] * math.log2(math.e) - lse2) * dsum
    t[..., seqlen:] = 0.0
    return t


def test_feature_check_harness_on_cpu(monkeypatch):
    """bench/check_bwd_feat.py's check_case (the GPU tests' and the device script's harness) with
    launch_bwd replaced by tests/fa4/cpu_kernels' equations: it passes the features through, the
    error rule accepts the right gradients (dsink included) and rejects a wrong one."""
    from fa4.sm90 import bwd_launch
    from tests.fa4 import cpu_kernels

    feat = cpu_kernels.check_bwd_feat()

    def fake(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, config, dlse=None, window_left=-1,
             window_right=-1, softcap=0.0, sink=None):
        return cpu_kernels.backward_math(dout, q, k, v, softmax_scale, causal, dlse, window_left, window_right,
                                         softcap, sink)

    monkeypatch.setattr(bwd_launch, "launch_bwd", fake)
    kw = dict(window_left=20, window_right=3, softcap=10.0, sink=True, dlse=True, device="cpu")
    for causal in (False, True):
        ok, info = feat.check_case(1, 45, 70, 4, 2, 64, causal=causal, **kw)
        assert ok and set(info) == {"seed", "dq", "dk", "dv", "dsink"}, info

    def wrong(*a, **k):
        g = fake(*a, **k)
        return (g[0], g[1], g[2], g[3] * 1.5)

    monkeypatch.setattr(bwd_launch, "launch_bwd", wrong)
    ok, info = feat.check_case(1, 45, 70, 4, 2, 64, causal=True, **kw)
    assert not ok and not info["dsink"]["ok"] and info["dq"]["ok"]


def test_workspace_views_are_contiguous_disjoint_and_cover_the_buffer():
    """The plan's (shape, stride, offset) views of one workspace: each is the contiguous tensor of
    its shape, they follow each other without gap or overlap, and each keeps 16-byte alignment."""
    from fa4.sm90.bwd_launch import _layout, _views

    shapes = ((1, 4, 128), (1, 4, 128), (1, 4, 128, 96))
    layout = _layout(shapes)
    buf = torch.arange(sum(math.prod(s) for s in shapes), dtype=torch.float32)
    views = _views(buf, layout)
    at = 0
    for shape, view in zip(shapes, views):
        assert view.shape == shape and view.is_contiguous()
        assert torch.equal(view.reshape(-1), buf[at:at + math.prod(shape)])
        assert (view.data_ptr() - buf.data_ptr()) % 16 == 0
        at += math.prod(shape)
    assert at == buf.numel()


@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("hkv", [8, 2])
def test_kernel_and_launch_agree_on_how_dkv_leave(bwd_launches, det, hkv):
    """The kernel (fa4.sm90.bwd) and its launch decide from one answer (bwd_config.dkv_sums) how dK
    and dV leave the main kernel; over every feasible gqa_reduce x gqa_finish x gqa_add, the launch's
    buffers and conversions are the ones the kernel built for: finished tiles in the output dtype
    ('store': MHA or 'loop'), fp32 sums finished by the last CTA ('last_cta'), fp32 sums converted by
    the dQ postprocess at tile_n 'rows' ('bulk') or by the dK/dV postprocess ('red'). Recorded, not run."""
    import dataclasses

    import cutlass

    from fa4.sm90.bwd import FlashBwdSm90
    from fa4.sm90.bwd_config import dkv_sums, violations

    b, sq, sk, hq, d = 1, 2048, 8192, 8, 64
    q, k, v = tensors(b, sq, sk, hq, hkv, d)
    out, dout, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(b, hq, sq)
    prob = problem_of(q, k, v, causal=True, pass_="bwd", deterministic=det)
    # (stat_shuffle is built with the postprocess only: off, so that 'last_cta' is reached.)
    base = dataclasses.replace(resolve_config(prob, None), stat_shuffle=False)
    seen = set()
    for reduce in ("atomic", "loop"):
        for finish in ("postprocess", "last_cta"):
            for add in ("red", "bulk"):
                cfg = dataclasses.replace(base, gqa_reduce=reduce, gqa_finish=finish, gqa_add=add)
                if violations(cfg, prob):
                    continue
                sums = dkv_sums(cfg, hq != hkv)
                seen.add(sums)
                kern = FlashBwdSm90(cutlass.BFloat16, d, True, hq != hkv, det, cfg, head_dim_v=d)
                assert (kern.gqa_atomic, kern.gqa_last, kern.gqa_bulk) == (
                    sums != "store", sums == "last_cta", sums == "bulk"), (cfg, sums)
                bwd_launches.calls.clear()
                dq, dk, dv = launch_bwd(dout, q, k, v, out, lse, 0.125, True, det, cfg)
                dk_arg, dk_out = bwd_launches.args("main")[0][7], bwd_launches.args("main")[0][11]
                posts = [key for name, key, _ in bwd_launches.calls if name in ("bwd_post", "bwd_post_dq")]
                assert dk_arg.dtype == (k.dtype if sums == "store" else torch.float32), (cfg, sums)
                assert (dk_out is dk) == (sums == "last_cta")
                want_posts = {"store": 1, "last_cta": 1, "bulk": 3, "red": 3}[sums]
                assert len(posts) == want_posts, (sums, posts)
                if sums == "bulk":
                    assert posts[1] == posts[2] == ("bwd_post_dq", "bf16", d, cfg.tile_n, "rows")
                if sums == "red":
                    assert posts[1] == posts[2] == ("bwd_post", "bf16", d)
    # MHA stores; under GQA every answer that is built here is reached.
    assert seen == ({"store"} if hq == hkv else {"store", "last_cta", "bulk", "red"}), seen
