"""The software exp2: fit reproducibility, the fp32 model's accuracy, the emulation pattern, and the
generated code (compile-only for sm_90a, no GPU). The one GPU test checks the device against the model
bit for bit."""

from __future__ import annotations

import importlib.util
import re
import sys
from fractions import Fraction
from pathlib import Path

import cutlass
import cutlass.cute as cute
import numpy as np
import pytest
from cutlass import Float32

from fa4.common import exp2_model as em
from fa4.common.exp2 import EMU_PATTERNS, EXP2_POLY, EXP2_POLY_COEFFS, emulated_indices

ROOT = Path(__file__).resolve().parents[2]


def _load_fit_script():
    spec = importlib.util.spec_from_file_location("fit_exp2_poly", ROOT / "scripts" / "fit_exp2_poly.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


fit = _load_fit_script()


def _rel_err_vs_exact(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(y.astype(np.float64) / np.exp2(x.astype(np.float64)) - 1.0)


# ------------------------------------------------------------------------------------------- fit


@pytest.fixture(scope="module")
def fits():
    return {d: fit.fit_remez(d) for d in (2, 3, 4, 5)}


def test_fit_reproduces_the_constants_in_exp2_py(fits):
    for d, f in fits.items():
        assert len(EXP2_POLY_COEFFS[d]) == d + 1
        np.testing.assert_allclose(f.coeffs, EXP2_POLY_COEFFS[d], rtol=0, atol=1e-6)
    assert EXP2_POLY == EXP2_POLY_COEFFS[3]
    # The constant block in exp2.py is the script's --emit output, verbatim.
    block = fit.emit_block([fits[d] for d in (2, 3, 4, 5)])
    assert block in (ROOT / "fa4" / "common" / "exp2.py").read_text()


def test_remez_reaches_the_minimax_optimum(fits):
    for d, f in fits.items():
        # Equioscillation: d + 1 points of (0, 1] with alternating signs and equal magnitudes.
        errs = fit.rel_err(f.coeffs, np.array(f.reference))
        assert len(errs) == d + 1
        assert np.all(np.sign(errs[1:]) == -np.sign(errs[:-1]))
        np.testing.assert_allclose(np.abs(errs), f.max_rel_err, rtol=1e-6)
        # The curve never exceeds the level anywhere on [0, 1].
        assert fit.max_rel_err(f.coeffs) <= f.max_rel_err * (1 + 1e-6)
        # A linear program on a grid bounds the optimum from below: Remez must sit on that bound.
        _, lp = fit.fit_lp(d)
        assert lp <= f.max_rel_err * (1 + 1e-9)
        assert f.max_rel_err <= lp * (1 + 2e-3), (d, f.max_rel_err, lp)
    # Each degree buys well over an order of magnitude.
    errs = [fits[d].max_rel_err for d in (2, 3, 4, 5)]
    assert all(a > 20 * b for a, b in zip(errs, errs[1:]))


def test_fit_script_prints_table_and_block(capsys):
    assert fit.main(["--emit", "--no-model"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+[2-5]\s+\d", line)]
    assert [int(r[0]) for r in rows] == [2, 3, 4, 5]
    assert abs(float(rows[1][1]) - fit.max_rel_err(EXP2_POLY_COEFFS[3])) < 1e-7
    ns: dict = {}
    exec(out[out.index("EXP2_POLY_COEFFS"):], ns)
    assert ns["EXP2_POLY_COEFFS"] == EXP2_POLY_COEFFS


# ---------------------------------------------------------------------------- fp32 op emulation


def _fraction_to_f32(v: Fraction, mode: str = "rn") -> np.float32:
    """Correct rounding of an exact rational to fp32 (denormals kept), by integer arithmetic."""
    if v == 0:
        return np.float32(0.0)
    sign = -1 if v < 0 else 1
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, -126) - 23)
    q = a / ulp
    n, rem = divmod(q.numerator, q.denominator)
    rem = Fraction(rem, q.denominator)
    if mode == "rn":
        if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
            n += 1
    elif mode == "rm":
        if sign < 0 and rem > 0:
            n += 1
    return np.float32(sign * float(n * ulp))


def _f(x) -> Fraction:
    return Fraction(float(np.float32(x)))


def test_fma_emulation_is_correctly_rounded():
    rng = np.random.default_rng(0)
    a = rng.uniform(1, 2, 3000).astype(np.float32)
    b = (rng.uniform(-4, 4, 3000) * 2.0 ** rng.integers(-30, 5, 3000)).astype(np.float32)
    c = rng.standard_normal(3000).astype(np.float32)
    # Cancellation cases: c close to -a*b.
    c[:1000] = (-(a[:1000].astype(np.float64) * b[:1000])).astype(np.float32)
    # Double-rounding traps: a*b within 2^-53 of 2^-24 makes fl64(a*b + 1) an fp32 tie.
    m1 = rng.integers(2**23, 2**24, 400_000)
    m2 = np.rint(2.0**47 / m1).astype(np.int64)
    near = np.abs(m1 * m2 - 2**47) < 2**18
    ta = (m1[near] * 2.0**-23).astype(np.float32)
    tb = (m2[near] * 2.0**-48).astype(np.float32)
    assert ta.size > 50
    a, b = np.concatenate([a, ta]), np.concatenate([b, tb])
    c = np.concatenate([c, np.ones(ta.size, np.float32)])

    got = em.fma_f32(a, b, c)
    want = np.array([_fraction_to_f32(_f(x) * _f(y) + _f(z)) for x, y, z in zip(a, b, c)], np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # The traps are real: the naive float64 route gets some of them wrong.
    naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert np.count_nonzero(naive != want) > 0


def test_add_rm_ftz_matches_exact_floor_rounding():
    rng = np.random.default_rng(1)
    x = np.concatenate([
        rng.uniform(-130, 130, 5000),
        -(10.0 ** rng.uniform(-44, 0, 2000)),  # tiny negatives (and denormals, which flush)
        np.arange(-127, 128),
    ]).astype(np.float32)
    got = em.add_rm_ftz_f32(x, em.ROUND_MAGIC)
    xf = np.where(np.abs(x) < 2.0**-126, np.float32(0), x)
    want = np.array([_fraction_to_f32(_f(v) + _f(em.ROUND_MAGIC), "rm") for v in xf], np.float32)
    assert np.array_equal(got, want)
    # r - 1.5 * 2^23 is floor(x) for every normal x in the clamped range.
    assert np.array_equal(got - em.ROUND_MAGIC, np.floor(xf))


# -------------------------------------------------------------------------------- model accuracy


def test_model_matches_exact_exp2_degree3():
    x = np.concatenate([
        np.linspace(-126.0, 8.0, 4_000_001, dtype=np.float32),
        np.random.default_rng(2).uniform(-126.0, 127.9, 1_000_000).astype(np.float32),
        # Around every integer, where f wraps from ~1 to 0.
        (np.arange(-125, 9)[:, None] + np.array([-2e-7, -6e-8, 0, 6e-8, 2e-7])).ravel().astype(np.float32),
    ])
    y = em.exp2_poly_model(x)
    err = _rel_err_vs_exact(x, y)
    worst = float(err.max())
    print(f"\nexp2_poly degree 3: max relative error {worst:.3e} over {x.size} points in [-126, 128)")
    assert worst <= 1e-4
    # fp32 evaluation adds only a few ulps (2^-24 each) to the minimax level of the coefficients.
    assert worst <= fit.max_rel_err(EXP2_POLY) + 4 * 2.0**-24


@pytest.mark.parametrize("degree", [2, 3, 4, 5])
def test_model_error_per_degree(degree):
    x = np.linspace(-126.0, 8.0, 1_000_001, dtype=np.float32)
    worst = float(_rel_err_vs_exact(x, em.exp2_poly_model(x, EXP2_POLY_COEFFS[degree])).max())
    level = fit.max_rel_err(EXP2_POLY_COEFFS[degree])
    print(f"\ndegree {degree}: fp32 model max rel err {worst:.3e} (polynomial alone {level:.3e})")
    assert level * 0.9 <= worst <= level + 4 * 2.0**-24


def test_model_edge_cases():
    bits = lambda v: np.asarray(v, np.float32).view(np.uint32)  # noqa: E731
    # Masked scores: -inf (and NaN, which the clamp also absorbs) give exactly +0.0.
    out = em.exp2_poly_model(np.array([-np.inf, np.nan, -127.0, -1e30], np.float32))
    assert np.all(bits(out) == 0)
    # Integers are exact: f = 0 and p0 = 1.
    n = np.arange(-126, 128)
    np.testing.assert_array_equal(em.exp2_poly_model(n.astype(np.float32)), np.exp2(n).astype(np.float32))
    assert bits(em.exp2_poly_model(np.float32(-0.0))) == bits(np.float32(1.0))
    # (-127, -126): results below the normal range, never above 2^-126 or negative.
    x = np.linspace(-126.999, -126.001, 1001, dtype=np.float32)
    y = em.exp2_poly_model(x).astype(np.float64)
    assert np.all((y >= 0) & (y < 2.0**-126))
    assert np.all(np.abs(y - np.exp2(x.astype(np.float64))) < 2.0**-126)
    # Just below 0 (kernel's common case after subtracting the max): f rounds to 1.0, p carries into
    # the exponent and the result is still within the bound.
    for v in (-1e-10, -3e-8, -6e-8, -1e-6):
        y = em.exp2_poly_model(np.float32(v))
        assert abs(float(y) / 2.0**v - 1) <= 1e-4
    # Positive x up to a rescale threshold tau (the kernel may feed max offset + tau > 0).
    x = np.linspace(0, 16, 100_001, dtype=np.float32)
    assert _rel_err_vs_exact(x, em.exp2_poly_model(x)).max() <= 1e-4
    # Largest valid input: 2^127 range stays finite.
    assert np.isfinite(em.exp2_poly_model(np.float32(127.99)))


def test_model_is_monotone_enough_for_softmax():
    # Softmax only needs exp2 non-decreasing up to the approximation error: a larger score never
    # gets a weight smaller by more than 2 * 8.6e-5 relative.
    x = np.linspace(-20, 8, 2_000_001, dtype=np.float32)
    y = em.exp2_poly_model(x).astype(np.float64)
    drops = (y[:-1] - y[1:]) / y[1:]
    assert drops.max() <= 2 * 8.6e-5


# ----------------------------------------------------------------------------- emulation pattern


@pytest.mark.parametrize("pattern", EMU_PATTERNS)
def test_emulated_indices_fractions(pattern):
    for k in range(9):
        frac = k / 8
        for n in (8, 32, 64, 128):
            idx = emulated_indices(n, frac, pattern)
            assert len(idx) == n * k // 8
            assert list(idx) == sorted(set(idx)) and all(0 <= i < n for i in idx)
            # Same positions in every group of 8.
            per_group = {tuple(i % 8 for i in idx if i // 8 == g) for g in range(n // 8)}
            assert len(per_group) == 1
    # Rounding to the 1/8 grid.
    assert len(emulated_indices(64, 0.3, pattern)) == 16
    assert len(emulated_indices(64, 0.01, pattern)) == 0
    assert emulated_indices(16, 1.0, pattern) == tuple(range(16))


def test_emulated_indices_patterns():
    assert emulated_indices(16, 3 / 8, "block") == (0, 1, 2, 8, 9, 10)
    assert emulated_indices(16, 2 / 8, "spread") == (3, 7, 11, 15)
    # "spread" never puts two emulated elements next to each other below one half.
    for k in range(1, 5):
        idx = emulated_indices(64, k / 8, "spread")
        assert min(np.diff(idx)) >= 2
    # Partial trailing group: same rule on its positions.
    assert emulated_indices(12, 0.25, "block") == (0, 1, 8, 9)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            emulated_indices(8, bad)
    with pytest.raises(ValueError):
        emulated_indices(8, 0.5, "random")


def test_fragment_model_uses_the_pattern():
    x = np.linspace(-20, 2, 64, dtype=np.float32)
    y = em.exp2_fragment_model(x, 3 / 8, "spread")
    emu = set(emulated_indices(64, 3 / 8, "spread"))
    poly, mufu = em.exp2_poly_model(x), em.exp2_mufu_model(x)
    for i in range(64):
        assert y[i] == (poly[i] if i in emu else mufu[i])
    assert sum(poly[i] != mufu[i] for i in emu) > 0  # the two paths are distinguishable here


# ---------------------------------------------------------------------------------- compile-only

N_FRAG = 32


def _fragment_kernel(n: int, frac: float, pattern: str = "block", affine: bool = False):
    from fa4.common.exp2 import exp2_fragment

    @cute.kernel
    def kernel(src: cute.Tensor, dst: cute.Tensor, scale: Float32, offset: Float32):
        tid, _, _ = cute.arch.thread_idx()
        frag = cute.make_rmem_tensor((n,), Float32)
        for i in cutlass.range_constexpr(n):
            frag[i] = src[tid * n + i]
        if cutlass.const_expr(affine):
            exp2_fragment(frag, frac, pattern=pattern, scale=scale, offset=offset)
        else:
            exp2_fragment(frag, frac, pattern=pattern)
        for i in cutlass.range_constexpr(n):
            dst[tid * n + i] = frag[i]

    @cute.jit
    def host(src: cute.Tensor, dst: cute.Tensor, scale: Float32, offset: Float32):
        kernel(src, dst, scale, offset).launch(grid=(1, 1, 1), block=(128, 1, 1))

    return host


def _inspect(frac, pattern="block", affine=False):
    from cutlass.cute.runtime import make_fake_compact_tensor

    from fa4.common.codegen_check import compile_and_inspect

    a = make_fake_compact_tensor(Float32, (128 * N_FRAG,))
    b = make_fake_compact_tensor(Float32, (128 * N_FRAG,))
    return compile_and_inspect(
        _fragment_kernel(N_FRAG, frac, pattern, affine), a, b, Float32(1.0), Float32(0.0),
        ptx_ops=["ex2.approx", "add.rm.ftz.f32", "sub.rn.f32", "fma.rn.f32", "max.f32"],
        sass_ops=["MUFU.EX2", "FFMA", "FADD", "FMNMX", "LEA", "LDL", "STL"],
    )


_SEQ_PTX = ["add.rm.ftz.f32", "sub.rn.f32", "sub.rn.f32", "fma.rn.f32", "fma.rn.f32", "fma.rn.f32",
            "shl.b32", "add.s32"]


def _asm_block_opcodes(ptx: str) -> list[str]:
    """Opcodes inside `// begin inline asm` ... `// end inline asm`, in order, without ex2."""
    from fa4.common.codegen_check import ptx_opcodes

    out = []
    for body in re.findall(r"// begin inline asm\n(.*?)// end inline asm", ptx, flags=re.S):
        out += [op for op in ptx_opcodes(body) if not op.startswith("ex2")]
    return out


@pytest.fixture(scope="module")
def reports():
    return {k: _inspect(k / 8) for k in range(9)}


def test_compiled_mufu_count_matches_fraction(reports):
    for k, rep in reports.items():
        n_emu = len(emulated_indices(N_FRAG, k / 8))
        n_mufu = N_FRAG - n_emu
        assert rep.ptx_counts["ex2.approx"] == n_mufu
        assert rep.sass_counts["MUFU.EX2"] == n_mufu
        # Emulated path: the exact instruction sequence the numpy model reproduces.
        assert rep.ptx_counts["add.rm.ftz.f32"] == n_emu
        assert rep.ptx_counts["sub.rn.f32"] == 2 * n_emu
        assert rep.ptx_counts["fma.rn.f32"] == 3 * n_emu
        assert rep.ptx_counts["max.f32"] == n_emu
        assert _asm_block_opcodes(rep.ptx) == _SEQ_PTX * n_emu
        assert rep.sass_counts["FFMA"] == 3 * n_emu
        assert rep.sass_counts["FADD"] == 3 * n_emu
        assert rep.sass_counts["FMNMX"] == n_emu
        assert rep.sass_counts["LEA"] == n_emu  # shl + add.s32 fuse into one integer-pipe LEA
        assert rep.sass_opcodes["FADD.FTZ.RM"] == n_emu
        assert rep.local_memory_instructions == 0 and not rep.spills
        assert rep.registers is not None and rep.registers <= 128


def test_sass_cost_per_emulated_exp2(reports):
    def useful(rep):
        return sum(n for op, n in rep.sass_opcodes.items() if op != "NOP")

    # Replacing all N MUFU.EX2 by the polynomial: 7 extra instructions per element, plus at most a
    # couple shared by all elements (materialising the c3 constant in a register).
    extra = useful(reports[8]) - useful(reports[0])
    per, shared = divmod(extra, N_FRAG)
    print(f"\nSASS instructions per emulated exp2: {per + 1} (vs 1 MUFU.EX2), +{shared} shared setup")
    assert per + 1 == 8 and shared <= 2
    c = reports[8].sass_counts
    assert (c["FMNMX"] + c["FADD"] + c["FFMA"] + c["LEA"]) == 8 * N_FRAG


def test_compiled_constants_are_the_fitted_ones(reports):
    rep = reports[8]
    # The coefficients reach the SASS as FFMA immediates (c3 through a register), bit-exact.
    want = {int(np.float32(c).view(np.uint32)) for c in EXP2_POLY[1:]}
    ptx_consts = {int(v) for v in re.findall(r"mov\.b32\s+%r\d+, (\d+);", rep.ptx)}
    assert want <= ptx_consts
    ffma_imm = {float(v) for v in re.findall(r"FFMA [^;]*, (-?\d+\.\d+(?:e-?\d+)?) ;", rep.sass)}
    assert {float(np.float32(c)) for c in EXP2_POLY[1:3]} <= ffma_imm


def test_compiled_spread_pattern_and_affine_prologue():
    rep = _inspect(3 / 8, "spread", affine=True)
    n_emu = len(emulated_indices(N_FRAG, 3 / 8, "spread"))
    assert rep.sass_counts["MUFU.EX2"] == N_FRAG - n_emu
    # One extra FFMA per element for x * scale + offset.
    assert rep.ptx_counts["fma.rn.f32"] == 3 * n_emu + N_FRAG
    assert rep.sass_counts["FFMA"] == 3 * n_emu + N_FRAG
    assert not rep.spills


def test_codegen_check_parsers_and_resources(reports):
    from fa4.common.codegen_check import count_ops, ptx_opcodes, ptxas_verbose, sass_opcodes

    ptx = "\t@%p1 bra LBB0_1;\n\tex2.approx.ftz.f32 %r1, %r2; // x\n.reg .b32 r;\n{\n\tfma.rn.f32 %r3, %r1, %r1, %r1;\n}"
    assert ptx_opcodes(ptx) == ["bra", "ex2.approx.ftz.f32", "fma.rn.f32"]
    sass = "        /*0010*/  @!P0 MUFU.EX2 R1, R2 ;\n        /*0020*/  FFMA2 R1, R2, R3, R4 ;\n"
    assert sass_opcodes(sass) == ["MUFU.EX2", "FFMA2"]
    assert count_ops(sass_opcodes(sass), ["FFMA", "MUFU"]) == {"FFMA": 0, "MUFU": 1}
    # Registers read from the DSL's cubin agree with an independent ptxas -v on the same PTX.
    rep = reports[3]
    per, log = ptxas_verbose(rep.ptx)
    assert "Used" in log and len(per) == 1 and len(rep.kernels) == 1
    (name, kr), = rep.kernels.items()
    assert per[name].spill_store_bytes == 0 and kr.frame_bytes == 0
    assert abs(per[name].registers - kr.registers) <= 8


# ---------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_device_matches_model_bitwise():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from cutlass.cute.runtime import from_dlpack

    rng = np.random.default_rng(3)
    x = np.concatenate([
        rng.uniform(-30, 8, 128 * N_FRAG - 256),
        np.linspace(-127.5, 127.5, 192),
        [-np.inf] * 32 + [np.nan] * 8 + [0.0, -0.0, -1e-10, -3e-8] * 6,
    ]).astype(np.float32)
    x = x.reshape(128, N_FRAG)
    for pattern in EMU_PATTERNS:
        frac = 3 / 8
        src = torch.from_numpy(x.ravel()).cuda()
        dst = torch.full_like(src, float("nan"))
        host = _fragment_kernel(N_FRAG, frac, pattern)
        args = (from_dlpack(src), from_dlpack(dst), Float32(1.0), Float32(0.0))
        cute.compile(host, *args)(*args)
        torch.cuda.synchronize()
        y = dst.cpu().numpy().reshape(128, N_FRAG)
        emu = list(emulated_indices(N_FRAG, frac, pattern))
        mufu = [i for i in range(N_FRAG) if i not in emu]
        want = em.exp2_poly_model(x[:, emu])
        assert np.array_equal(y[:, emu].view(np.uint32), want.view(np.uint32))
        ym, xm = y[:, mufu].astype(np.float64), x[:, mufu].astype(np.float64)
        ref = em.exp2_mufu_model(x[:, mufu]).astype(np.float64)
        ok = np.isfinite(xm) & (ref > 0) & (ref < 3e38)
        assert np.all(np.abs(ym[ok] / ref[ok] - 1) <= 2 * 2.0**-22)
        assert np.all(ym[np.isneginf(xm)] == 0)
