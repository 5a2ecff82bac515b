"""Timing modes (fa4.timing): eager or CUDA-graph launches, cold or warm L2, from the flag to the rows.

The GPU side of ``time_callable`` runs here against a faked torch.cuda whose "GPU" keeps a clock:
an eager call costs 2 ms, a graph replay 1 ms, an L2 flush 100 ms, and events read the clock. So
the samples say what was timed (replays, not launches) and whether a flush fell inside the timed
region, and the recorded call order says where the capture happened.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import torch

from fa4.problem import Problem
from fa4.timing import DEFAULT, DEFAULT_TIMING, TIMINGS, Timing, canonical
from providers import harness
from providers.harness import RUNTIME_ERROR, NotCapturable, Settings
from store import ResultsStore
from tests.tuner.fake_providers import ENV
from tests.tuner.synthetic import write_synthetic
from tests.tuner.test_cli import fa4_tune
from tuner.study import Tuner, study_name
from tuner.worker import InProcessRunner

PROBLEM = Problem.standard(8192, 128)
EAGER_MS, REPLAY_MS, FLUSH_MS = 2.0, 1.0, 100.0
CLOCK_KHZ = 1_000_000  # the fake GPU's clock: 1 GHz


# -- the declaration ---------------------------------------------------------------------------


def test_the_modes_their_canonical_strings_and_the_default():
    assert DEFAULT == Timing("eager", "cold") and DEFAULT_TIMING == "eager-cold" == str(DEFAULT)
    assert TIMINGS[0] == DEFAULT_TIMING and set(TIMINGS) == {"eager-cold", "eager-warm", "graph-cold", "graph-warm"}
    for name in TIMINGS:
        t = Timing.parse(name)
        assert t.name == name and canonical(t) == name and name in t.to_dict()["name"]
        assert t.graph == (t.launch == "graph") and t.flush_l2 == (t.l2 == "cold")
    assert canonical(None) == DEFAULT_TIMING and canonical(" Graph-Warm ") == "graph-warm"
    for bad in ("graph", "eager_cold", "graph-hot", ""):
        with pytest.raises(ValueError, match="timing must be one of eager-cold, "):
            Timing.parse(bad)
    with pytest.raises(ValueError, match="launch must be one of"):
        Timing("lazy", "cold")
    # Settings carry the mode, canonical, and refuse an unknown one.
    assert Settings().timing == DEFAULT_TIMING and Settings(timing="GRAPH-cold").mode == Timing("graph", "cold")
    assert Settings.from_dict(Settings(timing="graph-warm").to_dict()).timing == "graph-warm"
    with pytest.raises(ValueError):
        Settings(timing="graph-hot")


# -- time_callable on a faked torch.cuda -------------------------------------------------------


class FakeGPU:
    """torch.cuda's streams, events, graphs and synchronize, on one clock, logging every call."""

    def __init__(self, capturable: bool = True):
        self.clock = 0.0
        self.log: list[str] = []
        self.capturing = None
        self.stream = "default"
        self.capturable = capturable

    def install(self, monkeypatch):
        gpu = self
        cuda = torch.cuda

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None

            def record(self, stream=None):
                assert gpu.capturing is None, "an event recorded inside the capture"
                self.t = gpu.clock
                gpu.log.append("record")

            def elapsed_time(self, end):
                return end.t - self.t

        class Stream:
            def __init__(self, name="side"):
                self.name = name

            def wait_stream(self, other):
                gpu.log.append(f"{self.name} waits for {other.name}")

        @contextmanager
        def stream(s):
            before, gpu.stream = gpu.stream, s.name
            try:
                yield
            finally:
                gpu.stream = before

        class CUDAGraph:
            def __init__(self):
                self.captured = []

            def replay(self):
                assert self.captured, "replay of an empty graph"
                gpu.clock += REPLAY_MS
                gpu.log.append("replay")

        @contextmanager
        def graph(g, stream=None, **kw):
            assert stream is not None and stream.name != "default", "capture on the default stream"
            gpu.capturing, before = g, gpu.stream
            gpu.stream = stream.name
            gpu.log.append("capture_begin")
            try:
                yield
            finally:
                gpu.capturing, gpu.stream = None, before
                gpu.log.append("capture_end")

        monkeypatch.setattr(cuda, "Event", Event)
        monkeypatch.setattr(cuda, "Stream", Stream)
        monkeypatch.setattr(cuda, "stream", stream)
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: Stream(gpu.stream))
        monkeypatch.setattr(cuda, "CUDAGraph", CUDAGraph)
        monkeypatch.setattr(cuda, "graph", graph)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)

        class Flush:
            def zero_(self):
                assert gpu.capturing is None
                gpu.clock += FLUSH_MS
                gpu.log.append("flush")

        monkeypatch.setattr(harness, "l2_flush_buffer", lambda device=None: gpu.log.append("flush buffer") or Flush())

        def sleep(cycles):
            assert gpu.capturing is None and cycles > 0
            gpu.clock += cycles / CLOCK_KHZ
            gpu.slept.append(cycles)
            gpu.log.append("sleep")

        self.slept: list[int] = []
        monkeypatch.setattr(cuda, "_sleep", sleep)
        monkeypatch.setattr(harness, "clock_khz", lambda device=None: CLOCK_KHZ)
        return self

    def fn(self):
        """The callable under test: a kernel launch."""
        if self.capturing is not None:
            if not self.capturable:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
            self.capturing.captured.append("fn")
            self.log.append("fn captured")
            return
        self.clock += EAGER_MS
        self.log.append(f"fn on {self.stream}")


SETTINGS = dict(warmup_ms=0.0, min_reps=5, max_reps=5)


def _timed_part(log: list[str]) -> list[str]:
    """The log from the first timed event on."""
    i = log.index("record")
    while i and log[i - 1] in ("flush", "sleep"):
        i -= 1
    return log[i:]


def test_graph_cold_times_replays_with_the_flush_outside_the_events(monkeypatch):
    gpu = FakeGPU().install(monkeypatch)
    samples = harness.time_callable(gpu.fn, Settings(timing="graph-cold", **SETTINGS))
    # Replays were timed (1 ms each), not launches (2 ms), and no flush (100 ms) inside a rep.
    assert samples == [REPLAY_MS] * 5
    log = gpu.log
    # Warm-up eager on the current stream, then PyTorch's recipe: warm-up calls on a side stream,
    # the capture on it (one call captured), one untimed replay, then the timed reps.
    cap = log.index("capture_begin")
    assert log[:5] == ["flush buffer"] + ["fn on default"] * 4
    assert log[5] == "side waits for default" and log[6:9] == ["fn on side"] * 3
    assert log[cap:cap + 3] == ["capture_begin", "fn captured", "capture_end"]
    assert log[cap + 3] == "replay"
    assert _timed_part(log) == ["flush", "record", "replay", "record"] * 5
    assert "fn on default" not in log[cap:] and log.count("fn captured") == 1


def test_graph_warm_replays_back_to_back_without_a_flush(monkeypatch):
    gpu = FakeGPU().install(monkeypatch)
    samples = harness.time_callable(gpu.fn, Settings(timing="graph-warm", **SETTINGS))
    assert samples == [REPLAY_MS] * 5
    assert "flush buffer" not in gpu.log and "flush" not in gpu.log
    assert _timed_part(gpu.log) == ["record", "replay", "record"] * 5


def test_eager_modes_launch_each_rep_and_never_capture(monkeypatch):
    gpu = FakeGPU().install(monkeypatch)
    assert harness.time_callable(gpu.fn, Settings(**SETTINGS)) == [EAGER_MS] * 5  # the default: eager-cold
    assert "capture_begin" not in gpu.log
    # eager-cold: the GPU sleeps after the flush, so the rep's launch is queued when its start
    # event fires (the host path is not in the sample; eager-warm's back-to-back reps show it).
    assert _timed_part(gpu.log) == ["flush", "sleep", "record", "fn on default", "record"] * 5
    gpu = FakeGPU().install(monkeypatch)
    assert harness.time_callable(gpu.fn, Settings(timing="eager-warm", **SETTINGS)) == [EAGER_MS] * 5
    assert "flush" not in gpu.log and _timed_part(gpu.log) == ["record", "fn on default", "record"] * 5


def test_eager_cold_sleeps_the_gpu_for_longer_than_the_host_path_takes(monkeypatch):
    import time

    gpu = FakeGPU().install(monkeypatch)
    host_s = 0.004

    def slow_host():  # a call whose Python path takes 4 ms of wall time before its launch
        time.sleep(host_s)
        gpu.fn()

    assert harness.time_callable(slow_host, Settings(**SETTINGS)) == [EAGER_MS] * 5
    # Each rep's sleep outlasts the host path measured in the warm-up (2x it, plus 20 us).
    assert len(gpu.slept) == 5 and len(set(gpu.slept)) == 1
    assert gpu.slept[0] >= (2 * host_s + 20e-6) * CLOCK_KHZ * 1e3
    assert gpu.slept[0] < 10 * host_s * CLOCK_KHZ * 1e3  # not unbounded: a few times the host path
    # The rule itself: the median without the first call (which may compile: seconds, not the
    # host path's length), 2x, + 20 us, at most 20 ms.
    assert harness.host_cover_cycles([], CLOCK_KHZ) == 0
    assert abs(harness.host_cover_cycles([5.0, 1e-4, 1e-4, 3e-4], CLOCK_KHZ) - 220_000) <= 1
    assert abs(harness.host_cover_cycles([5.0, 1e-4, 2e-4, 3e-4, 9e-4], CLOCK_KHZ) - 620_000) <= 1
    assert harness.host_cover_cycles([0.0, 1.0, 1.0], CLOCK_KHZ) == 20_000_000
    # Graph replays have no host path to cover, a warm L2 no flush to hide it behind.
    for timing in ("graph-cold", "eager-warm", "graph-warm"):
        gpu = FakeGPU().install(monkeypatch)
        harness.time_callable(slow_host, Settings(timing=timing, **SETTINGS))
        assert gpu.slept == [], timing


def test_a_callable_that_cannot_be_captured_is_a_runtime_error_never_an_eager_timing(monkeypatch):
    gpu = FakeGPU(capturable=False).install(monkeypatch)
    with pytest.raises(NotCapturable, match="^not capturable under CUDA graphs: RuntimeError: CUDA error"):
        harness.time_callable(gpu.fn, Settings(timing="graph-cold", **SETTINGS))
    assert "record" not in gpu.log  # nothing was timed

    class Provider:
        def make_fwd(self, problem, config, q, k, v):
            return gpu.fn

    gpu.log.clear()
    monkeypatch.setattr(harness, "make_inputs", lambda problem, seed, device="cuda": (None, None, None, None))
    m = harness.measure(Provider(), PROBLEM, None, Settings(timing="graph-cold", check=False, **SETTINGS))
    assert m.status == RUNTIME_ERROR and m.tflops is None and not m.samples_ms
    assert m.reason.startswith("not capturable under CUDA graphs: RuntimeError: CUDA error: operation not permitted")
    assert "record" not in gpu.log
    # The same provider times fine eagerly.
    m = harness.measure(Provider(), PROBLEM, None, Settings(check=False, **SETTINGS))
    assert m.ok and m.samples_ms == [EAGER_MS] * 5


# -- the tuner: the mode is recorded on every row and used by the re-measurement ---------------


@pytest.fixture
def env(tmp_path, monkeypatch):
    rec = write_synthetic(tmp_path / "rec.json", [PROBLEM])
    monkeypatch.setenv(ENV, str(rec))
    store = ResultsStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    yield {"rec": rec, "store": store, "tmp": tmp_path}
    store.close()


class Recording(InProcessRunner):
    def __init__(self):
        self.timings = []

    def run(self, provider, problem, config, settings):
        self.timings.append(settings.timing)
        return super().run(provider, problem, config, settings)


def test_a_graph_warm_study_times_trials_and_re_measurement_in_its_mode(env):
    runner = Recording()
    t = Tuner("plugin:tests.tuner.fake_providers:TimingProbe", PROBLEM, store=env["store"], runner=runner,
              trials=12, timing="graph-warm")
    res = t.run()
    assert res.timing == "graph-warm" and t.name == study_name(t.device_info["name"], "timing-probe", PROBLEM,
                                                               "graph-warm")
    assert t.name.endswith("|graph-warm") and study_name("d", "p", PROBLEM) == "fa4-tune|d|p|" + PROBLEM.key()
    # Every measurement, the interleaved re-measurement rounds included, in the study's mode.
    measured = sum(1 for r in env["store"].measurements(study_name=t.name) if r["status"] != "infeasible")
    assert res.served is not None and len(runner.timings) > measured
    assert set(runner.timings) == {"graph-warm"}
    rows = env["store"].measurements(study_name=t.name)
    assert rows and {r["timing"] for r in rows} == {"graph-warm"}
    assert {r["reason"] for r in rows if r["status"] == "ok"} == {"timed graph-warm"}
    v = env["store"].verdict(t.device_info["name"], "timing-probe", PROBLEM, timing="graph-warm")
    assert v is not None and v["timing"] == "graph-warm" and v["measurement"]["timing"] == "graph-warm"
    # Nothing of it answers an eager-cold question.
    assert env["store"].verdict(t.device_info["name"], "timing-probe", PROBLEM) is None
    assert env["store"].best(t.device_info["name"], "timing-probe", PROBLEM) is None
    assert env["store"].best(t.device_info["name"], "timing-probe", PROBLEM, timing="graph-warm") is not None


def test_fa4_tune_launch_graph_records_the_mode_on_every_row(env):
    db = f"sqlite:///{env['tmp'] / 'cli.db'}"
    args = ["--seqlen", "8192", "--hdim", "128", "--provider", "plugin:tests.tuner.fake_providers:TimingProbe",
            "--trials", "6", "--verify-rounds", "2", "--db", db]
    r = fa4_tune(*args, "--launch", "graph", "--json", env_extra={ENV: str(env["rec"])})
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["timing"] == "graph-cold" and res["study_name"].endswith("|graph-cold")
    with ResultsStore.open(db) as store:
        rows = store.measurements(study_name=res["study_name"])
        assert len(rows) == 6 and {r["timing"] for r in rows} == {"graph-cold"}
        # The measuring process (a separate one: fa4-tune's runner) was told the mode too.
        assert {r["reason"] for r in rows if r["status"] == "ok"} == {"timed graph-cold"}
        assert store.count(timing="graph-cold") == 6 and store.count(timing="eager-cold") == 0
    # The default mode is a study of its own, with the names studies had before modes.
    r = fa4_tune(*args, "--json", env_extra={ENV: str(env["rec"])})
    eager = json.loads(r.stdout)
    assert r.returncode == 0 and eager["timing"] == "eager-cold" and eager["resumed_with"] == 0
    assert eager["study_name"] == res["study_name"].removesuffix("|graph-cold")
    human = fa4_tune(*args, "--launch", "graph", "--l2", "warm", env_extra={ENV: str(env["rec"])})
    assert human.returncode == 0 and human.stdout.splitlines()[1] == "timing: graph-warm", human.stdout
    bad = fa4_tune(*args, "--launch", "lazy")
    assert bad.returncode == 2 and "invalid choice: 'lazy'" in bad.stderr
    helptext = fa4_tune("--help").stdout
    assert "--launch graph" in helptext and "--l2 warm" in helptext and "FA4_TUNING_TIMING" in helptext


def test_push_sends_the_mode_and_keeps_old_rows_keys():
    from tuner.push import idempotency_key, result_payload

    row = {"provider": "fa4", "problem": PROBLEM.to_dict(), "config": {}, "status": "ok", "timing": "graph-cold"}
    body = result_payload(row, {"name": "H200"})
    assert body["timing"] == "graph-cold"
    # A default-mode row's payload (and so its idempotency key) is what it was before modes existed.
    old = result_payload({**row, "timing": DEFAULT_TIMING}, {"name": "H200"})
    assert "timing" not in old and old == result_payload({k: v for k, v in row.items() if k != "timing"},
                                                         {"name": "H200"})
    assert idempotency_key(old) != idempotency_key(body)
