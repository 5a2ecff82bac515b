"""Record the attention problems a program runs, to tune exactly those (``fa4-tune --shapes``).

    with fa4.record_shapes("shapes.json"):
        train_step()                       # every flash_attn_func call, forward and backward

or, for a script left as it is: ``FA4_RECORD_SHAPES=shapes.json python3 train.py``.

The file lists each distinct problem once with its call count and its share of the GPU time
spent in our kernels (CUDA events around each launch, read when the recording ends, so the
program is not synchronized per call), most time first: the order in which tuning pays. It is a
JSON object whose "shapes" list ``fa4-tune --shapes`` reads.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ENV = "FA4_RECORD_SHAPES"
FORMAT = "fa4 recorded shapes v1"


class ShapeRecorder:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._problems: dict[str, object] = {}  # key -> Problem
        self._calls: dict[str, int] = {}
        self._timings: dict[str, list] = {}  # key -> CUDA event pairs, or seconds where no GPU ran it

    def observe(self, problem, on_cuda: bool, launch):
        """Run ``launch`` (one kernel launch path of ``problem``), counting and timing it."""
        key = problem.key()
        if on_cuda:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = launch()
            end.record()
            timing = (start, end)
        else:
            t0 = time.perf_counter()
            result = launch()
            timing = time.perf_counter() - t0
        with self._lock:
            self._problems.setdefault(key, problem)
            self._calls[key] = self._calls.get(key, 0) + 1
            self._timings.setdefault(key, []).append(timing)
        return result

    def summary(self) -> list[dict]:
        """Each problem with its calls, milliseconds and share of the recorded time, most first."""
        with self._lock:
            timings = {k: list(v) for k, v in self._timings.items()}
            calls, problems = dict(self._calls), dict(self._problems)
        if any(not isinstance(t, float) for ts in timings.values() for t in ts):
            import torch

            torch.cuda.synchronize()
        ms = {k: sum(t * 1e3 if isinstance(t, float) else t[0].elapsed_time(t[1]) for t in ts)
              for k, ts in timings.items()}
        total = sum(ms.values()) or 1.0
        rows = [{"problem": problems[k].to_dict(), "calls": calls[k], "gpu_ms": round(ms[k], 4),
                 "share": round(ms[k] / total, 6)} for k in ms]
        return sorted(rows, key=lambda r: -r["gpu_ms"])  # stable: equal times keep first-seen order

    def write(self) -> Path:
        shapes = self.summary()
        doc = {"format": FORMAT, "total_gpu_ms": round(sum(r["gpu_ms"] for r in shapes), 4), "shapes": shapes}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(self.path)  # a reader never sees half a file
        return self.path


_active: list[ShapeRecorder] = []


def active() -> ShapeRecorder | None:
    return _active[-1] if _active else None


@contextmanager
def record_shapes(path: str | os.PathLike):
    """Record every problem fa4's kernels run inside the block; the file is written at its end."""
    rec = ShapeRecorder(path)
    _active.append(rec)
    try:
        yield rec
    finally:
        _active.remove(rec)
        rec.write()


def observed(pass_: str):
    """Decorate a launch path ``f(q, k, v, ...)`` so that an active recorder sees its problem.

    ``problem(args)`` is built only while recording: a launch outside a recording pays one
    list check."""

    def wrap(f):
        @functools.wraps(f)
        def inner(*args, **kwargs):
            rec = active()
            if rec is None:
                return f(*args, **kwargs)
            q = args[0] if pass_ == "fwd" else args[1]
            return rec.observe(_problem(pass_, args), q.is_cuda, lambda: f(*args, **kwargs))

        return inner

    return wrap


def _problem(pass_: str, args):
    from fa4.tensors import problem_of

    if pass_ == "fwd":  # _forward(q, k, v, softmax_scale, causal, return_lse, config, out, features...)
        q, k, v, _, causal = args[:5]
        given = tuple(args[8:12])
        wl, wr, cap, sink = given + (-1, -1, 0.0, None)[len(given):]
        return problem_of(q, k, v, causal, window_left=wl, window_right=wr, softcap=cap, sink=sink is not None)
    # _backward(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, config)
    _, q, k, v, _, _, _, causal, deterministic = args[:9]
    return problem_of(q, k, v, causal, "bwd", deterministic)


def _from_env() -> None:
    """FA4_RECORD_SHAPES=path: record the whole program, written when it exits."""
    path = os.environ.get(ENV, "").strip()
    if path and not _active:
        rec = ShapeRecorder(path)
        _active.append(rec)
        atexit.register(rec.write)


_from_env()
