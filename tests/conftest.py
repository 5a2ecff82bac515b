"""Markers: gpu tests need CUDA, ref tests need the reference FA4 importable; both skip otherwise."""

import importlib
import os

import pytest

# CuTe DSL fixes its target when it loads; without a GPU make it the Hopper target the
# kernels are written for, before any test module imports cutlass.
try:
    import torch as _torch

    if not _torch.cuda.is_available():
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
except ImportError:
    pass


# The tools' per-user defaults (the results DB and Optuna journal under platformdirs'
# user_data_dir) point into a directory of this test session, so no test reads or migrates
# the machine's own results DB and every run starts from an empty one.
if "FA4_TEST_KEEP_DATA_HOME" not in os.environ:
    import tempfile as _tempfile

    os.environ["XDG_DATA_HOME"] = _tempfile.mkdtemp(prefix="fa4-tests-data-")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _has_reference() -> bool:
    try:
        importlib.import_module("flash_attn.cute.interface")
    except Exception:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    cuda = _has_cuda()
    ref = None
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "ref" in item.keywords:
            if ref is None:
                ref = _has_reference()
            if not ref:
                item.add_marker(pytest.mark.skip(reason="needs flash-attn-4 (pip install 'fa4-tune[ref]')"))
