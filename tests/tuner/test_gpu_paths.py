"""The branches of fa4-tune that only a GPU reaches, run on CPU on a fake machine.

tests/fakegpu makes every Python process started with it on PYTHONPATH see $FA4_FAKE_GPUS H200s
(the CUDA driver's count and UUIDs through ctypes, torch's device queries) and an nvidia-smi; the
GpuReplay provider times "on the GPU" by replaying the real H200 recording. So these tests run
fa4-tune as a user runs it on a GPU machine: the lock by UUID, the measuring process, the study,
the results DB and the final report. The first of them fails on the NameError that every plain
GPU run died of (tuner/fleet.py current_slot).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fa4.problem import Problem
from store import ResultsStore
from tests.fakegpu import sitecustomize as fakegpu
from tests.tuner.test_cli import ROOT
from tests.tuner.test_fleet import check_db_matches_studies, recorded_best
from tuner import device, fleet

FAKE = ROOT / "tests" / "fakegpu"
PROVIDER = "plugin:tests.tuner.fake_providers:GpuReplay"
SHAPE = ["--seqlen", "8192", "--hdim", "128"]  # a problem of the H200 recording (B2 H16)
RECORDED = Problem(batch=2, seqlen_q=8192, seqlen_k=8192, heads_q=16, heads_kv=16, head_dim=128,
                   head_dim_v=128)


def on_fake_gpus(n: int, *args, tmp_path, env_extra=None, timeout=300):
    """fa4-tune in a fresh process on a machine with ``n`` fake H200s, output piped (no TTY)
    into an 80-column terminal."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update({
        "PYTHONPATH": os.pathsep.join([str(FAKE), str(ROOT), env.get("PYTHONPATH", "")]),
        "PATH": os.pathsep.join([str(FAKE), env.get("PATH", "")]),
        "FA4_FAKE_GPUS": str(n),
        "FA4_LOCK_DIR": str(tmp_path / "locks"),
        "COLUMNS": "80",
    })
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def lock_file(tmp_path, physical: int):
    return tmp_path / "locks" / f"{fakegpu.uuid_text(physical)}.lock"


def test_plain_run_on_one_gpu_locks_it_stores_its_trials_and_reports(tmp_path):
    db = f"sqlite:///{tmp_path}/tune.db"
    lock = lock_file(tmp_path, 0)
    lock.parent.mkdir(parents=True)
    lock.touch()  # the measuring process opens it to check that fa4-tune holds its lock
    r = on_fake_gpus(1, *SHAPE, "--provider", PROVIDER, "--trials", "6", "--db", db, tmp_path=tmp_path,
                     env_extra={"FA4_TEST_EXPECT_LOCK": str(lock)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    # The summary, whole at 80 columns through a pipe: every number present, nothing squeezed.
    assert "\u2026" not in out and "..." not in out, out
    assert out.splitlines()[0] == f"gpu-replay on {fakegpu.NAME}: {RECORDED.key()}"
    default = re.search(r"^default: ([\d.]+) TFLOP/s, median [\d.]+ ms \(IQR [\d.]+\), max error ([\d.e+-]+), "
                        r"trial 0$", out, re.M)
    best = re.search(r"^best:    ([\d.]+) TFLOP/s, .* trial (\d+)$", out, re.M)
    speedup = re.search(r"^speedup best/default: ([\d.]+)x$", out, re.M)
    assert default and best and speedup, out
    assert float(speedup.group(1)) == pytest.approx(float(best.group(1)) / float(default.group(1)), abs=1e-3)
    assert re.search(r"^best config: the default( with \w+=\S+(, \w+=\S+)*)?$", out, re.M), out
    counts = re.search(r"^trials: 6 in study \(of \d+ feasible configs\): (\d+) measured ok, (\d+) infeasible, (\d+) failed"
                       r"(?:, (\d+) repeated a config already tried \(not measured again\))?$", out, re.M)
    assert counts and sum(int(x or 0) for x in counts.groups()) == 6, out
    assert int(counts.group(2)) == 0, out  # only feasible configs are proposed
    assert int(counts.group(3)) == 0, out  # every measurement found the GPU locked

    # The DB holds the trials under the faked device, with what the driver and nvidia-smi said.
    with ResultsStore.open(db) as store:
        (dev,) = store.devices()
        assert (dev["name"], dev["sm_count"], dev["compute_capability"], dev["driver"]) == (
            fakegpu.NAME, 132, "9.0", "580.159.04")
        rows = store.measurements(provider="gpu-replay")
        assert len(rows) == 6 and {r["device"] for r in rows} == {fakegpu.NAME}
        ok = [r for r in rows if r["status"] == "ok"]
        assert max(r["tflops"] for r in ok) == pytest.approx(float(best.group(1)), abs=0.05)
        assert max(r["tflops"] for r in ok) <= recorded_best(RECORDED)["tflops"] + 1e-6

    # The lock was released at the end: another timing process can take the GPU now.
    fd = fleet.acquire(fleet.Slot("gpu0", "0", fakegpu.uuid_text(0)))
    os.close(fd)


def test_plain_run_refuses_a_gpu_that_a_fleet_worker_holds(tmp_path, monkeypatch):
    """A plain run locks the key ``--devices 0`` locks: the GPU's UUID, not its ordinal."""
    monkeypatch.setenv("FA4_LOCK_DIR", str(tmp_path / "locks"))
    slot = fleet.Slot("gpu0", "1", fakegpu.uuid_text(1))  # what a fleet's worker on GPU 1 holds
    fd = fleet.acquire(slot)
    try:
        r = on_fake_gpus(2, *SHAPE, "--provider", PROVIDER, "--trials", "2", "--db", f"sqlite:///{tmp_path}/t.db",
                         tmp_path=tmp_path, env_extra={"CUDA_VISIBLE_DEVICES": "1,0"})
    finally:
        os.close(fd)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"GPU 1 is in use for timing by fa4-tune pid {os.getpid()}" in r.stderr, r.stderr


def test_current_slot_is_cuda_ordinal_zero_by_uuid(monkeypatch):
    monkeypatch.setattr(fakegpu, "N", 3)
    monkeypatch.setattr("ctypes.CDLL", lambda name, *a, **kw: fakegpu.FakeLibcuda())
    for visible, physical in ((None, 0), ("2,0", 2), (fakegpu.uuid_text(1), 1)):
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        device.cuda_device_count.cache_clear()
        device.cuda_device_uuids.cache_clear()
        try:
            slot = fleet.current_slot()
            assert slot.lock_key == fakegpu.uuid_text(physical)
            assert slot.lock_key == fleet.parse_devices("0", True, "fa4")[0].lock_key
        finally:
            device.cuda_device_count.cache_clear()
            device.cuda_device_uuids.cache_clear()


def test_fleet_on_two_gpus_locks_each_by_uuid_and_fills_the_studies(tmp_path):
    db = f"sqlite:///{tmp_path}/tune.db"
    problems = [RECORDED, Problem(batch=2, seqlen_q=8192, seqlen_k=8192, heads_q=16, heads_kv=16,
                                  head_dim=128, head_dim_v=128, causal=True)]
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("seqlen,hdim,batch,heads,causal\n" + "".join(
        f"{p.seqlen_q},{p.head_dim},{p.batch},{p.heads_q},{int(p.causal)}\n" for p in problems))
    r = on_fake_gpus(2, "--shapes", str(shapes), "--devices", "all", "--provider", PROVIDER, "--trials", "5",
                     "--db", db, "--json", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    doc = json.loads(r.stdout)
    assert sorted(w["slot"] for w in doc["workers"]) == ["gpu0", "gpu1"], r.stderr[-3000:]
    # Each worker was pinned to one physical GPU and locked it by that GPU's UUID.
    for k in (0, 1):
        assert f"CUDA_VISIBLE_DEVICES='{k}'" in r.stderr, r.stderr
        assert lock_file(tmp_path, k).exists()
    results = doc["results"]
    assert [Problem.from_dict(x["problem"]) for x in results] == problems
    assert [(x["trials"], x["device"]) for x in results] == [(5, fakegpu.NAME)] * 2, r.stderr[-3000:]
    with ResultsStore.open(db) as store:
        from tuner.study import default_storage

        assert check_db_matches_studies(store, default_storage(db), results, "gpu-replay") == 10


# ---- the device queries of the kernels' launch path, in this process ----------------------


@pytest.fixture
def fake_torch_gpu(monkeypatch):
    """torch.cuda's device queries answering as one H200 (the same fakes as the subprocesses)."""
    import torch

    for name in ("is_available", "device_count", "get_device_capability", "current_device",
                 "get_device_properties", "get_device_name"):
        monkeypatch.setattr(torch.cuda, name, getattr(torch.cuda, name))  # restored afterwards
    monkeypatch.setattr(fakegpu, "N", 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fakegpu.patch_torch(torch)


def test_kernels_see_the_gpu_they_launch_on(fake_torch_gpu, monkeypatch):
    import torch

    from fa4 import launch, lookup, tensors
    from fa4.arch import SM90, current_arch
    from providers.fa4_provider import Fa4Provider

    monkeypatch.delenv(lookup.DEVICE_ENV, raising=False)
    assert lookup._device_name() == (fakegpu.NAME, "")  # the key the launch-time lookup asks with
    assert current_arch() == SM90
    tensors._arch_by_device.clear()
    assert tensors.arch_of(torch.device("cuda", 0)) == SM90
    launch._sm_count.cache_clear()
    assert launch._sm_count(torch.device("cuda", 0)) == 132  # the persistent kernel's grid
    assert Fa4Provider().available() is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert Fa4Provider().available() == "fa4 kernels are built for sm90 only (this GPU is sm8x)"
    tensors._arch_by_device.clear()
    with pytest.raises(ValueError, match="no kernels for compute capability 8.0"):
        tensors.arch_of(torch.device("cuda", 0))
    tensors._arch_by_device.clear()
    launch._sm_count.cache_clear()
