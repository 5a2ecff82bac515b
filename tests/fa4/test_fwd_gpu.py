"""Our forward kernel on the GPU against an fp32 reference (the FlashAttention error rule).

Cases: odd seqlens, Sq != Sk causal (bottom-right, incl. rows that see no key), GQA,
large-magnitude scores whose row max jumps across KV tiles (tau), fp16, and each knob
changed alone. The output is poisoned with NaN before each run; NaN never passes.
The same checks run as a script on the device: python bench/check_fwd.py.
"""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

_spec = importlib.util.spec_from_file_location("check_fwd", Path(__file__).resolve().parents[2] / "bench" / "check_fwd.py")


@pytest.fixture(scope="module")
def check_fwd():
    mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(mod)
    return mod


# Each knob moved off the default of its head_dim (hd64: 192-row tiles, exp ping-pong; hd128:
# 128-row tiles, GEMM ping-pong), alone; every change feasible and different from the default.
_BOTH = ({"tau": 0.0}, {"tau": 4.0}, {"exp2_emu_frac": 0.375}, {"exp2_emu_frac": 0.25, "exp2_emu_pattern": "spread"},
         {"pingpong": "off"}, {"p_operand": "smem"}, {"persistent": True}, {"kv_stages": 3},
         {"sched_order": "natural"}, {"head_swizzle": 4})
FWD_CHANGES = [(64, {})] + [(64, c) for c in _BOTH + (
    {"pingpong": "mma"}, {"tile_n": 96}, {"tile_m": 128}, {"intra_wg_overlap": False, "pingpong": "mma"})] + [
    (128, {})] + [(128, c) for c in _BOTH + ({"pingpong": "mma_exp"}, {"tile_n": 144}, {"intra_wg_overlap": False})]


def _fwd_problem(shape, hd, causal):
    from fa4.problem import Problem

    b, sq, sk, hq, hkv = shape
    return Problem(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_kv=hkv, head_dim=hd, head_dim_v=hd,
                   causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1)])
@pytest.mark.parametrize("hd,change", FWD_CHANGES)
def test_forward_matches_reference(check_fwd, hd, causal, shape, change):
    import torch

    from fa4.sm90.fwd_config import default_config, violations

    problem = _fwd_problem(shape, hd, causal)
    cfg = dataclasses.replace(default_config(problem), **change)
    assert not violations(cfg, problem)
    assert (cfg == default_config(problem)) == (change == {}), f"{change} is the default at hd{hd}"
    # Lower tau only matters where row maxima jump: scores 16x larger (inputs x4).
    ok, info = check_fwd.check_case(*shape, hd, causal, torch.bfloat16, cfg, 4.0 if "tau" in change else 1.0)
    assert ok, info


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_fp16_matches_reference(check_fwd, hd, causal):
    import torch

    from fa4.sm90.fwd_config import default_config

    shape = (2, 1000, 1000, 4, 2)
    problem = dataclasses.replace(_fwd_problem(shape, hd, causal), dtype="fp16")
    ok, info = check_fwd.check_case(*shape, hd, causal, torch.float16, default_config(problem))
    assert ok, info
