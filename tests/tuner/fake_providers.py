"""Providers that misbehave on purpose, loaded by the worker process from their import path."""

from __future__ import annotations

import os

from fa4.arch import SM90
from providers.fa4_provider import Fa4Provider
from providers.replay import ReplayProvider


class OffGpuH200:
    """Mixin of a provider measuring off the GPU (in process, on this CPU) as an H200 named
    ``device_name``: available everywhere, sm_90 feasibility, the H200's device record."""

    needs_gpu = False
    device_name = "faked H200"

    def available(self):
        return None

    def arch(self):
        return SM90

    def device_info(self):
        return {"name": self.device_name, "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 60 * 2**20,
                "memory_bytes": 150_754_820_096}

ENV = "FA4_TEST_RECORDING"


class MisbehavingReplay(ReplayProvider):
    """Replays a recording, but hard-crashes the process on tile_n=96 and raises on tile_n=112."""

    name = "misbehaving-replay"

    def __init__(self):
        super().__init__(os.environ[ENV])

    def measure(self, problem, config, settings):
        if config.tile_n == 96:
            os.abort()  # like a segfault in a kernel launch: the process is gone
        if config.tile_n == 112:
            raise RuntimeError("provider bug raised inside the worker")
        return super().measure(problem, config, settings)


class SlowReplay(ReplayProvider):
    """Replays the real H200 recording, slowly, and says who is measuring.

    Before each measurement it writes its process id to a file in $FA4_TEST_MARKERS, then
    sleeps $FA4_TEST_SLOW_S: a test can SIGKILL the process in the middle of a trial.
    """

    name = "slow-replay"

    def __init__(self):
        super().__init__()

    def measure(self, problem, config, settings):
        import time

        markers = os.environ.get("FA4_TEST_MARKERS")
        if markers:
            path = os.path.join(markers, f"{os.getpid()}-{time.monotonic_ns()}")
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        t = time.perf_counter()
        time.sleep(float(os.environ.get("FA4_TEST_SLOW_S", "0.2")))
        m = super().measure(problem, config, settings)
        m.phases = {"time": time.perf_counter() - t}  # like a GPU timing loop
        return m


class WarmupProbe(ReplayProvider):
    """Replays the real H200 recording; its warm-up takes $FA4_TEST_WARM_S seconds (like the
    imports and CUDA context of a real provider) and fails when $FA4_TEST_WARM_FAIL is set.
    Each measurement reports, as its reason, the process id that measured it and whether
    that process had warmed up before."""

    name = "warmup-probe"

    def __init__(self):
        super().__init__()
        self.warmed = False

    def warmup(self) -> None:
        import time

        time.sleep(float(os.environ.get("FA4_TEST_WARM_S", "0")))
        if os.environ.get("FA4_TEST_WARM_FAIL"):
            raise RuntimeError("warm-up failed on purpose")
        self.warmed = True

    def measure(self, problem, config, settings):
        m = super().measure(problem, config, settings)
        m.reason = f"pid={os.getpid()} warmed={self.warmed}"
        return m


class SlowTeardown(ReplayProvider):
    """Replays the real H200 recording; the process it measures in takes $FA4_TEST_TEARDOWN_S
    seconds to shut down (an atexit hook, like the CUDA and compiler teardown of a real provider)."""

    name = "slow-teardown"

    def warmup(self) -> None:
        import atexit
        import time

        atexit.register(time.sleep, float(os.environ.get("FA4_TEST_TEARDOWN_S", "5")))


class GpuReplay(ReplayProvider):
    """A provider that times on a GPU, as fa4 and the peers do, but answers from the real H200
    recording: on the fake machine of tests/fakegpu it takes every branch a GPU run takes (the
    GPU lock, the measuring process, the device record) without launching a kernel.

    With $FA4_TEST_EXPECT_LOCK naming a lock file, each measurement first checks that another
    process (the fa4-tune that started this one) holds that file's lock: the GPU is locked
    while it is timed. A measurement on an unlocked GPU raises (a runtime_error trial)."""

    name = "gpu-replay"
    needs_gpu = True

    def available(self):
        from tuner.device import has_cuda

        return None if has_cuda() else "needs a CUDA GPU"

    def warmup(self) -> None:
        """Nothing to load: the base class would create a CUDA context, which the fake machine
        has none of (torch's CPU build)."""

    def measure(self, problem, config, settings):
        import fcntl

        expect = os.environ.get("FA4_TEST_EXPECT_LOCK")
        if expect:
            fd = os.open(expect, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # held by fa4-tune, as it must be
            else:
                raise RuntimeError(f"timing on a GPU whose lock {expect} nobody holds")
            finally:
                os.close(fd)
        return super().measure(problem, config, settings)


class NoisyReplay(ReplayProvider):
    """Replays $FA4_TEST_RECORDING with the run-to-run noise of a shared GPU: every measurement's
    times are scaled by a factor drawn uniformly from [1 - a, 1 + a], a = $FA4_TEST_NOISE, from a
    generator seeded by the measurement's seed and config (a re-measurement round draws anew)."""

    name = "noisy-replay"

    def __init__(self):
        super().__init__(os.environ[ENV])

    def measure(self, problem, config, settings):
        import json
        import random

        m = super().measure(problem, config, settings)
        a = float(os.environ.get("FA4_TEST_NOISE", "0"))
        if m.ok and a:
            key = json.dumps([settings.seed, self.config_to_dict(config)], sort_keys=True)
            f = random.Random(key).uniform(1 - a, 1 + a)
            m.samples_ms = [x * f for x in m.samples_ms]
            m.median_ms *= f
            m.tflops /= f
        return m


class TimingProbe(ReplayProvider):
    """Replays $FA4_TEST_RECORDING and says, as each measurement's reason, the timing mode the
    measuring process was asked to time in (Settings.timing): where the mode travels, it shows."""

    name = "timing-probe"

    def __init__(self):
        super().__init__(os.environ[ENV])

    def measure(self, problem, config, settings):
        m = super().measure(problem, config, settings)
        m.reason = f"timed {settings.timing}"
        return m


class FakedLaunchFa4(Fa4Provider):
    """Provider fa4 as it runs on a GPU (its knobs, its varlen argument mapping, harness.measure's
    packed inputs and per-document check), in a measuring process whose kernel launches are faked:
    fa4.varlen's and fa4.sm90.bwd_launch's kernels are the per-sequence CPU models of
    tests/fa4/test_varlen_host.py and test_varlen_bwd_host.py, the tensors live on the CPU and a
    rep takes 2 ms. On the fake machine of tests/fakegpu it takes a GPU run's branches."""

    name = "fa4"

    def available(self):
        from tuner.device import has_cuda

        return None if has_cuda() else "needs a CUDA GPU"

    def warmup(self) -> None:
        """No CUDA context to make (torch's CPU build); the fakes go in for this process."""
        from tests.fa4.test_varlen_host import install_fake_forward
        from tests.tuner.test_varlen_tuning import cpu_measuring, install_fake_backward

        for install in (install_fake_forward, install_fake_backward, cpu_measuring):
            install(_Forever)
        self._faked = True

    def measure(self, problem, config, settings):
        if not getattr(self, "_faked", False):
            self.warmup()
        return super().measure(problem, config, settings)


class _Forever:
    """monkeypatch's setattr for a process that ends with its measurements: nothing to undo."""

    setattr = staticmethod(setattr)
