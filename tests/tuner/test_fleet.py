"""Fleet tuning on CPU: several worker processes on one study, replaying the real H200 recording.

Virtual slots (cpu0, cpu1, ...) stand in for GPUs; the replay provider serves the numbers
recorded on the H200 (providers/data/ref_fa4_h200.json), so what the fleet finds can be checked
against the recording itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

from fa4.problem import Problem
from store import ResultsStore
from tests.tuner.test_cli import ROOT, fa4_tune
from tuner.fleet import FleetError, Slot, SlotBusy, acquire, parse_devices
from providers.replay import ReplayProvider, config_id
from tuner.storage import open_storage
from tuner.study import study_name

REC = ReplayProvider()
RECORDED = REC.recording.problems  # the four problems measured on the H200


def recorded_best(problem: Problem) -> dict:
    ok = [r for r in REC.recording.entries[problem.key()]["results"].values() if r["status"] == "ok"]
    return max(ok, key=lambda r: r["tflops"])


def recorded(problem: Problem, config: dict) -> dict:
    return REC.recording.entries[problem.key()]["results"][config_id(config)]


def shapes_file(tmp_path, problems) -> str:
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps([p.to_dict() for p in problems]))
    return str(path)


def load(storage: str, name: str):
    return optuna.load_study(study_name=name, storage=open_storage(storage))


def check_db_matches_studies(store, storage: str, results: list[dict], provider: str) -> int:
    """Every answered trial has exactly one whole measurement row, equal to the recording; nothing else."""
    n = 0
    for res in results:
        problem = Problem.from_dict(res["problem"])
        study = load(storage, res["study_name"])
        S = optuna.trial.TrialState
        answered = {t.number: t for t in study.trials if t.state in (S.COMPLETE, S.PRUNED)
                    and "duplicate_of" not in t.user_attrs}
        rows = store.measurements(study_name=res["study_name"])
        numbers = [r["trial_number"] for r in rows]
        assert len(numbers) == len(set(numbers)), "a trial was stored twice"
        assert set(numbers) == set(answered), "rows and answered trials differ"
        for r in rows:
            t = answered[r["trial_number"]]
            assert r["provider"] == provider and r["config"] == t.params
            want = recorded(problem, t.params)
            # The trial points at its row: the results DB is the one store of what it measured.
            assert t.user_attrs["measurement_id"] == r["id"] and r["status"] == want["status"]
            if r["status"] == "ok":
                assert r["samples_ms"] == want["samples_ms"] and r["n_samples"] == len(want["samples_ms"]) > 0
                assert r["median_ms"] == pytest.approx(want["median_ms"])
                assert r["tflops"] == pytest.approx(want["tflops"]) == t.value
        n += len(rows)
    return n


# ---- --devices --------------------------------------------------------------------------


def test_parse_devices_pins_one_worker_per_gpu():
    uuids = {"0": "GPU-aaa", "1": "GPU-bbb", "2": "GPU-ccc", "3": "GPU-ddd"}
    two = parse_devices("0,1", True, "fa4", visible="0,1,2,3", uuids=uuids)
    assert two == [Slot("gpu0", "0", "GPU-aaa"), Slot("gpu1", "1", "GPU-bbb")]
    # Ordinals count inside the CUDA_VISIBLE_DEVICES the command got, like any CUDA program.
    assert parse_devices("1", True, "fa4", visible="2,3", uuids=uuids) == [Slot("gpu1", "3", "GPU-ddd")]
    assert [s.cuda_visible for s in parse_devices("all", True, "fa4", visible="2,3", uuids=uuids)] == ["2", "3"]
    assert len(parse_devices("all", True, "fa4", visible=None, count=8, uuids={})) == 8
    virtual = parse_devices("cpu0,cpu1", False, "replay", visible="")
    assert virtual == [Slot("cpu0", "", "virtual-cpu0"), Slot("cpu1", "", "virtual-cpu1")]


@pytest.mark.parametrize("spec,needs_gpu,visible,needle", [
    ("0,0", True, "0,1", "GPU 0 twice"),
    ("0,1", True, "0,0", "one physical GPU twice"),  # two ordinals, one device
    ("2", True, "0,1", "no GPU 2"),
    ("0", True, "", "no CUDA GPU is visible"),
    ("cpu0,cpu1", True, "", "only for providers that need none"),
    ("cpu0,cpu0", False, "", "twice"),
    ("cpu0,1", False, "0", "mixes"),
    ("gpu1", True, "0,1", "not a GPU number"),
])
def test_parse_devices_refuses(spec, needs_gpu, visible, needle):
    with pytest.raises(FleetError, match=needle):
        parse_devices(spec, needs_gpu, "fa4", visible=visible, uuids={})


def test_a_busy_slot_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FA4_LOCK_DIR", str(tmp_path / "locks"))
    fd = acquire(Slot("cpu1", "", "virtual-cpu1"))
    try:
        with pytest.raises(SlotBusy, match=f"fa4-tune pid {os.getpid()}"):
            acquire(Slot("cpu1", "", "virtual-cpu1"))
        r = fa4_tune("--seqlen", "8192", "--hdim", "128", "--provider", "replay", "--devices", "cpu0,cpu1",
                     "--db", f"sqlite:///{tmp_path / 'r.db'}", env_extra={"FA4_LOCK_DIR": str(tmp_path / "locks")})
        assert r.returncode == 1
        assert r.stderr.strip().count("\n") == 0 and "virtual slot cpu1 is in use for timing" in r.stderr
        with ResultsStore.open(f"sqlite:///{tmp_path / 'r.db'}") as store:
            assert store.count() == 0  # nothing ran
    finally:
        os.close(fd)
    acquire_again = acquire(Slot("cpu1", "", "virtual-cpu1"))  # released with its holder
    os.close(acquire_again)


# ---- the fleet end to end ---------------------------------------------------------------


def test_two_workers_grid_two_shapes_like_the_recording(tmp_path):
    shapes = [RECORDED[1], RECORDED[2]]  # hd64 causal, hd128 full
    db = f"sqlite:///{tmp_path / 'r.db'}"
    r = fa4_tune("--shapes", shapes_file(tmp_path, shapes), "--provider", "replay", "--devices", "cpu0,cpu1",
                 "--sampler", "grid", "--trials", "1000", "--db", db, "--json",
                 env_extra={"FA4_LOCK_DIR": str(tmp_path / "locks")})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [w["exit"] for w in out["workers"]] == ["ok", "ok"]
    results = out["results"]
    assert [Problem.from_dict(x["problem"]) for x in results] == shapes
    workers_seen = set()
    for res in results:
        problem = Problem.from_dict(res["problem"])
        n_feasible = len(REC.feasible_configs(problem, REC.arch()))
        best = recorded_best(problem)
        # The whole feasible grid was measured across two processes, so the recorded best must win.
        assert res["best"]["config"] == best["config"] and res["best"]["tflops"] == pytest.approx(best["tflops"])
        # Every feasible config once (the default among them): two workers asking at the same
        # instant for the last config get it once; the other's trial is surplus, counted nowhere.
        assert res["budget"] == n_feasible == res["trials"] and res["failed"] == 0
        study = load(res["storage"], res["study_name"])
        # Surplus trials (a racing worker's extra, measured nothing) hold no config and no worker.
        held = [t for t in study.trials if not t.user_attrs.get("surplus")]
        assert all(t.state == optuna.trial.TrialState.FAIL for t in study.trials if t not in held)
        workers_seen |= {t.user_attrs.get("worker") for t in held}
        grid_points = {json.dumps(t.params, sort_keys=True) for t in held}
        assert len(held) == n_feasible
        assert len(grid_points) == n_feasible  # every feasible config, none lost between the workers
        assert "infeasible" not in res["statuses"]
    assert workers_seen == {"cpu0", "cpu1"}  # the work was shared
    # Every worker line says when it happened (seconds since the fleet started), in order per
    # worker: the log of a real run shows where its wall time went.
    import re

    for slot in ("cpu0", "cpu1"):
        stamps = [float(x) for x in re.findall(rf"^\[{slot} \+([0-9.]+)s\]", r.stderr, flags=re.M)]
        assert len(stamps) >= 3 and stamps == sorted(stamps), r.stderr[-2000:]
    with ResultsStore.open(db) as store:
        n = check_db_matches_studies(store, results[0]["storage"], results, "replay")
        assert n == store.count() == sum(x["stored_measurements"] for x in results)


def test_grid_of_shapes_in_one_process(tmp_path):
    r = fa4_tune("--seqlen", "8192", "--hdim", "64,128", "--provider", "replay", "--trials", "12", "--json",
                 "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)["results"]
    assert [Problem.from_dict(x["problem"]) for x in results] == [Problem.standard(8192, 64),
                                                                  Problem.standard(8192, 128)]
    assert [x["trials"] for x in results] == [12, 12]
    table = fa4_tune("--seqlen", "8192", "--hdim", "64,128", "--provider", "replay", "--trials", "12",
                     "--db", f"sqlite:///{tmp_path / 'r.db'}")
    assert table.returncode == 0 and "2 shapes" in table.stdout and "results DB:" in table.stdout


def test_sigkill_mid_trial_is_retried_and_the_db_stays_whole(tmp_path):
    """A worker SIGKILLed while measuring: its trial goes FAIL and is retried, the study goes on."""
    markers = tmp_path / "markers"
    markers.mkdir()
    db = f"sqlite:///{tmp_path / 'r.db'}"
    problems = RECORDED[:2]
    budget = 6
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES="", FA4_LOCK_DIR=str(tmp_path / "locks"), FA4_TEST_MARKERS=str(markers),
               FA4_TEST_SLOW_S="1.5", FA4_HEARTBEAT_S="2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "--shapes", shapes_file(tmp_path, problems), "--provider",
         "plugin:tests.tuner.fake_providers:SlowReplay", "--devices", "cpu0,cpu1,cpu2", "--trials", str(budget),
         "--db", db, "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until every worker is measuring, then kill the one that started last: it is
        # up to 1.5 s from done, inside the provider's measure(), before anything is stored.
        deadline = time.monotonic() + 120
        while len({p.name.split("-")[0] for p in markers.iterdir()}) < 3:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.02)
        newest = max(markers.iterdir(), key=lambda p: int(p.name.split("-")[1]))
        victim = int(newest.read_text())
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    doc = json.loads(out)
    killed = [w for w in doc["workers"] if w["pid"] == victim]
    assert len(killed) == 1 and killed[0]["exit"] == "killed by SIGKILL"
    assert sorted(w["exit"] for w in doc["workers"]) == ["killed by SIGKILL", "ok", "ok"]
    assert "the other workers take over its trials" in err

    S = optuna.trial.TrialState
    failed_trials = []
    for res in doc["results"]:
        study = load(res["storage"], res["study_name"])
        states = [t.state for t in study.trials]
        assert S.RUNNING not in states and S.WAITING not in states  # nothing left hanging
        answered = sum(s in (S.COMPLETE, S.PRUNED) for s in states)
        assert budget <= answered <= budget + 2  # the budget holds (2 = racing workers' overshoot)
        for t in study.trials:
            # Racing workers' extra trials are surplus: FAIL, measured nothing, not failures.
            if t.state == S.FAIL and not t.user_attrs.get("surplus"):
                failed_trials.append((study, t))
            assert not (t.user_attrs.get("surplus") and t.state != S.FAIL)
    assert len(failed_trials) == 1, "exactly the killed worker's trial failed"
    study, dead = failed_trials[0]
    assert dead.user_attrs["worker"] == killed[0]["slot"]
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == dead.number]
    assert len(retries) == 1 and retries[0].params == dead.params
    assert retries[0].state in (S.COMPLETE, S.PRUNED) and retries[0].user_attrs["worker"] != killed[0]["slot"]
    with ResultsStore.open(db) as store:
        # No row for the killed trial; every other answered trial has one whole row.
        assert store.count(study_name=study.study_name) == len(store.measurements(study_name=study.study_name))
        assert dead.number not in {r["trial_number"] for r in store.measurements(study_name=study.study_name)}
        n = check_db_matches_studies(store, doc["results"][0]["storage"], doc["results"], "slow-replay")
        assert n == store.count()


def test_study_names_match_the_single_gpu_runs(tmp_path):
    """A fleet's studies are the plain command's studies: either can resume the other."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    first = fa4_tune("--seqlen", "8192", "--hdim", "128", "--provider", "replay", "--trials", "5", "--json", "--db", db)
    assert first.returncode == 0, first.stderr
    more = fa4_tune("--seqlen", "8192", "--hdim", "128", "--provider", "replay", "--trials", "9", "--json",
                    "--db", db, "--devices", "cpu0,cpu1", env_extra={"FA4_LOCK_DIR": str(tmp_path / "locks")})
    assert more.returncode == 0, more.stderr
    a, b = json.loads(first.stdout), json.loads(more.stdout)
    assert a["study_name"] == b["study_name"] == study_name(REC.device_info()["name"], "replay",
                                                            Problem.standard(8192, 128))
    # Two workers that both see one trial left may both start one: at most one extra.
    assert 9 <= b["trials"] <= 10 and b["resumed_with"] == 5


def test_fleet_scaling_bench_runs_and_compares_without_a_gpu(tmp_path):
    """bench/fleet_scaling.py end to end on virtual slots: the lead's GPU command takes the same path."""
    out = tmp_path / "scaling"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", FA4_LOCK_DIR=str(tmp_path / "locks"))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "fleet_scaling.py"), "--virtual", "--provider", "replay",
                        "--seqlens", "8192", "--hdims", "64,128", "--trials", "10", "--out", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    runs = {n: json.loads((out / f"run_{n}gpu" / "run.json").read_text()) for n in (1, 2)}
    assert summary["speedup"] == pytest.approx(runs[1]["wall_s"] / runs[2]["wall_s"])
    assert "--devices cpu0,cpu1" in runs[2]["command"] and "--devices cpu0 " in runs[1]["command"]
    assert [s["key"] for s in summary["shapes"]] == [Problem.standard(8192, d).key() for d in (64, 128)]
    for s in summary["shapes"]:
        # Both runs replay the same recording: their winners' numbers are the recording's.
        problem = Problem.standard(8192, 64 if "_d64_" in s["key"] else 128)
        for b in (s["best_1"], s["best_2"]):
            assert b["tflops"] == pytest.approx(recorded(problem, b["config"])["tflops"])
        assert s["agree"] == (s["same_config"] or s["rel_diff"] <= s["noise"])
    assert "| shape | 1-GPU winner |" in r.stdout and "wall time: 1 GPU" in r.stdout


def test_two_workers_halve_the_trial_phase(tmp_path):
    """With measurements that take real time (a provider that sleeps per trial, like a GPU
    timing), two workers finish the same grid's trials in about half the time of one: the
    trial budget is shared and the workers do not serialize on the storage or the DB. Measured
    from the workers' own time stamps, so process start-up is left out (that fixed cost is what
    the H200 x2 run showed; see bench/RESULTS.md)."""
    import re

    spec = "plugin:tests.tuner.fake_providers:SlowReplay"
    shapes = shapes_file(tmp_path, [RECORDED[1], RECORDED[2]])
    spans = {}
    for devices in ("cpu0", "cpu0,cpu1"):
        r = fa4_tune("--shapes", shapes, "--provider", spec, "--devices", devices, "--sampler", "grid",
                     "--trials", "8", "--db", f"sqlite:///{tmp_path / (devices + '.db')}", "--json",
                     env_extra={"FA4_LOCK_DIR": str(tmp_path / "locks"), "FA4_TEST_SLOW_S": "0.6"})
        assert r.returncode == 0, r.stderr
        lines = re.findall(r"^\[cpu\d \+([0-9.]+)s\] \S+ trial \d+: (\w+)", r.stderr, flags=re.M)
        assert len(lines) >= 16, r.stderr[-2000:]  # 2 shapes x 8 trials (+ a grid point handed out twice)
        # Only feasible configs are proposed; the recording's failures (compile errors) are the rest.
        assert sum(st == "ok" for _, st in lines) >= 12, r.stderr[-2000:]
        assert not any(st == "infeasible" for _, st in lines), r.stderr[-2000:]
        # Each measured trial's line says where its time went (here: the 0.6 s "timing").
        timed = re.findall(r"^\[cpu\d \+[0-9.]+s\] \S+ trial \d+: ok .*\[time ([0-9.]+)s\]$", r.stderr, flags=re.M)
        assert len(timed) >= 12 and all(0.6 <= float(x) < 1.2 for x in timed), r.stderr[-2000:]
        stamps = [float(t) for t, _ in lines]
        spans[devices] = max(stamps) - min(stamps)
    # ~14 sleeps of 0.6 s: ~8.5 s on one worker, about half on two.
    assert spans["cpu0,cpu1"] <= 0.7 * spans["cpu0"], spans


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_workers_take_whole_compile_classes_first(n):
    # Shapes that share compiled kernels (same head dim, causal, dtype, ...) go to one worker, so two
    # workers do not compile the same configs (the 1.10x of the first 2-GPU run): every worker visits
    # every shape once, its own share first, and with at least as many classes as workers no class
    # is split.
    from tuner.fleet import compile_class, worker_order, worker_shares

    shapes = [Problem.standard(s, hd, causal=c) for s in (1024, 2048, 4096) for hd in (64, 128) for c in (False, True)]
    orders = [worker_order(worker_shares(shapes, n), k) for k in range(n)]
    for order in orders:
        assert sorted(p.key() for p in order) == sorted(p.key() for p in shapes)
    counts = [0] * n
    first = []
    for k, order in enumerate(orders):
        # A worker's own share: the shapes no other worker lists ahead of its own position.
        own = [p for i, p in enumerate(order) if all(o.index(p) > i for j, o in enumerate(orders) if j != k)]
        assert order[:len(own)] == own
        counts[k] = len(own)
        first += own
    assert sorted(p.key() for p in first) == sorted(p.key() for p in shapes)  # shares cover all, no overlap
    classes_of = [{compile_class(p) for p in o[:c]} for o, c in zip(orders, counts)]
    if n <= 4:  # 4 classes of 3 shapes
        for a in range(n):
            for b in range(a + 1, n):
                assert not classes_of[a] & classes_of[b], "a compile class was split between workers"
    assert max(counts) - min(counts) <= 3


def test_a_study_gets_the_same_proposals_whatever_the_fleet_size(tmp_path):
    """The worker that owns a study samples with the seed a single-GPU run uses, so 1 and 2 GPUs
    propose the same configs there (the same kernels compiled, winners comparable); a worker that
    helps on another's study samples with a seed of its own, not in lockstep with the owner."""
    from tuner.fleet import sampler_seed, worker_shares
    from tuner.study import default_storage

    problems = [RECORDED[0], RECORDED[2]]  # two compile classes (hd64, hd128): one per worker
    seqs = {}
    for devices in ("cpu0", "cpu0,cpu1"):
        db = f"sqlite:///{tmp_path / (devices + '.db')}"
        # Measurements that take time, as on a GPU: with instant ones, a worker that started a
        # second later than the other (a loaded CI host) found its own study filled by the other
        # worker, which had finished its share and come to help (4 own proposals of 12 in one run).
        r = fa4_tune("--shapes", shapes_file(tmp_path, problems), "--provider", "plugin:tests.tuner.fake_providers:SlowReplay",
                     "--devices", devices, "--sampler", "random", "--trials", "12", "--db", db, "--json",
                     env_extra={"FA4_LOCK_DIR": str(tmp_path / "locks"), "FA4_TEST_SLOW_S": "0.5"})
        assert r.returncode == 0, r.stderr
        owners = {p.key(): f"cpu{k}" for k, share in enumerate(worker_shares(problems, devices.count(",") + 1))
                  for p in share}
        for res in json.loads(r.stdout)["results"]:
            key = Problem.from_dict(res["problem"]).key()
            trials = sorted(load(default_storage(db), res["study_name"]).trials, key=lambda t: t.number)
            # The owner's own proposals, in its order (the enqueued default is not a proposal).
            seqs[devices, key] = [t.params for t in trials if t.user_attrs.get("worker") == owners[key]
                                  and not t.user_attrs.get("enqueued_default")]
    for p in problems:
        one, two = seqs["cpu0", p.key()], seqs["cpu0,cpu1", p.key()]
        assert len(two) >= 6 and two == one[:len(two)], (p.key(), one, two)
    assert sampler_seed(0, "random", True, 1) == 0 != sampler_seed(0, "random", False, 1)
    assert sampler_seed(0, "random", False, 0) != sampler_seed(0, "random", False, 1)
    assert sampler_seed(5, "grid", False, 1) == 5


def test_preflight_failure_stops_the_started_workers(tmp_path, monkeypatch):
    # The parent's provider check runs while the workers start (its imports overlap theirs); when it
    # says no, the workers are killed and the caller gets the reason, not a half-run fleet.
    from tuner.fleet import Unavailable, run_fleet
    from tuner.study import default_storage

    monkeypatch.setenv("FA4_LOCK_DIR", str(tmp_path / "locks"))
    spawned = []
    db = f"sqlite:///{tmp_path / 'r.db'}"
    with ResultsStore.open(db):
        pass
    with pytest.raises(Unavailable, match="not available: test says no"):
        run_fleet([Slot("cpu0", "", "virtual-cpu0"), Slot("cpu1", "", "virtual-cpu1")], [RECORDED[0]],
                  provider_spec="replay", db=db, storage=default_storage(db), sampler="random", trials=50,
                  preflight=lambda: "replay is not available: test says no",
                  on_spawn=lambda slot, proc: spawned.append(proc))
    assert len(spawned) == 2 and all(p.poll() is not None for p in spawned)
    fd = acquire(Slot("cpu0", "", "virtual-cpu0"))  # the locks were let go
    os.close(fd)


def test_log_lines_are_written_whole(monkeypatch):
    # Workers and the parent share one stderr. print() hands the text and its newline to the file
    # separately, and stderr passes each write straight to the OS, so two workers' lines met
    # mid-line in a CI run ("...[time 0.60s][cpu0 +2.1s] ..."); a log line is one write.
    from tuner import fleet

    writes = []

    class Recorder:
        def write(self, s):
            writes.append(s)

        def flush(self):
            writes.append(None)

    monkeypatch.setattr(sys, "stderr", Recorder())
    fleet._say("[cpu1 +2.1s] b2_sq8192 trial 1: ok 586.8 TFLOP/s")
    assert writes == ["[cpu1 +2.1s] b2_sq8192 trial 1: ok 586.8 TFLOP/s\n", None]
