"""Fixtures shared by the GPU tests of tests/fa4."""

import importlib.util
from pathlib import Path

import pytest

_CHECK_BWD_FEAT = Path(__file__).resolve().parents[2] / "bench" / "check_bwd_feat.py"


@pytest.fixture(scope="module")
def feat():
    """bench/check_bwd_feat.py as a module (the backward features' fp32 references and error rule)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    spec = importlib.util.spec_from_file_location("check_bwd_feat", _CHECK_BWD_FEAT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
