"""Our Hopper backward on the GPU against PyTorch autograd in fp32 (FlashAttention error rule).

Cases: odd seqlens, Sq != Sk causal (bottom-right, incl. query rows that see no key), GQA,
each compile-time knob changed alone, and deterministic mode bitwise identical over 10 runs.
The same checks run as a script on the device: python bench/check_bwd.py.
"""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

_spec = importlib.util.spec_from_file_location("check_bwd", Path(__file__).resolve().parents[2] / "bench" / "check_bwd.py")


@pytest.fixture(scope="module")
def check_bwd():
    mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(mod)
    return mod


def _config(hd, causal, det, change):
    from fa4.problem import Problem
    from fa4.sm90.bwd_config import default_config

    base = default_config(Problem.standard(1024, hd, causal=causal, deterministic=det, pass_="bwd"))
    return dataclasses.replace(base, **change)


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1), (3, 65, 1, 2, 1)])
def test_grads_match_reference(check_bwd, hd, causal, det, shape):
    import torch

    ok, info = check_bwd.check_case(*shape, hd, causal, torch.bfloat16, _config(hd, causal, det, {}))
    assert ok, info


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("change", [dict(stages=1), dict(dq_accum="red_v2"), dict(dq_accum="red"),
                                    dict(spt_order=False), dict(head_swizzle=4), dict(dv_operand="smem"),
                                    dict(tile_m=128, dv_operand="smem")])
def test_each_knob_alone(check_bwd, hd, causal, change):
    import torch

    from fa4.problem import Problem
    from fa4.sm90.bwd_config import violations

    cfg = _config(hd, causal, False, change)
    if violations(cfg, Problem.standard(1024, hd, causal=causal, pass_="bwd")):
        pytest.skip(f"{change} infeasible at hd{hd}")
    ok, info = check_bwd.check_case(1, 1000, 1000, 8, 2, hd, causal, torch.bfloat16, cfg)
    assert ok, info


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dq_accum", ["bulk", "red_v2"])
@pytest.mark.parametrize("spt", [True, False])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 777, 1333, 8, 2)])
def test_deterministic_bitwise(check_bwd, hd, causal, dq_accum, spt, shape):
    import torch

    ok, info = check_bwd.check_deterministic(*shape, hd, causal, torch.bfloat16,
                                             _config(hd, causal, True, dict(dq_accum=dq_accum, spt_order=spt)))
    assert ok, info
