"""The tuner's logic on CPU, driven by the replay provider over a synthetic recording."""

import json

import optuna
import pytest

from fa4.arch import SM90
from fa4.knobs import config_to_dict, iter_configs
from fa4.problem import Problem
from store import ResultsStore
from tests.tuner.fake_providers import ENV
from tests.tuner.synthetic import COMPILE_ERROR_CFG, INCORRECT_CFG, best_synthetic, synthetic_tflops, write_synthetic
from providers.flash_attn4 import RefFa4FwdKnobs, fwd_default, fwd_violations
from tuner.study import Tuner, TuneError, default_storage, open_storage, study_name
from tuner.worker import InProcessRunner, IsolatedRunner

PROBLEM = Problem.standard(8192, 128)
CAUSAL64 = Problem.standard(4096, 64, causal=True)


@pytest.fixture
def env(tmp_path):
    rec = write_synthetic(tmp_path / "rec.json", [PROBLEM, CAUSAL64])
    store = ResultsStore.open(f"sqlite:///{tmp_path / 'results.db'}")
    yield {"rec": rec, "store": store, "tmp": tmp_path}
    store.close()


def _tuner(env, problem=PROBLEM, runner=None, **kw):
    kw.setdefault("trials", 40)
    return Tuner(f"replay:{env['rec']}", problem, store=env["store"], runner=runner or InProcessRunner(), **kw)


def _study(t):
    return optuna.load_study(study_name=t.name, storage=open_storage(t.storage_spec))


@pytest.mark.parametrize("problem", [PROBLEM, CAUSAL64])
def test_finds_the_best_within_budget(env, problem):
    res = _tuner(env, problem, trials=40).run()
    want = best_synthetic(problem)
    assert res.best["config"] == config_to_dict(want)
    assert res.best["tflops"] == pytest.approx(synthetic_tflops(want), rel=1e-3)
    assert res.default["config"] == config_to_dict(fwd_default(problem))
    assert res.speedup == pytest.approx(res.best["tflops"] / res.default["tflops"])
    assert res.speedup >= 1.0
    assert res.trials == 40


def test_default_is_enqueued_first_and_flagged(env):
    t = _tuner(env, trials=5)
    t.run()
    first = _study(t).trials[0]
    assert first.number == 0 and first.params == config_to_dict(fwd_default(PROBLEM))
    rows = env["store"].measurements(study_name=t.name)
    assert rows[0]["trial_number"] == 0 and rows[0]["is_default"] is True
    assert sum(r["is_default"] for r in rows) == 1
    d = env["store"].default_result(t.device_info["name"], "replay", PROBLEM)
    assert d is not None and d["tflops"] == pytest.approx(synthetic_tflops(fwd_default(PROBLEM)), rel=1e-3)


def test_the_grid_measures_every_feasible_config_once_and_no_infeasible_one(env):
    t = _tuner(env, sampler="grid", trials=1000)
    res = t.run()
    study = _study(t)
    space = list(iter_configs(RefFa4FwdKnobs))
    feasible = [c for c in space if not fwd_violations(c, PROBLEM, SM90)]
    assert len(feasible) < len(space), "the space has infeasible configs for hd128"
    # The budget is the feasible space: every feasible config once (the default among them).
    assert res.trials == len(feasible) == res.feasible_configs == res.budget
    assert sorted(json.dumps(tr.params, sort_keys=True) for tr in study.trials) == sorted(
        json.dumps(config_to_dict(c), sort_keys=True) for c in feasible)
    assert "infeasible" not in res.statuses
    assert env["store"].count(study_name=t.name, status="infeasible") == 0
    # The failing statuses of the recording are pruned, with their own status.
    by_cfg = {tuple(tr.params.values()): tr for tr in study.trials}
    ce = by_cfg[tuple(config_to_dict(COMPILE_ERROR_CFG).values())]
    assert ce.state == optuna.trial.TrialState.PRUNED and t.trial_row(ce)["status"] == "compile_error"
    bad = by_cfg[tuple(config_to_dict(INCORRECT_CFG).values())]
    assert t.trial_row(bad)["status"] == "incorrect"
    assert res.best["config"] == config_to_dict(best_synthetic(PROBLEM))
    assert sum(res.statuses.values()) == len(feasible)


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_samplers_propose_only_untried_feasible_configs(env, sampler):
    """--trials N is N measured configs: no infeasible proposal, no config twice."""
    res = _tuner(env, sampler=sampler, trials=30).run()
    trials = _study(_tuner(env, sampler=sampler, trials=30)).trials
    assert res.trials == 30 and len(trials) == 30
    assert all(not fwd_violations(RefFa4FwdKnobs(**tr.params), PROBLEM, SM90) for tr in trials)
    assert len({json.dumps(tr.params, sort_keys=True) for tr in trials}) == 30
    assert "infeasible" not in res.statuses and sum(res.statuses.values()) == 30


def test_an_infeasible_config_that_gets_in_is_pruned_with_reason_and_stored(env):
    """The check before each measurement stays: a config enqueued by hand is not measured."""
    t = _tuner(env, trials=2)
    cfg = next(c for c in iter_configs(RefFa4FwdKnobs) if fwd_violations(c, PROBLEM, SM90))
    study = t.open_study()
    study.enqueue_trial(config_to_dict(cfg))
    t.run()
    tr = next(tr for tr in _study(t).trials if tr.params == config_to_dict(cfg))
    reason = "; ".join(fwd_violations(cfg, PROBLEM, SM90))
    assert tr.state == optuna.trial.TrialState.PRUNED and t.trial_row(tr)["status"] == "infeasible"
    assert t.trial_row(tr)["reason"] == reason
    rows = env["store"].measurements(study_name=t.name, status="infeasible")
    assert [(r["trial_number"], r["reason"]) for r in rows] == [(tr.number, reason)]


def test_rerun_resumes_the_study(env):
    first = _tuner(env, trials=10).run()
    n_rows = len(env["store"].measurements())
    second = _tuner(env, trials=25).run()
    assert first.study_name == second.study_name
    assert second.resumed_with == 10 and second.trials == 25
    trials = _study(_tuner(env)).trials
    assert [t.number for t in trials] == list(range(25))
    # The default was measured once: it is not re-enqueued on resume.
    assert sum(1 for t in trials if t.params == config_to_dict(fwd_default(PROBLEM))
               and "duplicate_of" not in t.user_attrs) == 1
    assert len(env["store"].measurements()) > n_rows
    third = _tuner(env, trials=25).run()  # nothing left to do
    assert third.trials == 25 and third.stored_measurements == 0
    assert third.best == second.best


def test_default_storage_sits_beside_a_sqlite_db(tmp_path):
    assert default_storage(f"sqlite:///{tmp_path}/x/results.db") == str(tmp_path / "x" / "results.optuna.journal")
    assert default_storage("postgresql://u@h/db").endswith("optuna.journal")


def test_study_name_is_deterministic():
    a = study_name("NVIDIA H200", "flash-attn-4", PROBLEM)
    assert a == study_name("NVIDIA H200", "flash-attn-4", Problem.standard(8192, 128))
    assert a != study_name("NVIDIA H200", "flash-attn-4", CAUSAL64)
    assert a != study_name("NVIDIA H100", "flash-attn-4", PROBLEM)


def test_unrecorded_problem_is_a_request_error(env):
    with pytest.raises(TuneError, match="has no problem"):
        _tuner(env, Problem.standard(2048, 128))


def test_crash_and_raise_in_worker_are_recorded_and_the_study_continues(env, monkeypatch):
    monkeypatch.setenv(ENV, env["rec"])
    spec = "plugin:tests.tuner.fake_providers:MisbehavingReplay"
    runner = IsolatedRunner(timeout_s=120)
    t = Tuner(spec, PROBLEM, store=env["store"], runner=runner, trials=6)
    # Queue the two misbehaving configs right after the default.
    study = optuna.create_study(study_name=t.name, storage=open_storage(t.storage_spec), direction="maximize")
    crash = RefFa4FwdKnobs(128, 96, True, True)
    boom = RefFa4FwdKnobs(128, 112, True, True)
    study.enqueue_trial(config_to_dict(fwd_default(PROBLEM)))
    study.enqueue_trial(config_to_dict(crash))
    study.enqueue_trial(config_to_dict(boom))
    after = RefFa4FwdKnobs(128, 160, True, True)
    study.enqueue_trial(config_to_dict(after))
    try:
        res = t.run()
    finally:
        runner.close()
    trials = _study(t).trials
    assert [tr.params for tr in trials[:3]] == [config_to_dict(c) for c in (fwd_default(PROBLEM), crash, boom)]
    rows_of = [t.trial_row(tr) for tr in trials]
    assert rows_of[1]["status"] == "runtime_error"
    assert "worker process died" in rows_of[1]["reason"] and "SIGABRT" in rows_of[1]["reason"]
    assert rows_of[2]["status"] == "runtime_error"
    assert "provider bug raised inside the worker" in rows_of[2]["reason"]
    assert res.trials == 6
    # The study went on after the crash: the worker was restarted and later configs measured.
    assert runner.restarts >= 1
    assert trials[3].params == config_to_dict(after)
    assert rows_of[3]["status"] == "ok"
    assert trials[3].value == pytest.approx(synthetic_tflops(after), rel=1e-3)
    rows = env["store"].measurements(study_name=t.name, status="runtime_error")
    # The queued pair, and any later proposal of a config the provider misbehaves on.
    misbehaving = sorted(tr.number for tr in trials if tr.params["tile_n"] in (96, 112))
    assert misbehaving[:2] == [1, 2]
    assert sorted(r["trial_number"] for r in rows) == misbehaving
    assert res.default["status"] == "ok"


def test_default_provider_is_fa4_on_any_machine():
    import providers
    from providers.base import Provider
    from tuner.study import resolve_provider

    class FakeFa4(Provider):
        name = "fa4"
        usable = True

        def available(self):
            return None if self.usable else "not built"

    saved = dict(providers._REGISTRY)
    try:
        providers.register("fa4", FakeFa4)
        assert resolve_provider(None).name == "fa4"
        # Unusable here (no GPU, not built): still fa4, whose CPU report or "not available"
        # error the user then sees; the reference runs only when asked for.
        FakeFa4.usable = False
        providers._CACHE.pop("fa4", None)
        assert resolve_provider(None).name == "fa4"
        assert resolve_provider("flash-attn-4").name == "flash-attn-4"
    finally:
        providers._REGISTRY.clear()
        providers._REGISTRY.update(saved)
        providers._CACHE.pop("fa4", None)


def test_check_without_gpu_compiles_feasible_configs_where_supported():
    from providers.flash_attn4 import FlashAttn4Provider
    from tuner.study import check_without_gpu

    class Compiles(FlashAttn4Provider):
        compiled = []

        def available(self):
            return None

        def supports_compile_only(self, problem):
            return True

        def compile_only(self, problem, config, arch):
            self.compiled.append(config)
            return "ptxas: synthetic failure" if config.tile_n == 176 else None

    p = Compiles()
    rep = check_without_gpu(p, PROBLEM)
    feasible = p.feasible_configs(PROBLEM, SM90)
    # Every feasible config once and only those, the default's kernel first (it matters most).
    assert p.compiled[0] == p.default_config(PROBLEM, SM90)
    assert sorted(p.compiled, key=repr) == sorted(feasible, key=repr)
    n_fail = sum(1 for c in feasible if c.tile_n == 176)
    assert rep["compile"]["ok"] == len(feasible) - n_fail
    assert len(rep["compile"]["errors"]) == n_fail
    assert rep["feasible"] == len(feasible)
    assert sum(r["count"] for r in rep["infeasible_reasons"].values()) >= rep["infeasible"]


def test_the_results_db_is_the_one_store_of_a_trials_results(env):
    """Optuna keeps the objective value its sampler needs and a pointer to the row; nothing else
    of what was measured (status, reason, timings, errors live in the results DB only)."""
    t = _tuner(env, sampler="grid", trials=1000)
    res = t.run()
    rows = {r["id"]: r for r in env["store"].measurements(study_name=t.name)}
    result_keys = {"status", "reason", "tflops", "median_ms", "iqr_ms", "error", "ref_error", "samples_ms",
                   "measured", "is_default"}
    for tr in _study(t).trials:
        assert not result_keys & set(tr.user_attrs), tr.user_attrs
        row = rows[tr.user_attrs["measurement_id"]]
        assert row["trial_number"] == tr.number and row["config"] == tr.params
        if tr.state == optuna.trial.TrialState.COMPLETE:
            assert row["status"] == "ok" and tr.value == row["tflops"]
        else:
            assert row["status"] != "ok"
    # The report's numbers come from those rows.
    assert res.measured == len(rows)
    assert res.best["tflops"] == max(r["tflops"] for r in rows.values() if r["status"] == "ok")


def test_a_new_study_starts_from_its_nearest_measured_neighbours(env, tmp_path):
    """Warm start: after the default, the configs served for the nearest measured shapes of the
    family (same device, provider, pass, head dims, dtype, causal), nearest first; a resumed
    study enqueues nothing more."""
    near = Problem.standard(4096, 128)
    far = Problem.standard(1024, 128)
    rec = write_synthetic(tmp_path / "rec3.json", [PROBLEM, near, far, CAUSAL64])
    store = env["store"]

    def tuner(problem, **kw):
        return Tuner(f"replay:{rec}", problem, store=store, runner=InProcessRunner(), verify_rounds=0, **kw)

    won = {}
    for p in (far, near, CAUSAL64):
        r = tuner(p, trials=25).run()
        won[p] = r.best["config"]
        assert r.best["config"] != r.default["config"], "the synthetic space must have a winner off the default"
    t = tuner(PROBLEM, trials=6)
    res = t.run()
    trials = _study(t).trials
    assert trials[0].params == config_to_dict(fwd_default(PROBLEM))
    # Nearest first (4096 before 1024); the causal hd64 study is another family.
    want = [c for c in (won[near], won[far]) if c != trials[0].params]
    want = list(dict.fromkeys(json.dumps(c, sort_keys=True) for c in want))
    assert [json.dumps(w["config"], sort_keys=True) for w in res.warm_start] == want
    assert [w["from"] for w in res.warm_start][:1] == [near.key()]
    assert [json.dumps(tr.params, sort_keys=True) for tr in trials[1:1 + len(want)]] == want
    assert all(tr.user_attrs.get("warm_start_from") for tr in trials[1:1 + len(want)])
    again = tuner(PROBLEM, trials=8).run()
    assert again.warm_start == [] and again.resumed_with == 6


def test_the_default_is_enqueued_once_while_it_waits(env):
    """A fleet worker's second pass over a study whose enqueued default has not started yet (a
    WAITING trial has no params, only fixed_params) must not enqueue it again: the copy would be a
    duplicate trial, one measured config fewer (seen as 9 of 10 rows in the two-GPU fleet test)."""
    t = _tuner(env, trials=3)
    study = t.open_study()
    t._enqueue_default(study)
    t._enqueue_default(study)
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].system_attrs["fixed_params"] == config_to_dict(fwd_default(PROBLEM))


def test_a_config_another_trial_holds_is_measured_once(env, caplog):
    """Two workers' enqueues can put one config in the queue twice, and a worker that counted the
    last free config after another took it is handed a taken one: the second trial of a config
    measures nothing, and the study still holds its budget of distinct configs."""
    t = _tuner(env, trials=4)
    cfg = next(c for c in iter_configs(RefFa4FwdKnobs) if not fwd_violations(c, PROBLEM, SM90)
               and c != fwd_default(PROBLEM))
    study = t.open_study()
    for _ in range(2):
        study.enqueue_trial(config_to_dict(cfg))
    with caplog.at_level("WARNING", logger="optuna"):
        res = t.run()
    assert res.trials == 4 and res.failed == 0
    trials = _study(t).trials
    twins = [tr for tr in trials if tr.params == config_to_dict(cfg)]
    assert [tr.state for tr in twins] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL]
    assert twins[1].user_attrs["surplus"] is True and "measurement_id" not in twins[1].user_attrs
    rows = env["store"].measurements(study_name=t.name)
    assert sorted(r["trial_number"] for r in rows) == sorted(tr.number for tr in trials if tr is not twins[1])
    assert len({json.dumps(r["config"], sort_keys=True) for r in rows}) == 4  # four distinct configs
    assert not [r for r in caplog.records if "failed" in r.getMessage()]


def test_a_trial_started_after_the_budget_is_taken_is_surplus(env, caplog):
    """Two fleet workers may both count one trial left and both start one (the fleet test on two
    fake GPUs once ended with 6 of 5). The later-started trial measures nothing, and the study's
    counts, the sampler's taken configs and Optuna's log leave it out."""
    full = _tuner(env, trials=4, parallel=True, worker="gpu0")
    assert full.run().trials == 4
    stale = _tuner(env, trials=4, parallel=True, worker="gpu1")
    real_left = stale._left
    counts = iter([(1, 3, 0)])  # what a worker read just before the other finished the last trial
    stale._left = lambda study: next(counts, None) or real_left(study)
    with caplog.at_level("WARNING", logger="optuna"):
        res = stale.run()
    assert res.trials == 4 and res.failed == 0 and "worker_died" not in res.statuses
    trials = _study(stale).trials
    assert len(trials) == 5
    extra = trials[4]
    assert extra.state == optuna.trial.TrialState.FAIL and extra.user_attrs["surplus"] is True
    assert not extra.params  # stopped before sampling a config: nothing claimed
    rows = env["store"].measurements(study_name=stale.name)
    assert sorted(r["trial_number"] for r in rows) == [0, 1, 2, 3]
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    # Racing trials: the lower-numbered one keeps its place, whichever checks first.
    study = _study(stale)
    with pytest.warns(UserWarning, match="Heartbeat"):  # ask() outside optimize: fine for this check
        a, b = study.ask(), study.ask()
    for budget, want in ((4, (True, True)), (5, (False, True)), (6, (False, False))):
        t = _tuner(env, trials=budget)
        assert (t._surplus(study, b), t._surplus(study, a))[::-1] == want, budget


def test_racing_trials_are_ordered_by_number_not_by_their_start_stamps(env):
    """Each worker stamps its trial's start before the storage inserts (and numbers) it, so the
    trial inserted second can carry the earlier stamp: ordered by stamps, two racing workers that
    each checked before the other's insert both went on (6 trials of 5, session 34's CI). By
    number exactly one of them is surplus; a trial queued below (enqueued, taken later) holds its
    place too."""
    import datetime
    from types import SimpleNamespace

    S = optuna.trial.TrialState
    t0 = datetime.datetime(2026, 12, 6, 6, 0, 0)

    def trial(number, state, stamp=None):
        return SimpleNamespace(number=number, state=state, user_attrs={},
                               datetime_start=None if stamp is None else t0 + datetime.timedelta(milliseconds=stamp))

    class Study:
        def __init__(self, trials):
            self.trials = trials

        def get_trials(self, deepcopy=False, states=None):
            return [t for t in self.trials if states is None or t.state in states]

    done = [trial(n, S.COMPLETE, n) for n in range(4)]
    # Trial 5 was stamped 1 ms before trial 4 but inserted after it.
    fourth, fifth = trial(4, S.RUNNING, 10), trial(5, S.RUNNING, 9)
    t = _tuner(env, trials=5)
    study = Study(done + [fourth, fifth])
    assert (t._surplus(study, fourth), t._surplus(study, fifth)) == (False, True)
    # The old order (stamps) let both run: the case this test exists for.
    by_stamp = sum(1 for x in study.trials if x is not fifth and (x.datetime_start, x.number) <
                   (fifth.datetime_start, fifth.number))
    assert by_stamp == 4
    # An enqueued trial numbered 4, not yet taken when trial 5 checks: trial 5 yields to it, and
    # when it is taken it goes on (only the trials below it count).
    queued = trial(4, S.WAITING)
    study = Study(done + [queued, fifth])
    assert t._surplus(study, fifth)
    queued.state, queued.datetime_start = S.RUNNING, t0 + datetime.timedelta(milliseconds=20)
    assert not t._surplus(study, queued)
    # A surplus trial below holds nothing.
    fourth.user_attrs["surplus"] = True
    assert not t._surplus(Study(done + [fourth, fifth]), fifth)
