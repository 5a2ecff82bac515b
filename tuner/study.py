"""One Optuna study per (device, provider, problem), with results in the results DB.

The search space is derived from the provider's knob dataclass (one categorical per knob).
The provider's default config is enqueued first, then the served configs of the nearest
measured shapes (warm start); infeasible configs are pruned with their reason (stored as an
"infeasible" measurement); configs that fail to compile, crash or compute wrong results are
pruned with their status and reason too, so only correct, timed configs compete. A config
already measured in the study is not measured again. Re-running the same command resumes the
study until it holds ``trials`` trials.

The results DB is the one store of what a trial measured: Optuna keeps the objective value
its sampler needs and, per trial, only ``measurement_id`` (the row in the results DB) and the
bookkeeping of the run (worker, phases, duplicate_of).

Every trial (and the re-measurement of the winners) is timed in the study's one timing mode
(fa4.timing: eager or CUDA-graph launches, cold or warm L2), recorded on each row; a study of
another mode is another study.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fa4.arch import SM90, Arch, current_arch
from fa4.knobs import (VIOLATION_KINDS, canonical_config, config_from_dict, config_to_dict, iter_configs, knob_specs,
                       search_space, space_size, violation_kind)
from fa4.problem import Problem
from fa4.timing import DEFAULT_TIMING, Timing
from providers import Provider, ProviderError, get_provider
from providers.harness import INFEASIBLE, Settings

from .storage import SURPLUS, fail_stale, heartbeat_interval, masked_storage, open_storage

SAMPLERS = ("tpe", "grid", "random")
DEFAULT_PROVIDER = "fa4"


class TuneError(ValueError):
    """A request the tuner cannot run (bad arguments for this provider): exit code 2."""


class SurplusTrial(Exception):
    """Raised by the objective of a surplus trial: Optuna records it FAIL, the tuner leaves it out."""


class _SurplusFilter(logging.Filter):
    """Drops Optuna's two 'Trial N failed ...' warnings of the surplus trials it is told of."""

    def __init__(self):
        super().__init__()
        self.numbers: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        m = re.match(r"Trial (\d+) failed", record.getMessage())
        return not (m and int(m.group(1)) in self.numbers)


@contextlib.contextmanager
def _quiet_surplus():
    """Optuna logs every caught objective exception as a failed trial; a surplus trial is no failure."""
    log = logging.getLogger("optuna.study._optimize")
    f = _SurplusFilter()
    log.addFilter(f)
    try:
        yield f.numbers
    finally:
        log.removeFilter(f)


# ---- naming and storage ---------------------------------------------------------------


def study_name(device_name: str, provider: str, problem: Problem, timing: str = DEFAULT_TIMING) -> str:
    """The Optuna study of one (device, provider, problem, timing mode); the default mode's names are
    those of studies from before timing modes, so they resume."""
    dev = re.sub(r"\s+", "_", device_name.strip())
    mode = Timing.parse(timing).name
    return f"fa4-tune|{dev}|{provider}|{problem.key()}" + ("" if mode == DEFAULT_TIMING else f"|{mode}")


def default_storage(db_url: str) -> str:
    """A journal file beside a SQLite results DB, else in the user data dir.

    Optuna's journal file storage is safe for several processes on one host (file locks),
    unlike a SQLite RDB storage under concurrent writers.
    """
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        p = Path(url.database)
        return str(p.with_name(p.stem + ".optuna.journal"))
    import platformdirs

    return str(Path(platformdirs.user_data_dir("fa4-tune")) / "optuna.journal")


def make_sampler(kind: str, knob_cls, seed: int, parallel: bool = False, feasible: list[dict] | None = None):
    """The Optuna sampler of ``kind``; with ``feasible`` (the problem's feasible configs) wrapped
    so that it proposes only those, each once (tuner/sampling.py)."""
    import optuna

    from .sampling import FeasibleSampler

    if kind not in SAMPLERS:
        raise TuneError(f"unknown sampler {kind!r} (choose from {', '.join(SAMPLERS)})")
    space = {k: tuple(v) for k, v in search_space(knob_cls).items()} if knob_cls else {}
    if kind == "grid":
        if feasible is not None and knob_cls is not None:
            return FeasibleSampler(None, space, feasible, seed)
        return optuna.samplers.GridSampler({k: list(v) for k, v in space.items()}, seed=seed)
    if kind == "random":
        base = optuna.samplers.RandomSampler(seed=seed)
    else:
        # Tile knobs interact (tile_m x tile_n decide registers), so model them jointly.
        # With several workers on one study, constant_liar makes each one treat the others'
        # running trials as bad results, so they do not all sample the same promising config.
        base = optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, multivariate=True,
                                          constant_liar=parallel)
    if feasible is not None and knob_cls is not None:
        return FeasibleSampler(base, space, feasible, seed)
    return base


def suggest_config(trial, knob_cls):
    values = {s.name: trial.suggest_categorical(s.name, list(s.choices)) for s in knob_specs(knob_cls)}
    return knob_cls(**values)


# ---- request validation ---------------------------------------------------------------


def resolve_provider(spec: str | None) -> Provider:
    """The requested provider, or the default: our kernels, "fa4", on any machine (without a GPU
    it reports their feasible space and compile-checks them); the reference runs when asked."""
    if spec is None:
        spec = DEFAULT_PROVIDER
    try:
        return get_provider(spec)
    except ProviderError as e:
        raise TuneError(str(e)) from None


def check_request(provider: Provider, problem: Problem) -> None:
    errs = provider.problem_errors(problem)
    if errs:
        raise TuneError(f"{provider.name}: {'; '.join(errs)}")


# ---- result ---------------------------------------------------------------------------


@dataclass
class TuneResult:
    study_name: str
    storage: str
    db_url: str
    provider: str
    device: str
    problem: dict
    sampler: str
    trials: int  # finished trials in the study
    measured: int  # trials that ran a measurement (not pruned as infeasible, not duplicates)
    statuses: dict
    resumed_with: int  # finished trials found when this run started
    default: dict | None
    best: dict | None
    speedup: float | None
    stored_measurements: int = 0
    budget: int = 0  # finished trials the study should hold
    failed: int = 0  # trials whose worker died (FAIL); their retries count instead
    best_changes: dict | None = None  # knob -> value where the best config differs from the default
    feasible_configs: int | None = None  # configs of the problem's space that can run (None: no knobs)
    # After the re-measurement of the top configs against the default: the config lookups serve,
    # whether its gain is significant, gain and spread (fractions) and the rounds. None: not
    # re-measured (the default was the study's best, or verification was off).
    served: dict | None = None
    out_of_time: bool = False  # the time budget (--budget-s) ended the study before its trials
    # Configs enqueued after the default from the nearest measured shapes, as
    # {"config": knob dict, "from": problem key}; empty when the study was resumed or none fit.
    warm_start: list | None = None
    timing: str = DEFAULT_TIMING  # the mode every trial was timed in (fa4.timing)
    wall_s: float | None = None  # seconds this run of the study took, verification included

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _trial_summary(provider: Provider, problem: Problem, trial, row: dict | None) -> dict:
    """A trial as the report shows it; ``row`` is its measurement in the results DB."""
    cfg = provider.config_from_dict(problem, trial.params) if trial.params else None
    row = row or {}
    return {
        "trial": trial.number,
        "config": dict(trial.params),
        "label": provider.describe(cfg),
        "status": row.get("status"),
        "reason": row.get("reason"),
        "tflops": row.get("tflops"),
        "median_ms": row.get("median_ms"),
        "iqr_ms": row.get("iqr_ms"),
        "error": row.get("error"),
    }


# ---- the tuner ------------------------------------------------------------------------


_FEASIBLE: dict[tuple, list[dict]] = {}  # (provider spec, problem key, arch) -> feasible knob dicts


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


class Tuner:
    def __init__(
        self,
        provider: Provider | str,
        problem: Problem,
        *,
        store,
        storage: str | None = None,
        sampler: str = "tpe",
        trials: int = 40,
        settings: Settings | None = None,
        runner=None,
        seed: int = 0,
        provider_spec: str | None = None,
        worker: str | None = None,
        parallel: bool = False,
        heartbeat_s: int | None = None,
        verify_rounds: int = 7,
        verify_top: int = 3,
        deadline: float | None = None,
        warm_neighbours: int = 3,
        timing: str | None = None,
    ):
        if isinstance(provider, str):
            provider_spec, provider = provider, resolve_provider(provider)
        self.provider = provider
        # Workers rebuild the provider from this string.
        self.spec = provider_spec or getattr(provider, "spec", None) or provider.name
        self.problem = problem
        self.store = store
        self.storage_spec = storage or default_storage(store.url)
        self.sampler_kind = sampler
        self.trials = trials
        # The timing mode: ``timing`` when given (it overrides the settings'), else the settings'.
        self.settings = settings or Settings()
        if timing is not None:
            from dataclasses import replace

            self.settings = replace(self.settings, timing=Timing.parse(timing).name)
        self.timing = self.settings.timing
        self.seed = seed
        self.worker = worker  # a label stored with each trial (which GPU / host ran it)
        self.parallel = parallel  # other workers may run trials of the same study
        self.heartbeat_s = heartbeat_s
        # Re-measure the top configs against the default before a challenger is served
        # (tuner/verify.py); 0 rounds serves the study's fastest row as it is.
        self.verify_rounds = verify_rounds
        self.verify_top = verify_top
        self.verdict: dict | None = None
        # time.time() after which no trial is started (--budget-s); the verification of what
        # was measured still runs, so a cut study never serves a noise winner.
        self.deadline = deadline
        self.out_of_time = False
        # Nearest measured shapes whose served configs a new study tries right after the default.
        self.warm_neighbours = warm_neighbours
        self.warm_start: list[dict] = []
        self._runner = runner
        check_request(provider, problem)
        why = provider.available()
        if why:
            raise TuneError(f"{provider.name} is not available: {why}")
        if provider.needs_gpu:
            arch = current_arch()
            if arch is None:
                raise TuneError("timing needs a CUDA GPU")
            from .device import cuda_device_info

            self.arch: Arch = arch
            self.device_info = cuda_device_info(provider.versions())
        else:
            self.arch = provider.arch()
            self.device_info = provider.device_info()
            self.device_info["provider_versions"] = provider.versions()
        self.knob_cls = provider.knob_cls_for(problem)
        self.default_config = provider.default_config(problem, self.arch)
        self.default_dict = provider.config_to_dict(self.default_config)
        self.name = study_name(self.device_info["name"], provider.name, problem, self.timing)
        self.fingerprint = provider.source_fingerprint()
        self.stored = 0

    # -- helpers -------------------------------------------------------------------
    def _runner_or_new(self):
        if self._runner is None:
            from .worker import IsolatedRunner

            self._runner = IsolatedRunner()
            self._own_runner = True
        return self._runner

    def _store_measurement(self, config_dict, trial_number, m_status, **kw) -> int:
        config_id = self.store.upsert_config(self.provider.name, config_dict, self.knob_cls)
        mid = self.store.add_measurement(
            self.device_id, self.problem_id, config_id,
            status=m_status,
            source_fingerprint=self.fingerprint,
            study_name=self.name,
            trial_number=trial_number,
            is_default=(config_dict == self.default_dict),
            versions=self.device_info.get("provider_versions"),
            timing=self.timing,
            **kw,
        )
        self.stored += 1
        return mid

    def trial_row(self, trial) -> dict | None:
        """The trial's measurement in the results DB (None: it stored none, e.g. its worker died)."""
        mid = trial.user_attrs.get("measurement_id")
        return None if mid is None else self.store.get_measurement(mid)

    def _canon(self, params: dict | None) -> dict | None:
        """A config dict with the knobs that have no effect in it at their defaults
        (fa4.knobs.canonical_config): two names of one kernel and launch compare equal."""
        if self.knob_cls is None or not params:
            return params
        key = tuple(sorted(params.items()))
        cache = self.__dict__.setdefault("_canon_cache", {})
        if key not in cache:
            try:
                cache[key] = config_to_dict(canonical_config(config_from_dict(self.knob_cls, params)))
            except (TypeError, ValueError):  # not a whole config of this class: compared as it is
                cache[key] = params
        return cache[key]

    def _previous(self, study, params: dict):
        """An answered trial of the same config (or another name of its kernel and launch)."""
        import optuna

        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        want = self._canon(params)
        for t in study.get_trials(deepcopy=False, states=states):
            if "measurement_id" in t.user_attrs and self._canon(t.params) == want:
                return t
        return None

    def _objective(self, study):
        import optuna

        def objective(trial):
            if self._surplus(study, trial):
                # Another worker took the study's last trial between this one's count and its
                # start: measure nothing, and let the study's counts leave this trial out.
                trial.set_user_attr(SURPLUS, True)
                self._surplus_numbers.add(trial.number)
                raise SurplusTrial(f"trial {trial.number}: the study was full when it started")
            config = suggest_config(trial, self.knob_cls) if self.knob_cls else None
            if config is not None and self._held_elsewhere(study, trial):
                trial.set_user_attr(SURPLUS, True)
                self._surplus_numbers.add(trial.number)
                raise SurplusTrial(f"trial {trial.number}: its config is another trial's")
            cdict = self.provider.config_to_dict(config)
            if self.worker:
                trial.set_user_attr("worker", self.worker)
            prev = self._previous(study, trial.params)
            if prev is not None:
                # The same config answered already: point at its row, measure nothing.
                trial.set_user_attr("measurement_id", prev.user_attrs["measurement_id"])
                trial.set_user_attr("duplicate_of", prev.number)
                if prev.state == optuna.trial.TrialState.COMPLETE:
                    return prev.value
                raise optuna.TrialPruned((self.trial_row(prev) or {}).get("reason") or "")
            reasons = self.provider.violations(config, self.problem, self.arch)
            if reasons:
                reason = "; ".join(reasons)
                mid = self._store_measurement(cdict, trial.number, INFEASIBLE, reason=reason)
                trial.set_user_attr("measurement_id", mid)
                raise optuna.TrialPruned(reason)
            m = self._runner_or_new().run(self.spec, self.problem, cdict, self.settings)
            mid = self._store_measurement(
                cdict, trial.number, m.status, reason=m.reason, samples_ms=m.samples_ms,
                median_ms=m.median_ms, iqr_ms=m.iqr_ms, tflops=m.tflops, error=m.error,
                ref_error=m.ref_error,
            )
            trial.set_user_attr("measurement_id", mid)
            trial.set_user_attr("phases", m.phases)  # where the tuner's time went, not a result
            if not m.ok:
                raise optuna.TrialPruned(f"{m.status}: {m.reason}")
            return m.tflops

        return objective

    # -- main ----------------------------------------------------------------------
    def open_study(self):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return optuna.create_study(
            study_name=self.name,
            storage=open_storage(self.storage_spec, self.heartbeat_s),
            sampler=make_sampler(self.sampler_kind, self.knob_cls, self.seed, self.parallel, self.feasible()),
            direction="maximize",
            load_if_exists=True,
        )

    def budget(self) -> int:
        """Finished trials a full study holds: ``trials``, or every feasible config when the
        problem has fewer (the sampler proposes nothing else)."""
        if self.knob_cls is None:
            return 1
        return min(self.trials, len(self.feasible()))

    def feasible(self) -> list[dict] | None:
        """The problem's feasible configs (knob dicts), computed once per study."""
        if self.knob_cls is None:
            return None
        if not hasattr(self, "_feasible"):
            # Enumerating a space takes seconds (the hd128 forward's 322,560 configs for a problem
            # without softcap, of 1,843,200 declared: 7 s on a loaded 2-core machine), and a fleet
            # worker opens each study twice: once per process and (provider, problem, arch).
            key = (self.spec, self.problem.key(), self.arch.name)
            if key not in _FEASIBLE:
                _FEASIBLE[key] = [self.provider.config_to_dict(c)
                                  for c in self.provider.feasible_configs(self.problem, self.arch)]
            self._feasible = _FEASIBLE[key]
            if not self._feasible:
                raise TuneError(f"{self.provider.name}: no config of the search space can run "
                                f"{self.problem.key()} on {self.arch.name}")
        return self._feasible

    def _surplus(self, study, trial) -> bool:
        """Whether ``trial`` starts after the study's budget is taken.

        Two workers may both count one trial left and both start one (a trial is created only
        after the count). Trial numbers decide it: the storage numbers a study's trials in the
        order it inserts them, so every trial numbered below this one is visible to this check,
        and a trial numbered above it, inserted later, sees this one at its own check. The
        trials numbered below, answered, running or queued to run (an enqueued trial is
        numbered when queued and taken later), fill the budget or not; of two racing trials
        exactly one is surplus. (Start times decided it before: each process stamps its trial
        before the insert, so a trial inserted second could carry the earlier stamp, and two
        workers that each checked before the other's insert both went on: 6 trials of 5 in the
        fleet test on two fake GPUs, session 34's CI.)
        """
        import optuna

        S = optuna.trial.TrialState
        earlier = sum(1 for t in study.get_trials(deepcopy=False, states=(S.COMPLETE, S.PRUNED, S.RUNNING, S.WAITING))
                      if t.number < trial.number and not t.user_attrs.get(SURPLUS))
        return earlier >= (1 if self.knob_cls is None else self.trials)

    def _left(self, study) -> tuple[int, int, int]:
        """(trials still worth starting, answered trials, running trials).

        Answered = completed or pruned. FAIL trials (their worker died) do not count: their
        retries do. Running trials count as taken, whoever runs them. Worth starting are the
        enqueued trials (the default, warm starts, retries) and the feasible configs no trial
        holds, exactly what the sampler can still propose: a worker that counted more would
        start trials the sampler can only answer with a taken config.
        """
        import optuna

        S = optuna.trial.TrialState
        trials = [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get(SURPLUS)]
        answered = [t for t in trials if t.state in (S.COMPLETE, S.PRUNED)]
        running = [t for t in trials if t.state == S.RUNNING]
        left = (1 if self.knob_cls is None else self.trials) - len(answered) - len(running)
        if self.deadline is not None and time.time() >= self.deadline and answered:
            self.out_of_time = left > 0
            left = 0
        if self.knob_cls is not None:
            from .sampling import trial_config

            if not hasattr(self, "_feasible_keys"):
                self._feasible_keys = {_key(c) for c in self.feasible()}
            n = len(knob_specs(self.knob_cls))
            held = {_key(c) for c in (trial_config(t, n) for t in trials) if c is not None}
            waiting = sum(1 for t in trials if t.state == S.WAITING)
            left = min(left, waiting + len(self._feasible_keys - held))
        return left, len(answered), len(running)

    @staticmethod
    def _held_elsewhere(study, trial) -> bool:
        """Whether another answered or running trial holds ``trial``'s config (its parameters set).

        Two workers that both counted one config left start two trials, and the sampler can
        give the second only a taken config; two enqueued copies of one config run twice. Such
        a trial measures nothing. Where two running trials hold one config, each may see the
        other and both step back; the config is then free again and proposed anew, never lost.
        A FAIL trial's retry holds what the failed trial held: FAIL trials are not counted.
        """
        import optuna

        S = optuna.trial.TrialState
        return any(t.number != trial.number and t.params == trial.params and not t.user_attrs.get(SURPLUS)
                   for t in study.get_trials(deepcopy=False, states=(S.COMPLETE, S.PRUNED, S.RUNNING)))

    def run(self, on_trial: Callable | None = None, on_start: Callable | None = None,
            wait: bool = True) -> TuneResult:
        """Run trials until the study holds ``trials`` finished ones (completed or pruned).

        Other processes may work on the same study at the same time (``fa4-tune --devices``,
        several hosts on one PostgreSQL storage): each takes trials until finished plus
        running ones fill the budget. Trials of dead workers are failed and retried through
        the storage's heartbeats. With ``wait``, the call returns only when the study is
        full (it waits for other workers' running trials and takes over retries of dead
        ones); without, it returns as soon as nothing is left for it to start.
        """
        started = time.perf_counter()
        if self._runner is None and self.provider.needs_gpu:
            # Start the measuring process now: it loads the provider and makes its CUDA
            # context while the study is opened and the default trial enqueued.
            self._runner_or_new().prestart(self.spec)
        self.device_id = self.store.upsert_device(self.device_info)
        self.problem_id = self.store.upsert_problem(self.problem)
        study = self.open_study()
        before = None
        callbacks = []
        if on_trial:
            callbacks.append(lambda st, tr: on_trial(self, st, tr))
        callbacks.append(lambda st, tr: st.stop() if self._left(st)[0] <= 0 else None)
        try:
            while True:
                fail_stale(study)
                left, done, running = self._left(study)
                if before is None:
                    before = done
                    if left > 0:
                        self._enqueue_default(study)
                        if done == 0 and running == 0:
                            self._enqueue_warm_start(study)
                    if on_start:
                        on_start(self, max(0, left), before)
                if left > 0:
                    with _quiet_surplus() as self._surplus_numbers:
                        study.optimize(self._objective(study), n_trials=left, callbacks=callbacks,
                                       catch=(SurplusTrial,))
                    continue
                if not wait or running == 0 or self.out_of_time:
                    break
                # Others are still running trials of this study: wait for them, or for
                # their heartbeats to go stale, whichever comes first.
                time.sleep(min(2.0, heartbeat_interval(self.heartbeat_s) / 2))
            if wait and self.verify_rounds > 0:
                self.verdict = self._verify(study)
        finally:
            if getattr(self, "_own_runner", False):
                self._runner.close()
                self._runner = None
        res = self.result(study, before or 0)
        res.wall_s = round(time.perf_counter() - started, 2)
        return res

    def _verify(self, study) -> dict | None:
        """Re-measure the study's best configs beside the default and record which one lookups
        serve (tuner/verify.py). None when there is nothing to decide: the default is the
        study's best, or it has no successful measurement to compare with."""
        import optuna

        from .verify import judge, remeasure

        done = [t for t in study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
        default = next((t for t in done if t.params == (self.default_dict or {})), None)
        ranked = sorted((t for t in done if t is not default), key=lambda t: (-t.value, t.number))
        if default is None or not ranked or ranked[0].value <= default.value:
            return None
        top = [default] + ranked[: self.verify_top]
        prior = self.store.verdict(self.device_info["name"], self.provider.name, self.problem,
                                   source_fingerprint=self.fingerprint, timing=self.timing)
        configs = [dict(t.params) for t in top]
        if prior is not None and prior["study_name"] == self.name and prior["rounds"]["configs"] == configs:
            return prior  # this study's candidates were judged already (a resumed, full study)
        tflops, order, failed = remeasure(self._runner_or_new(), self.spec, self.problem, configs,
                                          self.settings, self.verify_rounds)
        j = judge(tflops, failed)
        rows = {r["trial_number"]: r["id"] for r in self.store.measurements(study_name=self.name, status="ok")}
        served = top[j.winner]
        if served.number not in rows:
            return None
        # Re-measured in the study's timing mode (self.settings carries it), so its verdict is of that mode.
        # The gain shown: the winner's, or where the default stays, the closest challenger's.
        shown = j.winner if j.significant else max(range(1, len(top)), key=lambda i: (j.gains[i], -i))
        verdict = {
            "significant": j.significant, "gain": j.gains[shown], "spread": j.spreads[shown],
            "rounds": {"configs": configs, "trials": [t.number for t in top], "tflops": tflops, "order": order,
                       "gains": j.gains, "spreads": j.spreads, "failed": j.failed, "winner": j.winner},
        }
        verdict["id"] = self.store.add_verdict(
            self.device_id, self.problem_id, self.provider.name, measurement_id=rows[served.number],
            study_name=self.name, source_fingerprint=self.fingerprint, timing=self.timing, **verdict)
        verdict["study_name"] = self.name
        return verdict

    @staticmethod
    def _queued_or_tried(study) -> set[str]:
        """The configs (as _key) of the study's trials that are answered, running or waiting to run.

        A WAITING enqueued trial has no params yet: its config is in the fixed_params system
        attribute (missed, a fleet worker's second pass enqueued the default twice). Another
        worker may have enqueued a config a moment before: a second copy would be a duplicate
        trial, one measured config fewer."""
        import optuna

        S = optuna.trial.TrialState
        return {_key(t.params or t.system_attrs.get("fixed_params") or {})
                for t in study.get_trials(deepcopy=False, states=(S.COMPLETE, S.PRUNED, S.RUNNING, S.WAITING))}

    def _enqueue_default(self, study) -> None:
        if self.default_dict is not None and _key(self.default_dict) not in self._queued_or_tried(study):
            study.enqueue_trial(self.default_dict, user_attrs={"enqueued_default": True})

    def _enqueue_warm_start(self, study) -> None:
        """A new study's next trials after the default: the configs lookups serve for the
        nearest measured shapes (same device, provider and problem family: pass, head dims,
        dtype, causal, deterministic), where feasible here and not the default."""
        if self.knob_cls is None or self.warm_neighbours <= 0 or not isinstance(self.problem, Problem):
            return  # decode problems have no attention family to borrow from
        from store.best import neighbour_configs

        feasible = {_key(c) for c in self.feasible()}
        present = self._queued_or_tried(study)  # the default among them, enqueued just before
        for hit in neighbour_configs(self.store, self.provider, self.device_info["name"], self.problem,
                                     running_fp=self.fingerprint, arch=self.arch, limit=self.warm_neighbours,
                                     timing=self.timing):
            key = _key(hit["config"])
            if key not in feasible or key in present:
                continue
            present.add(key)
            study.enqueue_trial(hit["config"], user_attrs={"warm_start_from": hit["from"]})
            self.warm_start.append({"config": hit["config"], "from": hit["from"]})

    def _changes(self, config: dict) -> dict:
        """The knobs ``config`` sets otherwise than the default, those without effect in it left out."""
        canon, default = self._canon(config) or {}, self.default_dict or {}
        return {k: v for k, v in config.items() if default.get(k) != v and canon.get(k) == v}

    def result(self, study, before: int = 0) -> TuneResult:
        import optuna

        trials = [t for t in study.get_trials(deepcopy=False)
                  if t.state.is_finished() and not t.user_attrs.get(SURPLUS)]
        # What each trial measured, from the results DB (the one store of results).
        by_id = {r["id"]: r for r in self.store.measurements(study_name=self.name)}

        def fetch(t) -> dict | None:
            mid = t.user_attrs.get("measurement_id")
            return None if mid is None else by_id.get(mid) or self.store.get_measurement(mid)

        own = [t for t in trials if "duplicate_of" not in t.user_attrs]
        rows = {t.number: fetch(t) for t in own}

        def row(t) -> dict | None:
            return rows.get(t.number)

        # A trial whose worker died (marked FAIL by the heartbeat, retried elsewhere) never
        # stored a row of its own.
        statuses = collections.Counter(
            (row(t) or {}).get("status") or ("worker_died" if t.state == optuna.trial.TrialState.FAIL else "unknown")
            for t in own
        )
        measured = sum(1 for r in rows.values() if r is not None and r["status"] != INFEASIBLE)
        default = None
        for t in own:
            if t.params == (self.default_dict or {}):
                default = _trial_summary(self.provider, self.problem, t, row(t))
                break
        complete = [t for t in own if t.state == optuna.trial.TrialState.COMPLETE]
        best = None
        if complete:
            bt = max(complete, key=lambda t: (t.value, -t.number))
            best = _trial_summary(self.provider, self.problem, bt, row(bt))
        speedup = None
        if best and default and default.get("tflops"):
            speedup = best["tflops"] / default["tflops"]
        # The best config as what it changes: a full knob list hides the one knob that won.
        changes = None
        if best is not None and self.default_dict is not None:
            changes = self._changes(best["config"])
        served = None  # what lookups serve once the study's winners were re-measured
        if self.verdict is not None:
            cfg = self.verdict["rounds"]["configs"][self.verdict["rounds"]["winner"]]
            served = {
                "config": cfg, "significant": self.verdict["significant"], "gain": self.verdict["gain"],
                "spread": self.verdict["spread"], "rounds": len(self.verdict["rounds"]["tflops"]),
                "changes": self._changes(cfg),
            }
        return TuneResult(
            study_name=self.name,
            storage=masked_storage(self.storage_spec),
            db_url=self.store.url,
            provider=self.provider.name,
            device=self.device_info["name"],
            problem=self.problem.to_dict(),
            sampler=self.sampler_kind,
            trials=len(trials),
            measured=measured,
            statuses=dict(statuses),
            resumed_with=before,
            default=default,
            best=best,
            speedup=speedup,
            stored_measurements=self.stored,
            budget=self.budget(),
            failed=sum(1 for t in trials if t.state == optuna.trial.TrialState.FAIL),
            best_changes=changes,
            feasible_configs=None if self.knob_cls is None else len(self.feasible()),
            served=served,
            out_of_time=self.out_of_time,
            warm_start=self.warm_start,
            timing=self.timing,
        )


# ---- without a GPU --------------------------------------------------------------------


def check_without_gpu(provider: Provider, problem: Problem, arch: Arch = SM90, compile_configs: bool = True,
                      compile_limit: int | None = None) -> dict:
    """Everything that runs without a GPU: feasibility of every config of the problem's space, compile-only
    where possible. The problem's space is what a study samples (fa4.knobs.iter_configs with the
    problem): a knob that does not apply to the problem at its default only, no config in which a
    changed knob has no effect; ``space`` is the declaration's whole size."""
    cls = provider.knob_cls_for(problem)
    configs = list(iter_configs(cls, problem)) if cls is not None else [None]
    # A config may break several rules: each kind counts the configs it rejects (so the counts
    # add up to more than the infeasible total), "only" those it alone rejects.
    feasible, infeasible, alone = [], collections.Counter(), collections.Counter()
    examples = {}
    for c in configs:
        v = provider.violations(c, problem, arch)
        if v:
            kinds = {violation_kind(r): r for r in v}
            for kind, r in kinds.items():
                infeasible[kind] += 1
                examples.setdefault(kind, r)
            if len(kinds) == 1:
                alone[next(iter(kinds))] += 1
        else:
            feasible.append(c)
    order = {k: i for i, k in enumerate(VIOLATION_KINDS)}
    default = provider.default_config(problem, arch)
    out = {
        "provider": provider.name,
        "arch": arch.name,
        "problem": problem.to_dict(),
        "space": space_size(cls) if cls is not None else 1,
        "configs": len(configs),
        "feasible": len(feasible),
        "infeasible": len(configs) - len(feasible),
        "infeasible_reasons": {
            k: {"count": infeasible[k], "only": alone[k], "example": str(examples[k])}
            for k in sorted(infeasible, key=lambda k: (order.get(k, len(order)), k))
        },
        "default": {
            "config": provider.config_to_dict(default),
            "label": provider.describe(default),
            "violations": provider.violations(default, problem, arch),
        },
        "compile": None,
        "timing": "timing needs a CUDA GPU: nothing was measured or stored",
    }
    why = provider.compile_available()
    if not compile_configs:
        out["compile"] = {"skipped": "not requested"}
    elif why:
        out["compile"] = {"skipped": f"{provider.name} cannot compile here: {why}"}
    elif not provider.supports_compile_only(problem):
        out["compile"] = {"skipped": f"{provider.name} has no compile-only path"}
    else:
        # Configs that differ only in runtime knobs share one compiled kernel: compile each
        # distinct kernel once, the default's first, up to compile_limit of them.
        variants = {}
        for c in [default, *feasible]:
            variants.setdefault(provider.compile_variant(problem, c), c)
        todo = list(variants.values())
        if compile_limit is not None:
            todo = todo[:compile_limit]
        results = {"ok": 0, "errors": [], "distinct_kernels": len(variants), "compiled": len(todo)}
        for c in todo:
            err = provider.compile_only(problem, c, arch)
            if err is None:
                results["ok"] += 1
            else:
                results["errors"].append({"config": provider.config_to_dict(c), "error": err})
        out["compile"] = results
    return out


__all__ = [
    "SAMPLERS", "TuneError", "TuneResult", "Tuner", "check_request", "check_without_gpu",
    "default_storage", "make_sampler", "open_storage", "resolve_provider", "study_name",
]
