"""Several tuner processes and the service on one SQLite file: no "database is locked", no 5xx."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx

from fa4.problem import Problem
from service.app import create_app
from store import ResultsStore
from service.settings import Settings
from tests.service.live import serve

REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok"
DEVICE = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 62914560,
          "memory_bytes": 150754820096}

_WORKER = textwrap.dedent(
    """
    import itertools, sys, time
    from pathlib import Path
    import httpx
    from fa4.arch import SM90
    from fa4.knobs import config_to_dict, iter_configs
    from fa4.problem import Problem
    from fa4.sm90.fwd_config import FwdConfigSm90, violations
    from providers import get_provider

    mode, url, w, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
    device = {device!r}
    problem = Problem.standard(4096, 128)
    fp = get_provider("fa4").source_fingerprint()
    cfgs = list(itertools.islice((c for c in iter_configs(FwdConfigSm90) if not violations(c, problem, SM90)), 8))
    while not go.exists():
        time.sleep(0.01)
    if mode == "local":
        from store import ResultsStore
        store = ResultsStore.open(url)
        dev = store.upsert_device(device)
        pid = store.upsert_problem(problem)
        for i in range(n):
            cid = store.upsert_config("fa4", config_to_dict(cfgs[i % len(cfgs)]), FwdConfigSm90)
            store.add_measurement(dev, pid, cid, status="ok", samples_ms=[1.0], median_ms=1.0,
                                  tflops=100.0 * w + i, source_fingerprint=fp, study_name=f"w{{w}}", trial_number=i)
        store.close()
    else:
        with httpx.Client(base_url=url, headers={{"Authorization": "Bearer {token}"}}, timeout=30) as c:
            for i in range(n):
                body = {{"device": device, "provider": "fa4", "problem": problem.to_dict(),
                        "config": config_to_dict(cfgs[i % len(cfgs)]), "status": "ok", "median_ms": 1.0,
                        "tflops": 100.0 * w + i, "source_fingerprint": fp, "study_name": f"w{{w}}",
                        "trial_number": i}}
                for attempt, want in ((0, 201), (1, 200)):  # every POST retried once: stored once
                    r = c.post("/v1/results", json=body, headers={{"Idempotency-Key": f"w{{w}}-{{i}}"}})
                    assert r.status_code == want, (r.status_code, r.text)
    """
)


def test_tuner_processes_and_service_share_one_sqlite_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    ResultsStore.open(url).close()  # migrate once, as fa4-serve does at start
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(device=DEVICE, token=TOKEN))
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    per_worker = 40
    # No answer cache: every read goes to the database while the writers write.
    app = create_app(settings=Settings(db_url=url, token=TOKEN, best_cache_ttl_s=0.0))
    with serve(app) as base:
        roles = [("local", url, w) for w in range(3)] + [("http", base, w) for w in (3, 4)]
        procs = [subprocess.Popen([sys.executable, str(script), mode, target, str(w), str(per_worker), str(go)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for mode, target, w in roles]
        time.sleep(1.5)  # imports done before the start signal, so the writes really overlap
        go.touch()

        statuses: list[int] = []
        stop = threading.Event()

        def read():
            with httpx.Client(base_url=base, timeout=30) as c:
                while not stop.is_set():
                    for path, params in (
                        ("/v1/configs/best", {"device": DEVICE["name"], "head_dim": 128, "seqlen_q": 4096,
                                              "batch": 4, "heads_q": 16}),
                        ("/v1/results", {"limit": 50, "sort": "-tflops"}),
                        ("/v1/studies/w0", {}),
                    ):
                        statuses.append(c.get(path, params=params).status_code)

        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in readers:
            t.start()
        results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
        stop.set()
        for t in readers:
            t.join(60)
        for (mode, _, w), (rc, err) in zip(roles, results):
            assert "locked" not in err, err
            assert rc == 0, f"{mode} writer {w} failed:\n{err}"
        assert statuses and all(s in (200, 404) for s in statuses), sorted(set(statuses))
        assert statuses.count(200) > len(statuses) // 2

        best = httpx.get(base + "/v1/configs/best", params={"device": DEVICE["name"], "head_dim": 128,
                                                             "seqlen_q": 4096, "batch": 4, "heads_q": 16}).json()
        assert best["provenance"] == "exact" and best["tflops"] == 100.0 * 4 + per_worker - 1
        page = httpx.get(base + "/v1/results", params={"limit": 1}).json()
        assert page["total"] == 5 * per_worker  # retried POSTs stored once
        study = httpx.get(base + "/v1/studies/w3").json()
        assert [t["trial_number"] for t in study["trials"]] == list(range(per_worker))
    with ResultsStore.open(url) as store:
        assert store.best(DEVICE["name"], "fa4", Problem.standard(4096, 128))["tflops"] == 439.0
