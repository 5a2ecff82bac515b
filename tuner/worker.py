"""Candidate isolation: measurements run in a separate, restartable process.

A CUDA error such as an illegal address is sticky: every later call in that process fails.
So candidates run in a long-lived worker (spawned, never forked, so it gets its own CUDA
context) and the parent restarts it after a crash, a timeout or a sticky CUDA failure. The
failed candidate is recorded with its reason and the study goes on.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
import traceback

from fa4.decode_problem import problem_from_dict
from fa4.problem import Problem

from providers.harness import RUNTIME_ERROR, Measurement, Settings, is_sticky_cuda_failure


CLOSE_GRACE_S = 1.0


def die_with_parent(parent_pid: int | None) -> None:
    """Linux: get SIGKILL when the parent dies, so no orphan keeps timing on a GPU.

    A timing process whose parent was killed would go on using the GPU while the parent's
    GPU lock is gone, and a new worker could then share the GPU with it.
    """
    import os

    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent_pid is not None and os.getppid() != parent_pid:  # gone before prctl took effect
        os._exit(1)


def _serve(conn) -> None:
    from providers import get_provider

    parent = mp.parent_process()
    die_with_parent(parent.pid if parent is not None else None)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            # Asked to stop: every result went back over the pipe, so skip the interpreter's
            # teardown (CUDA context, compiler libraries, atexit hooks; seconds with a real
            # provider, which close() would otherwise wait out to its grace and then SIGKILL).
            conn.close()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        if "warm" in msg:
            t0 = time.perf_counter()
            try:
                get_provider(msg["warm"]).warmup()
                conn.send({"warm": "ok", "s": time.perf_counter() - t0})
            except Exception as e:  # the first real measurement reports the failure
                conn.send({"warm": f"{type(e).__name__}: {e}"[:300], "s": time.perf_counter() - t0})
            continue
        try:
            provider = get_provider(msg["provider"])
            problem = problem_from_dict(msg["problem"])
            config = provider.config_from_dict(problem, msg["config"])
            m = provider.measure(problem, config, Settings.from_dict(msg["settings"]))
        except Exception as e:  # a provider bug must not kill the worker silently
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            m = Measurement(RUNTIME_ERROR, reason=f"worker: {tb}"[:300])
        conn.send(m.to_dict())
        if is_sticky_cuda_failure(m):
            return  # the CUDA context is poisoned: let the parent start a fresh process


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class IsolatedRunner:
    """Runs measurements in a worker process, restarting it whenever it cannot be trusted."""

    def __init__(self, timeout_s: float | None = None):
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self.timeout_s = timeout_s
        self.restarts = 0  # workers started after the first one
        self._started = False
        self._warming = False  # a warm-up reply is still to be read before the next result
        self.warm_result: str | None = None
        self.warm_s: float | None = None  # how long the measuring process took to warm up

    def _start(self) -> None:
        if self._started:
            self.restarts += 1
        self._started = True
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child,), daemon=True, name="fa4-tune-worker")
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    def _ensure_started(self) -> None:
        """A live measuring process, replacing one that died."""
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self._stop(kill=True)
            self._start()

    def prestart(self, provider: str) -> None:
        """Start the measuring process now and let it import and initialize the provider while
        the caller does other work (opening studies), instead of on the first trial's clock."""
        self._ensure_started()
        try:
            self._conn.send({"warm": provider})
            self._warming = True
        except (BrokenPipeError, OSError):
            self._stop(kill=True)

    def _finish_warmup(self, timeout: float) -> None:
        if not self._warming:
            return
        self._warming = False
        if self._conn.poll(timeout):
            reply = self._conn.recv()
            self.warm_result, self.warm_s = reply.get("warm"), reply.get("s")
        else:
            # Warm-up hangs: start over; the real request then runs in a fresh process.
            self.warm_result = f"no warm-up reply within {timeout:g} s"
            self._stop(kill=True)

    def _stop(self, kill: bool, grace_s: float = 10.0) -> None:
        if self._proc is None:
            return
        if kill:
            self._proc.kill()
        else:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self._proc.join(timeout=grace_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
        self._proc = self._conn = None
        self._warming = False

    def run(self, provider: str, problem: Problem, config: dict | None, settings: Settings) -> Measurement:
        timeout = self.timeout_s if self.timeout_s is not None else settings.timeout_s
        if self._warming:
            try:
                self._finish_warmup(timeout)
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
                self._warming = False
                self._stop(kill=True)
        self._ensure_started()
        msg = {"provider": provider, "problem": problem.to_dict(), "config": config, "settings": settings.to_dict()}
        try:
            self._conn.send(msg)
            if not self._conn.poll(timeout):
                self._stop(kill=True)
                return Measurement(RUNTIME_ERROR, reason=f"timed out after {timeout:g} s (worker killed)")
            m = Measurement.from_dict(self._conn.recv())
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self._proc.join(timeout=10)
            why = _describe_exit(self._proc.exitcode)
            self._stop(kill=True)
            return Measurement(RUNTIME_ERROR, reason=f"worker process died ({why})")
        if is_sticky_cuda_failure(m):
            self._stop(kill=False)
        return m

    def close(self) -> None:
        # The measuring process exits at once when asked (no teardown); the grace and SIGKILL
        # are for one that is stuck in a measurement.
        self._stop(kill=False, grace_s=CLOSE_GRACE_S)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class InProcessRunner:
    """Same interface without isolation, for providers that never touch a GPU (replay) in tests."""

    def run(self, provider: str, problem: Problem, config: dict | None, settings: Settings) -> Measurement:
        from providers import get_provider

        p = get_provider(provider)
        try:
            return p.measure(problem, p.config_from_dict(problem, config), settings)
        except Exception as e:
            return Measurement(RUNTIME_ERROR, reason=f"{type(e).__name__}: {e}"[:300])

    def close(self) -> None:
        pass
