"""Providers that misbehave on purpose, loaded by the worker process from their import path."""

from __future__ import annotations

import os

from tuner.providers.replay import ReplayProvider

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
