"""Compile-only checks of the forward kernels with issue 18's features (no GPU: sm_90a, fake tensors).

Each feature alone and combined (causal x window left/right x softcap x sink), at hd64 and hd128
(every variant) and the wider head dims (all features at once), with the default config of the
problem: WGMMA present, no spills, no serialized WGMMAs, and the MUFU work the features ask for
(MUFU.TANH per softcapped score not on the FMA pipe, one MUFU.EX2 per row for the sink).
"""

from __future__ import annotations

import dataclasses

import pytest

from fa4.common.exp2 import emulated_indices
from fa4.problem import Problem
from fa4.sm90.compile import compile_fwd, compile_key, ensure_target
from fa4.sm90.fwd_config import default_config, violations
from tests.fa4.codegen_asserts import assert_clean_fwd, compile_and_read

WL = dict(window_left=255)
WR = dict(window_right=37)
CAP = dict(softcap=30.0)
SINK = dict(sink=True)
ALONE = {"wl": WL, "wr": WR, "wlwr": WL | WR, "softcap": CAP, "sink": SINK}
COMBINED = {"all": WL | WR | CAP | SINK, "causal-wl-cap-sink": WL | CAP | SINK}


def cases():
    out = []
    for hd in (64, 128):
        for name, feat in ALONE.items():
            for causal in ((False, True) if "wr" not in name else (False,)):
                out.append(pytest.param(hd, hd, causal, feat, {}, id=f"hd{hd}-{'causal' if causal else 'full'}-{name}"))
        out.append(pytest.param(hd, hd, False, COMBINED["all"], {}, id=f"hd{hd}-full-all"))
        out.append(pytest.param(hd, hd, True, COMBINED["causal-wl-cap-sink"], {}, id=f"hd{hd}-causal-wl-cap-sink"))
    for frac in (0.25, 0.5):
        out.append(pytest.param(128, 128, True, CAP, {"tanh_fma_frac": frac}, id=f"hd128-causal-softcap-fma{frac}"))
    out.append(pytest.param(128, 128, True, COMBINED["causal-wl-cap-sink"], {"tanh_fma_frac": 0.375},
                            id="hd128-causal-wl-cap-sink-fma0.375"))
    out.append(pytest.param(64, 64, True, CAP, {"tanh_fma_frac": 0.125}, id="hd64-causal-softcap-fma0.125"))
    for hd, hdv in ((96, 96), (192, 192), (192, 128), (256, 256)):
        out.append(pytest.param(hd, hdv, True, COMBINED["causal-wl-cap-sink"], {},
                                id=f"hd{hd}v{hdv}-causal-wl-cap-sink"))
    return out


@pytest.mark.parametrize("hd,hdv,causal,feat,change", cases())
def test_feature_kernel_codegen(hd, hdv, causal, feat, change):
    ensure_target()
    problem = Problem.standard(4096, hd, head_dim_v=hdv, causal=causal, **feat)
    config = dataclasses.replace(default_config(problem), **change)
    assert not violations(config, problem), violations(config, problem)
    flags = problem.kernel_flags()
    key = compile_key("bf16", hd, causal, True, config, hdv, **flags)
    ptx, cubin, ops = compile_and_read(compile_fwd, key, ["MUFU.EX2", "MUFU.TANH", "WARPGROUP.ARRIVE"])
    assert_clean_fwd(ptx, cubin, ops, config)
    # Softmax code paths: the first tile, the masked and the unmasked loop, and with a left
    # window the masked loop at its far edge; each handles a thread's 2 rows x tile_n/4 scores.
    paths = 4 if flags["has_window_left"] else 3
    per_row = config.tile_n // 4
    on_fma = emulated_indices(per_row, config.tanh_fma_frac, "spread") if flags["has_softcap"] else ()
    want_tanh = paths * 2 * (per_row - len(on_fma)) if flags["has_softcap"] else 0
    assert ops["MUFU.TANH"] == want_tanh, (ops, want_tanh)
    mufu_exp = paths * 2 * (per_row - len(emulated_indices(per_row, config.exp2_emu_frac, config.exp2_emu_pattern)))
    extra = ops["MUFU.EX2"] - mufu_exp - (2 if flags["has_sink"] else 0)  # the sink: one ex2 per row
    assert 0 <= extra <= 2 * 2 * paths, (ops, mufu_exp)


def test_tanh_knob_is_infeasible_without_softcap_and_normalised_out_of_the_key():
    plain = Problem.standard(4096, 128, causal=True)
    cfg = dataclasses.replace(default_config(plain), tanh_fma_frac=0.25)
    assert any("softcap problems only" in v for v in violations(cfg, plain))
    assert compile_key("bf16", 128, True, True, cfg) == compile_key("bf16", 128, True, True, default_config(plain))
    assert compile_key("bf16", 128, True, True, cfg, has_softcap=True) != compile_key(
        "bf16", 128, True, True, default_config(plain), has_softcap=True)
    hd64 = Problem.standard(4096, 64, causal=True, softcap=30.0)
    wide = dataclasses.replace(default_config(hd64), tanh_fma_frac=0.25)
    assert any("3 consumer warpgroups spills" in v for v in violations(wide, hd64))
