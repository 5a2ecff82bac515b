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


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1)])
@pytest.mark.parametrize("change", [{}, {"tau": 8.0}, {"exp2_emu_frac": 0.375}, {"pingpong": "mma_exp"},
                                    {"p_operand": "smem"}, {"persistent": True}])
def test_forward_matches_reference(check_fwd, hd, causal, shape, change):
    import torch

    from fa4.problem import Problem
    from fa4.sm90.fwd_config import default_config

    cfg = dataclasses.replace(default_config(Problem.standard(1024, hd, causal=causal)), **change)
    ok, info = check_fwd.check_case(*shape, hd, causal, torch.bfloat16, cfg, 4.0 if change.get("tau") else 1.0)
    assert ok, info
