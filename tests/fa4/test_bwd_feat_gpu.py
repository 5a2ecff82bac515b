"""Our Hopper backward with issue 18's features on the GPU, against PyTorch autograd in fp32
(bench/check_bwd_feat.py: FlashAttention's error rule; the forward's out and lse from the fp32
reference, so these check the backward alone).

Cases: the LSE's gradient; sliding windows (left only, right only, both, narrower than a tile,
with causal), softcap, learnable sinks, all combined, GQA, fp16, Sq != Sk, rows that see no key,
deterministic mode bitwise over 10 runs.
"""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

_spec = importlib.util.spec_from_file_location(
    "check_bwd_feat", Path(__file__).resolve().parents[2] / "bench" / "check_bwd_feat.py")


@pytest.fixture(scope="module")
def feat():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4), (1, 333, 777, 4, 2), (1, 777, 333, 4, 1)])
def test_lse_gradient(feat, hd, causal, shape):
    """A loss using both out and lse: dS = P (dP - D + dLSE)."""
    ok, info = feat.check_case(*shape, hd, causal=causal, dlse=True)
    assert ok, info
