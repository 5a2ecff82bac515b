#!/usr/bin/env python3
"""Minimax (relative error) polynomials for 2^f on [0, 1] with the constant term pinned to 1.

The software exp2 in fa4/common/exp2.py evaluates p(f) = 1 + c1 f + ... + cn f^n for the fractional
part f of x. Pinning p0 = 1 makes 2^0 exact, so integer x (and the -inf -> 0 path, which goes through
f = 0) stay exact. The remaining n coefficients minimise max |p(f) / 2^f - 1| over the closed interval:
f can round up to exactly 1.0 in fp32 (x a hair below an integer), so the right end point counts.

Method: Remez exchange. With n free coefficients the optimum equioscillates at n + 1 points of (0, 1]
(f = 0 is not one of them: the error is pinned to 0 there). Each step solves the linear system
p(x_i) - 2^x_i = (-1)^i E 2^x_i for (c, E), then moves the reference to the local extrema of the new
error curve. `fit_lp` solves the same problem as a linear program on a grid; it bounds the optimum from
below, which the tests use to check that the exchange really converged to the minimax solution.

Usage:
    python3 scripts/fit_exp2_poly.py            # table of coefficients and errors, degrees 2..5
    python3 scripts/fit_exp2_poly.py --emit     # also the constant block pasted into fa4/common/exp2.py
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LN2 = float(np.log(2.0))


@dataclass(frozen=True)
class Fit:
    degree: int
    coeffs: tuple[float, ...]  # (1.0, c1, ..., cn), float64
    max_rel_err: float  # of the float64 coefficients, exact arithmetic (float64)
    reference: tuple[float, ...]  # final equioscillation points
    iterations: int

    @property
    def coeffs_f32(self) -> tuple[float, ...]:
        return tuple(float(np.float32(c)) for c in self.coeffs)


def poly_eval(coeffs, x):
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    for c in reversed(coeffs):
        out = out * x + c
    return out


def rel_err(coeffs, x):
    x = np.asarray(x, dtype=np.float64)
    return poly_eval(coeffs, x) / np.exp2(x) - 1.0


def max_rel_err(coeffs, n_grid: int = 200_001) -> float:
    """Max |relative error| over [0, 1], grid plus local refinement (the curve is smooth)."""
    pts = _local_extrema(coeffs, n_grid)
    return float(np.max(np.abs(rel_err(coeffs, pts))))


def _refine(coeffs, lo: float, hi: float, sign: float) -> float:
    # Golden-section on a bracket known to contain one extremum of sign*err; the error curve is a
    # smooth polynomial/exponential ratio, so 80 steps reach float64 resolution of the abscissa.
    g = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = sign * rel_err(coeffs, c), sign * rel_err(coeffs, d)
    for _ in range(80):
        if fc > fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = sign * rel_err(coeffs, c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = sign * rel_err(coeffs, d)
    return float((a + b) / 2.0)


def _local_extrema(coeffs, n_grid: int) -> np.ndarray:
    """Abscissae of the local extrema of the error on (0, 1], the end point 1 included."""
    x = np.linspace(0.0, 1.0, n_grid)
    e = rel_err(coeffs, x)
    out = []
    for i in range(1, n_grid - 1):
        if (e[i] - e[i - 1]) * (e[i + 1] - e[i]) <= 0 and e[i] != 0.0:
            out.append(_refine(coeffs, x[i - 1], x[i + 1], np.sign(e[i])))
    out.append(1.0)
    return np.array(sorted(set(out)))


def _solve_reference(ref: np.ndarray, degree: int):
    n = degree
    a = np.zeros((n + 1, n + 1))
    b = np.exp2(ref) - 1.0
    for i, xi in enumerate(ref):
        a[i, :n] = [xi**k for k in range(1, n + 1)]
        a[i, n] = -((-1.0) ** i) * np.exp2(xi)
    sol = np.linalg.solve(a, b)
    return (1.0, *sol[:n]), float(sol[n])


def fit_remez(degree: int, *, max_iter: int = 50, tol: float = 1e-7, n_grid: int = 20_001) -> Fit:
    if degree < 1:
        raise ValueError("degree must be >= 1 (p0 is fixed to 1)")
    n = degree
    # Chebyshev-like start on (0, 1], ending at 1 where the optimum always has an extremum.
    ref = (1.0 - np.cos(np.pi * np.arange(1, n + 2) / (n + 1))) / 2.0
    coeffs: tuple[float, ...] = ()
    for it in range(1, max_iter + 1):
        coeffs, level = _solve_reference(ref, n)
        ext = _local_extrema(coeffs, n_grid)
        errs = rel_err(coeffs, ext)
        # Keep one point per run of equal sign (the largest), then the n + 1 largest adjacent ones.
        pts, vals = [], []
        for x, e in zip(ext, errs):
            if pts and np.sign(e) == np.sign(vals[-1]):
                if abs(e) > abs(vals[-1]):
                    pts[-1], vals[-1] = x, e
            else:
                pts.append(x)
                vals.append(e)
        while len(pts) > n + 1:
            # Drop the smaller end: the alternation survives either way.
            if abs(vals[0]) < abs(vals[-1]):
                pts.pop(0), vals.pop(0)
            else:
                pts.pop(), vals.pop()
        if len(pts) < n + 1:
            raise RuntimeError(f"degree {n}: lost the alternation ({len(pts)} extrema)")
        new_ref = np.array(pts)
        mags = np.abs(vals)
        if mags.max() - mags.min() <= tol * mags.max():
            return Fit(n, coeffs, float(mags.max()), tuple(float(v) for v in new_ref), it)
        ref = new_ref
    raise RuntimeError(f"degree {n}: Remez did not converge in {max_iter} iterations")


def fit_lp(degree: int, n_grid: int = 4001):
    """Discrete minimax by linear programming: min t s.t. |p(x_j)/2^x_j - 1| <= t on a grid.

    The grid optimum is a lower bound on the continuous minimax error; returns (coeffs, t).
    """
    from scipy.optimize import linprog

    n = degree
    x = np.linspace(0.0, 1.0, n_grid)
    w = np.exp2(-x)
    basis = np.stack([x**k * w for k in range(1, n + 1)], axis=1)  # (c_k f^k) / 2^f
    resid = w - 1.0  # p/2^f - 1 = basis @ c + (2^-f - 1)
    ones = np.ones((n_grid, 1))
    a_ub = np.vstack([np.hstack([basis, -ones]), np.hstack([-basis, -ones])])
    b_ub = np.concatenate([-resid, resid])
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(None, None)] * (n + 1), method="highs",
        # The default 1e-7 feasibility tolerance is as large as the degree-5 error itself.
        options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
    )
    if not res.success:
        raise RuntimeError(f"linprog failed: {res.message}")
    return (1.0, *res.x[:n]), float(res.x[-1])


def _model_err(coeffs_f32) -> float | None:
    """Max relative error of the fp32 instruction-sequence model on a dense grid of x (None if the
    package is not importable, e.g. the script copied elsewhere)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    try:
        from fa4.common.exp2_model import exp2_poly_model
    except ImportError:
        return None
    x = np.linspace(-126.0, 8.0, 2_000_001, dtype=np.float32)
    y = exp2_poly_model(x, coeffs_f32).astype(np.float64)
    return float(np.max(np.abs(y / np.exp2(x.astype(np.float64)) - 1.0)))


def emit_block(fits: list[Fit]) -> str:
    lines = [
        "# Generated by scripts/fit_exp2_poly.py --emit (Remez minimax of the relative error of 2^f on",
        "# [0, 1] with p0 = 1, coefficients rounded to fp32). Do not edit by hand: rerun the script.",
        "EXP2_POLY_COEFFS: dict[int, tuple[float, ...]] = {",
    ]
    for f in fits:
        body = ", ".join(repr(c) for c in f.coeffs_f32)
        lines.append(f"    {f.degree}: ({body}),  # max rel err {f.max_rel_err:.3e}")
    lines.append("}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--degrees", type=int, nargs="+", default=[2, 3, 4, 5])
    ap.add_argument("--emit", action="store_true", help="print the Python constant block")
    ap.add_argument("--no-model", action="store_true", help="skip the fp32 model error column")
    args = ap.parse_args(argv)

    fits = [fit_remez(d) for d in args.degrees]
    hdr = f"{'deg':>3}  {'minimax rel err':>15}  {'fp32 coeffs':>11}  {'fp32 model':>10}  coefficients (p0 = 1)"
    print(hdr)
    for f in fits:
        err32 = max_rel_err(f.coeffs_f32)
        model = None if args.no_model else _model_err(f.coeffs_f32)
        model_s = f"{model:10.3e}" if model is not None else f"{'-':>10}"
        cs = ", ".join(f"{c:.9g}" for c in f.coeffs[1:])
        print(f"{f.degree:>3}  {f.max_rel_err:15.3e}  {err32:11.3e}  {model_s}  {cs}")
    print("minimax: float64 coefficients, exact arithmetic; fp32 coeffs: rounded to float32;")
    print("fp32 model: the device instruction sequence in fp32 over x in [-126, 8] (fa4/common/exp2_model.py)")
    if args.emit:
        print()
        print(emit_block(fits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
