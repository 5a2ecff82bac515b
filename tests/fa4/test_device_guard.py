"""fa4.tensors.device_guard, the launch paths' device context, with the GPU faked: no
torch.cuda.device where the tensor's GPU is the current one (its construction costs microseconds
a call), a switch to the tensor's GPU otherwise; and each launch path goes through it."""

from __future__ import annotations

import contextlib

import pytest
import torch

from fa4 import decode, launch, tensors, varlen
from fa4.sm90 import bwd_launch


class OnGpu:
    """Stands in for a CUDA tensor: the launch guard asks only its device index."""

    def __init__(self, index):
        self.index = index

    def get_device(self):
        return self.index


@pytest.fixture
def gpus(monkeypatch):
    """Two fake GPUs, 1 current; records the devices switched to."""
    switched = []

    @contextlib.contextmanager
    def device(idx):
        switched.append(idx)
        yield

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device", device)
    return switched


def test_current_gpu_takes_no_switch(gpus):
    with tensors.device_guard(OnGpu(1)):
        pass
    assert gpus == []
    assert tensors.device_guard(OnGpu(1)) is tensors.device_guard(OnGpu(1))  # one shared null context


def test_other_gpu_switches_to_it(gpus):
    with tensors.device_guard(OnGpu(0)):
        assert gpus == [0]
    with tensors.device_guard(OnGpu(3)):
        pass
    assert gpus == [0, 3]


def test_every_launch_path_uses_the_guard():
    # The dense forward calls it by name; the varlen forward, decode and both backwards through
    # the _on_device name their CPU tests stand in.
    assert launch.device_guard is tensors.device_guard
    for mod in (varlen, decode, bwd_launch):
        assert mod._on_device is tensors.device_guard
