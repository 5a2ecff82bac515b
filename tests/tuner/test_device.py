"""How the tuner counts GPUs: through the CUDA driver API, without importing torch."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from tuner import device, fleet


class FakeDriver:
    """libcuda.so.1's cuInit / cuDeviceGetCount, returning CUresult codes like the driver."""

    def __init__(self, count: int, init_status: int = 0):
        self.count, self.init_status, self.calls = count, init_status, []

    def cuInit(self, flags):
        self.calls.append(("cuInit", flags))
        return self.init_status

    def cuDeviceGetCount(self, ref):
        self.calls.append(("cuDeviceGetCount",))
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = self.count
        return 0

    def cuDeviceGet(self, ref, ordinal):
        if not 0 <= ordinal < self.count:
            return 101  # CUDA_ERROR_INVALID_DEVICE
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = 100 + ordinal  # a handle, not the ordinal
        return 0

    def cuDeviceGetUuid_v2(self, raw, dev):
        self.calls.append(("cuDeviceGetUuid_v2", dev.value))
        for j, b in enumerate(bytes([dev.value - 100]) * 16):
            raw[j] = b
        return 0


@pytest.fixture
def driver(monkeypatch):
    def install(lib):
        def cdll(name):
            assert name == "libcuda.so.1"
            if lib is None:
                raise OSError("libcuda.so.1: cannot open shared object file")
            return lib

        monkeypatch.setattr(ctypes, "CDLL", cdll)
        device.cuda_device_count.cache_clear()
        device.cuda_device_uuids.cache_clear()
        return lib

    yield install
    device.cuda_device_count.cache_clear()
    device.cuda_device_uuids.cache_clear()


def test_counts_what_the_driver_reports(driver):
    lib = driver(FakeDriver(2))
    assert device.cuda_device_count() == 2 and device.has_cuda()
    assert lib.calls[:2] == [("cuInit", 0), ("cuDeviceGetCount",)]


def test_no_driver_or_failed_init_is_no_gpu(driver):
    driver(None)
    assert device.cuda_device_count() == 0 and not device.has_cuda()
    driver(FakeDriver(4, init_status=100))  # CUDA_ERROR_NO_DEVICE
    assert device.cuda_device_count() == 0


def test_devices_all_uses_the_driver_count(driver):
    driver(FakeDriver(3))
    slots = fleet.parse_devices("all", True, "fa4", visible=None, uuids={})
    assert [s.name for s in slots] == ["gpu0", "gpu1", "gpu2"]
    with pytest.raises(fleet.FleetError, match="no GPU 3"):
        fleet.parse_devices("3", True, "fa4", visible=None, uuids={})


def test_asking_does_not_import_torch():
    code = ("import sys; from tuner.device import has_cuda; from tuner.fleet import FleetError, parse_devices\n"
            "has_cuda()\n"
            "try:\n    parse_devices('all', True, 'fa4', visible=None, uuids={})\n"
            "except FleetError:\n    pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out


def test_uuids_by_cuda_ordinal_lock_the_gpus_the_workers_get(driver):
    """--devices locks each GPU by its UUID, asked from the driver by CUDA ordinal: the ordinal a
    worker's CUDA_VISIBLE_DEVICES names (no nvidia-smi, whose numbering is PCI order)."""
    assert device.format_uuid(bytes(range(16))) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    driver(FakeDriver(2))
    assert device.cuda_device_uuids() == ("GPU-" + "-".join(["00" * 4, "00" * 2, "00" * 2, "00" * 2, "00" * 6]),
                                          "GPU-" + "-".join(["01" * 4, "01" * 2, "01" * 2, "01" * 2, "01" * 6]))
    slots = fleet.parse_devices("1,0", True, "fa4", visible="4,6")
    assert [(s.name, s.cuda_visible, s.lock_key) for s in slots] == [
        ("gpu1", "6", device.cuda_device_uuids()[1]), ("gpu0", "4", device.cuda_device_uuids()[0])]
    driver(None)
    assert device.cuda_device_uuids() == ()
    assert [s.lock_key for s in fleet.parse_devices("0", True, "fa4", visible="3")] == ["3"]
