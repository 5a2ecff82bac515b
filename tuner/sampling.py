"""Samplers that propose only feasible configs the study has not tried.

A problem's space is finite and `violations()` says which of its points can run, so a trial
spent on an infeasible config measures nothing: on the H200 a 40-trial study of our forward
at S8k hd128 spent 13 trials on configs the feasibility check rejects, and the backward's
deterministic studies most of theirs. The samplers here wrap Optuna's: the wrapped sampler
proposes a full config as usual (TPE's model of what is fast keeps guiding the search), and
when that point is infeasible or already tried, the nearest feasible untried config (fewest
knobs changed, ties drawn at random) is taken instead. TPE's start-up trials, which it draws
independently per knob, are drawn uniformly from the feasible untried configs.
"""

from __future__ import annotations

import numpy as np
from optuna.distributions import CategoricalDistribution
from optuna.samplers import BaseSampler

from .storage import SURPLUS

CLAIM = "fa4_claimed_config"  # trial system attribute: the config a running trial will measure


def trial_config(t, n_knobs: int) -> dict | None:
    """The config trial ``t`` holds, in whatever state: its parameters once all are set, before
    that its claim (a running trial's pick) or its fixed parameters (an enqueued one); None for
    a surplus trial, which holds nothing. The sampler's "tried" and the tuner's "left to start"
    both read it, so what one proposes the other counts."""
    if t.user_attrs.get(SURPLUS):
        return None
    if len(t.params) == n_knobs:
        return t.params
    return t.system_attrs.get(CLAIM) or t.system_attrs.get("fixed_params") or None


class FeasibleSampler(BaseSampler):
    """Proposes only configs in ``feasible`` (knob-name -> value dicts) not yet in the study.

    ``base`` is the Optuna sampler whose proposals are followed; ``None`` walks the feasible
    configs in a seeded order (the grid: every feasible config once, no infeasible one).
    """

    def __init__(self, base: BaseSampler | None, space: dict[str, tuple], feasible: list[dict], seed: int = 0):
        if not feasible:
            raise ValueError("no feasible config to sample from")
        self._base = base
        self._names = list(space)
        self._space = {n: CategoricalDistribution(list(c)) for n, c in space.items()}
        index = {n: {v: i for i, v in enumerate(c)} for n, c in space.items()}
        self._index = index
        # configs x knobs, each value as its choice index: distances are one vectorised compare.
        self._codes = np.array([[index[n][cfg[n]] for n in self._names] for cfg in feasible], dtype=np.int32)
        self._feasible = [dict(c) for c in feasible]
        self._row = {tuple(r): i for i, r in enumerate(self._codes.tolist())}
        self._rng = np.random.RandomState(seed)
        self._order = self._rng.permutation(len(feasible)) if base is None else None

    @property
    def size(self) -> int:
        return len(self._feasible)

    def _encode(self, params: dict) -> tuple | None:
        try:
            return tuple(self._index[n][params[n]] for n in self._names)
        except KeyError:  # a partial config, or a value off the menu
            return None

    def _tried(self, study, trial=None) -> np.ndarray:
        """Mask over the feasible configs: proposed already (any state, running ones too, so
        workers sharing a study do not all measure one config), claimed by another running
        trial, or enqueued."""
        mask = np.zeros(len(self._feasible), dtype=bool)
        for t in study.get_trials(deepcopy=False):
            if trial is not None and t._trial_id == trial._trial_id:
                continue
            params = trial_config(t, len(self._names))
            if params is None:
                continue
            code = self._encode(params)
            if code is not None and code in self._row:
                mask[self._row[code]] = True
        return mask

    def _claim(self, study, trial, row: int) -> bool:
        """Record in the trial, before its parameters exist, which config it will measure; then
        look again. Another worker that picked the same config at the same moment wrote its
        claim first or reads this one: at most one of the two keeps it."""
        study._storage.set_trial_system_attr(trial._trial_id, CLAIM, self._feasible[row])
        return not self._tried(study, trial)[row]

    def infer_relative_search_space(self, study, trial):
        return dict(self._space)

    def sample_relative(self, study, trial, search_space):
        if not search_space or len(trial.system_attrs.get("fixed_params", {})) == len(self._names):
            return {}  # an enqueued config: nothing to pick, and no other config to hold by a claim
        for _ in range(8):  # a lost claim (another worker took the config) picks again
            row = self._pick(study, trial)
            if row is None or self._claim(study, trial, row):
                break
        if row is None:
            # Every feasible config is taken: another worker took the last one between this
            # worker's count and its trial. Any config will do; the tuner finds it taken and
            # makes the trial surplus (measured nothing, counted nowhere).
            return dict(self._feasible[self._rng.randint(len(self._feasible))])
        return dict(self._feasible[row])

    def _pick(self, study, trial) -> int | None:
        tried = self._tried(study, trial)
        if tried.all():
            return None
        if self._base is None:
            return int(next(i for i in self._order if not tried[i]))
        want = self._base.sample_relative(study, trial, self._base.infer_relative_search_space(study, trial))
        code = self._encode(want)
        if code is None:  # the base sampler's start-up: uniform over what is left
            free = np.flatnonzero(~tried)
            return int(free[self._rng.randint(len(free))])
        row = self._row.get(code)
        if row is not None and not tried[row]:
            return row
        distance = (self._codes != np.array(code, dtype=np.int32)).sum(axis=1)
        distance[tried] = len(self._names) + 1
        nearest = np.flatnonzero(distance == distance.min())
        return int(nearest[self._rng.randint(len(nearest))])

    def sample_independent(self, study, trial, param_name, param_distribution):
        # Reached only for a parameter outside the knob space (none today) or a trial whose
        # relative sample was empty: keep it feasible-blind but valid.
        if self._base is not None:
            return self._base.sample_independent(study, trial, param_name, param_distribution)
        choices = param_distribution.choices
        return choices[self._rng.randint(len(choices))]

    def before_trial(self, study, trial):
        if self._base is not None:
            self._base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        if self._base is not None:
            self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._rng.seed()
        if self._base is not None:
            self._base.reseed_rng()


__all__ = ["FeasibleSampler", "trial_config"]
