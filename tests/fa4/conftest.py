"""Fixtures shared by the GPU tests of tests/fa4: the fp32 references of bench/ as modules, loaded
once per process by tests.fa4.cpu_kernels."""

import pytest

from tests.fa4 import cpu_kernels


def _needs_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture(scope="module")
def check_bwd():
    """bench/check_bwd.py as a module (the backward's PyTorch-autograd reference and error rule)."""
    _needs_cuda()
    return cpu_kernels.check_bwd()


@pytest.fixture(scope="module")
def feat():
    """bench/check_bwd_feat.py as a module (the backward features' fp32 references and error rule)."""
    _needs_cuda()
    return cpu_kernels.check_bwd_feat()
