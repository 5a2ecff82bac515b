"""Several hosts on one PostgreSQL study (Optuna RDBStorage with heartbeats), one worker SIGKILLed.

Two fa4-tune commands stand in for two hosts: each has its own lock directory, its own
results DB and its own workers, and both join the same studies through ``--storage
postgresql://...``. Uses $FA4_TEST_PG_URL, else starts a throw-away server from the
postgresql package (tests/service/pg.py); skipped when neither exists.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import optuna
import pytest

from store import ResultsStore
from tests.tuner.test_cli import ROOT
from tests.tuner.test_fleet import RECORDED, recorded, shapes_file
from fa4.problem import Problem
from tuner.storage import open_storage

S = optuna.trial.TrialState


@pytest.fixture(scope="module")
def pg_url():
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tests.service import pg

    url, root = os.environ.get("FA4_TEST_PG_URL"), None
    if not url:
        if not pg.available():
            pytest.skip("needs PostgreSQL: set FA4_TEST_PG_URL or install the postgresql package")
        root = tempfile.mkdtemp(prefix="fa4-tuner-pg-")
        url = pg.start(root)
    base = make_url(url)
    schema = f"fa4fleet_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
        if root:
            pg.stop(root)
            shutil.rmtree(root, ignore_errors=True)


def _host(tmp_path, name, devices, storage, shapes, budget):
    d = tmp_path / name
    (d / "markers").mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="", FA4_LOCK_DIR=str(d / "locks"), FA4_TEST_MARKERS=str(d / "markers"),
               FA4_TEST_SLOW_S="1.5", FA4_HEARTBEAT_S="2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "--shapes", shapes, "--provider", "plugin:tests.tuner.fake_providers:SlowReplay",
         "--devices", devices, "--trials", str(budget), "--storage", storage, "--db", f"sqlite:///{d / 'r.db'}",
         "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, d


def _pids(d) -> set[str]:
    return {p.name.split("-")[0] for p in (d / "markers").iterdir()}


def test_two_hosts_share_a_postgres_study_and_survive_a_sigkill(tmp_path, pg_url):
    budget = 10
    shapes = shapes_file(tmp_path, RECORDED[:2])
    a, da = _host(tmp_path, "host_a", "cpu0,cpu1", pg_url, shapes, budget)
    b, db = _host(tmp_path, "host_b", "cpu0", pg_url, shapes, budget)
    try:
        # Once both of host A's workers are measuring, kill the one that started last.
        deadline = time.monotonic() + 120
        while len(_pids(da)) < 2:
            assert time.monotonic() < deadline and a.poll() is None, a.poll() and a.stderr.read()[-2000:]
            time.sleep(0.02)
        newest = max((da / "markers").iterdir(), key=lambda p: int(p.name.split("-")[1]))
        victim = int(newest.read_text())
        os.kill(victim, signal.SIGKILL)  # host A loses a worker in the middle of a measurement
        out_a, err_a = a.communicate(timeout=240)
        out_b, err_b = b.communicate(timeout=240)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
    assert a.returncode == 0, err_a
    assert b.returncode == 0, err_b
    doc_a, doc_b = json.loads(out_a), json.loads(out_b)
    assert sorted(w["exit"] for w in doc_a["workers"]) == ["killed by SIGKILL", "ok"]
    assert [w["exit"] for w in doc_b["workers"]] == ["ok"]

    stores = [ResultsStore.open(f"sqlite:///{d / 'r.db'}") for d in (da, db)]
    try:
        failed = []
        for res_a, res_b in zip(doc_a["results"], doc_b["results"]):
            assert res_a["study_name"] == res_b["study_name"]  # one study, two hosts
            assert res_a["storage"] == res_b["storage"] == pg_url
            problem = Problem.from_dict(res_a["problem"])
            study = optuna.load_study(study_name=res_a["study_name"], storage=open_storage(pg_url))
            states = [t.state for t in study.trials]
            assert S.RUNNING not in states and S.WAITING not in states
            answered = {t.number: t for t in study.trials if t.state in (S.COMPLETE, S.PRUNED)}
            # The budget exactly: racing workers' extra trials are surplus (FAIL, measured nothing).
            assert len(answered) == budget
            surplus = [t for t in study.trials if t.user_attrs.get("surplus")]
            assert all(t.state == S.FAIL and t.number not in answered for t in surplus)
            failed += [(study, t) for t in study.trials if t.state == S.FAIL and t not in surplus]
            # Each answered trial has exactly one whole row, in the DB of the host that ran it.
            rows = [r for s in stores for r in s.measurements(study_name=study.study_name)]
            numbers = [r["trial_number"] for r in rows]
            assert len(numbers) == len(set(numbers))
            assert set(numbers) == {n for n, t in answered.items() if "duplicate_of" not in t.user_attrs}
            for r in rows:
                want = recorded(problem, r["config"])
                assert r["status"] == want["status"] and r["tflops"] == want["tflops"]
        assert len(failed) == 1
        study, dead = failed[0]
        (retry,) = [t for t in study.trials if t.system_attrs.get("failed_trial") == dead.number]
        assert retry.params == dead.params and retry.state in (S.COMPLETE, S.PRUNED)
        assert all(s.count() > 0 for s in stores)  # both hosts did work
    finally:
        for s in stores:
            s.close()
