"""Study storages shared by several processes: heartbeats fail dead workers' trials and retry them."""

import os
import time

import optuna
import pytest

from tuner.storage import GRACE_FACTOR, fail_stale, open_storage, storage_kind

S = optuna.trial.TrialState


def _space():
    return {"tile_n": optuna.distributions.CategoricalDistribution([64, 128])}


def test_journal_heartbeats_fail_a_silent_trial_and_enqueue_its_retry(tmp_path):
    spec = str(tmp_path / "s.journal")
    storage = open_storage(spec, heartbeat_s=1)
    study = optuna.create_study(study_name="s", storage=storage)
    dead = study.ask(_space())
    alive = study.ask(_space())
    for t in (dead, alive):
        storage.record_heartbeat(t._trial_id)
    beats = tmp_path / "s.journal.beats"
    old = time.time() - GRACE_FACTOR * 1 - 5  # more than three beats ago
    os.utime(beats / str(dead._trial_id), (old, old))

    # Another process (a fresh storage on the same file) notices and acts.
    other = optuna.load_study(study_name="s", storage=open_storage(spec, heartbeat_s=1))
    fail_stale(other)
    trials = other.get_trials()
    assert [t.state for t in trials[:2]] == [S.FAIL, S.RUNNING]
    (retry,) = trials[2:]
    assert retry.state == S.WAITING and retry.params == dead.params
    assert retry.system_attrs["failed_trial"] == dead.number
    # A finished trial's beat file is removed; the live one keeps beating and stays running.
    study.tell(alive, 1.0)
    assert not (beats / str(alive._trial_id)).exists()


def test_journal_trial_killed_before_its_first_beat_is_judged_by_its_start(tmp_path):
    spec = str(tmp_path / "s.journal")
    study = optuna.create_study(study_name="s", storage=open_storage(spec, heartbeat_s=1))
    study.ask(_space())  # no beat file at all
    fail_stale(study)
    assert study.get_trials()[0].state == S.RUNNING  # just started: not dead yet
    time.sleep(GRACE_FACTOR * 1 + 0.5)
    fail_stale(study)
    states = [t.state for t in study.get_trials()]
    assert states == [S.FAIL, S.WAITING]


def test_retries_stop_after_max_retry(tmp_path):
    spec = str(tmp_path / "s.journal")
    storage = open_storage(spec, heartbeat_s=1, max_retry=1)
    study = optuna.create_study(study_name="s", storage=storage)
    old = time.time() - 60
    for _ in range(2):  # the original, then its one retry, both die
        t = study.ask(_space()) if not study.get_trials(states=(S.WAITING,)) else study.ask()
        storage.record_heartbeat(t._trial_id)
        os.utime(tmp_path / "s.journal.beats" / str(t._trial_id), (old, old))
        fail_stale(study)
    states = [t.state for t in study.get_trials()]
    assert states == [S.FAIL, S.FAIL]  # no third attempt


def test_rdb_storage_gets_heartbeats_and_the_retry_callback(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'o.db'}", heartbeat_s=7)
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert storage.get_heartbeat_interval() == 7
    assert isinstance(storage.get_heartbeat_stale_trial_callback(), optuna.storages.RetryHeartbeatStaleTrialCallback)
    import sqlite3

    with sqlite3.connect(tmp_path / "o.db") as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize("spec,kind", [("/x/y.journal", "journal"), ("postgresql://u@h/db", "postgresql"),
                                       ("postgresql+psycopg://u@h/db", "postgresql"), ("sqlite:///a.db", "sqlite")])
def test_storage_kind(spec, kind):
    assert storage_kind(spec) == kind


def test_printed_storage_hides_the_password():
    from tuner.storage import masked_storage

    assert masked_storage("postgresql://tuner:s3cret@db:5432/optuna") == "postgresql://tuner:***@db:5432/optuna"
    assert masked_storage("/data/results.optuna.journal") == "/data/results.optuna.journal"


def test_plain_postgresql_urls_use_the_installed_psycopg3():
    import importlib.util

    from tuner.storage import rdb_url

    want = "postgresql://u@h/db" if importlib.util.find_spec("psycopg2") else "postgresql+psycopg://u@h/db"
    assert rdb_url("postgresql://u@h/db") == want
    assert rdb_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
