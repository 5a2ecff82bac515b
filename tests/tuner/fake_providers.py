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
