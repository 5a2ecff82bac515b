"""Input validation of fa4.flash_attn_func: clear ValueErrors, never a launch (CPU tensors)."""

import pytest
import torch

from fa4.interface import validate


def t(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


def check(q, k, v, match, **kw):
    with pytest.raises(ValueError, match=match):
        validate(q, k, v, require_cuda=False, **kw)


def test_cpu_tensors_are_rejected_by_device():
    with pytest.raises(ValueError, match="CUDA"):
        validate(t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64))


def test_good_inputs_pass():
    validate(t(2, 100, 8, 128), t(2, 77, 2, 128), t(2, 77, 2, 128), require_cuda=False)


@pytest.mark.parametrize(
    "q,k,v,match",
    [
        (t(1, 8, 2, 64), t(1, 8, 2, 64, dtype=torch.float16), t(1, 8, 2, 64), "dtype mismatch"),
        (t(1, 8, 2, 64, dtype=torch.float32), t(1, 8, 2, 64, dtype=torch.float32), t(1, 8, 2, 64, dtype=torch.float32), "dtype"),
        (t(1, 8, 2, 96), t(1, 8, 2, 96), t(1, 8, 2, 96), "head_dim 96 is not supported"),
        (t(1, 8, 3, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), "multiple of heads_kv"),
        (t(1, 8, 2, 64), t(2, 8, 2, 64), t(2, 8, 2, 64), "batch mismatch"),
        (t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 9, 2, 64), "seqlen differ"),
        (t(8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), "4-D"),
        (t(1, 8, 2, 128), t(1, 8, 2, 64), t(1, 8, 2, 64), "head_dim mismatch"),
    ],
)
def test_bad_inputs_name_the_problem(q, k, v, match):
    check(q, k, v, match)


def test_non_contiguous_last_dim():
    q = t(1, 8, 2, 128)[..., ::2]
    check(q, t(1, 8, 2, 64), t(1, 8, 2, 64), "contiguous in its last dimension")
