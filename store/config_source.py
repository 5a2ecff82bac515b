"""The results store as a config source of the kernels' launch-time lookup.

fa4 never imports the store: it finds this source through the ``fa4.config_sources`` entry
point that fa4-tune's distribution declares (pyproject.toml), and asks it for the best
measurement of a problem. Opening the database is deferred to the first question and never
creates one: a kernel launch must not leave files behind.
"""

from __future__ import annotations

import os
from pathlib import Path

from fa4.decode_problem import DecodeProblem
from fa4.lookup import DECODE_PROVIDER, SourceAnswer
from fa4.problem import Problem
from fa4.rules import Fa4DecodeRules, Fa4Rules
from fa4.timing import DEFAULT_TIMING
from store.best import best_config, provider_speeds

PROVIDER = "fa4"


class LocalResultsDB:
    """The local results DB ($FA4_DB, else the default file when it exists)."""

    name = "local-db"

    def __init__(self):
        self._store = None
        self._error: str | None = None
        self._opened = False

    def _open(self):
        if self._opened:
            return self._store, self._error
        self._opened = True
        try:
            from store import ResultsStore
            from store.engine import ENV_VAR, default_url, resolve_url, sqlite_file

            explicit = os.environ.get(ENV_VAR, "").strip()
            url = resolve_url(explicit or default_url())
            path = sqlite_file(url)
            if not explicit and (path is None or not Path(path).is_file()):
                self._error = f"no local results DB (set {ENV_VAR}, or run fa4-tune)"
            elif path is not None and not Path(path).is_file():
                self._error = f"{ENV_VAR} names {path}, which does not exist"
            else:
                self._store = ResultsStore.open(url)
        except Exception as e:
            self._error = f"cannot open the local results DB: {type(e).__name__}: {e}"
        return self._store, self._error

    def answer(self, problem: Problem, device: str, fingerprint: str, timing: str = DEFAULT_TIMING) -> SourceAnswer:
        """The best measurement of ``timing``'s mode (fa4.timing) only: another mode's never answers."""
        store, why = self._open()
        if store is None:
            return SourceAnswer("skipped", why or "")
        if isinstance(problem, DecodeProblem):
            return self._decode_answer(store, problem, device, fingerprint, timing)
        try:
            # The service's rule, on the same rows: the same answer wherever a kernel asks.
            ans = best_config(store, Fa4Rules(), device, problem, running_fp=fingerprint, timing=timing)
        except Exception as e:
            return SourceAnswer("error", f"{type(e).__name__}: {e}")
        notes = "; ".join(ans["notes"])
        if ans["provenance"] == "default":
            return SourceAnswer("miss", f"no usable {timing} measurement of {problem.key()} on {device!r}: {notes}")
        ref = f"measurement {ans['measurement_id']}"
        what = f"{ans['provenance']}{' (stale source)' if ans['stale'] else ''}"
        return SourceAnswer("used", f"{what} {timing} answer, {ref} ({ans['tflops']:.1f} TFLOP/s) in {store.url}"
                            + (f"; {notes}" if notes else ""),
                            config=ans["config"], ref=ref, tflops=ans["tflops"],
                            measured_problem=ans["measured_problem"])

    def _decode_answer(self, store, problem: DecodeProblem, device: str, fingerprint: str,
                       timing: str) -> SourceAnswer:
        """A decode problem, by the rule GET /v1/configs/best-decode answers with: its exact shape's
        served row (the verdict's, else the fastest) of the running kernel source, no nearest shape."""
        try:
            ans = best_config(store, Fa4DecodeRules(), device, problem, running_fp=fingerprint, timing=timing)
        except Exception as e:
            return SourceAnswer("error", f"{type(e).__name__}: {e}")
        notes = "; ".join(ans["notes"])
        if ans["provenance"] != "exact":
            return SourceAnswer("miss", f"no usable {timing} measurement of {DECODE_PROVIDER} on {problem.key()} on "
                                        f"{device!r} from kernel source {fingerprint!r}: {notes}")
        ref = f"measurement {ans['measurement_id']}"
        verdict = ans["verdict"]
        how = "" if verdict is None else (", verdict: " + (
            f"{verdict['gain']:+.1%} over the default" if verdict["significant"] else "the default kept"))
        return SourceAnswer("used", f"exact {timing} answer, {ref} ({ans['tflops']:.3f} TB/s){how} in {store.url}"
                            + (f"; {notes}" if notes else ""),
                            config=ans["config"], ref=ref, tflops=ans["tflops"],
                            measured_problem=ans["measured_problem"])

    def speeds(self, problem: Problem, device: str, fingerprint: str, timing: str, providers) -> dict:
        """Measured speed of each provider's plain call on this exact problem (fa4's provider="auto")."""
        store, why = self._open()
        if store is None:
            raise LookupError(why or "no local results DB")
        return provider_speeds(store, device, problem, providers, running_fp=fingerprint, timing=timing)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
