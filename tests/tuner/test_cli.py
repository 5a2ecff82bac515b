"""fa4-tune through a subprocess, as a user runs it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fa4.arch import SM90
from fa4.knobs import VIOLATION_KINDS, config_to_dict
from fa4.problem import Problem
from tests.tuner.synthetic import best_synthetic, write_synthetic
from providers import get_provider

ROOT = Path(__file__).resolve().parents[2]


def fa4_tune(*args, env_extra=None, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["CUDA_VISIBLE_DEVICES"] = ""  # behave as on a machine without a GPU
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--seqlen", "-8", "--hdim", "128"], "--seqlen must be a positive integer, got -8"),
        (["--seqlen", "8192", "--hdim", "128", "--batch", "0"], "--batch must be a positive integer"),
        (["--seqlen", "8192", "--hdim", "100"], "head_dim 100 not supported by fa4"),
        (["--seqlen", "8192", "--hdim", "128", "--provider", "nope"], "unknown provider 'nope'"),
        # A name that looks like module:attr imports nothing; the plugin form loads Provider classes only.
        (["--seqlen", "8192", "--hdim", "128", "--provider", "os:system"], "unknown provider 'os:system' (known: "),
        (["--seqlen", "8192", "--hdim", "128", "--provider", "plugin:os:getcwd"],
         "'plugin:os:getcwd' is not a Provider subclass"),
        (["--seqlen", "8192", "--hdim", "128", "--provider", "replay", "--storage", "/proc/nope/x.journal"],
         "cannot open the Optuna storage /proc/nope/x.journal: FileNotFoundError"),
        (["--seqlen", "8192"], "--hdim"),
        (["--seqlen", "8192", "--hdim", "128", "--sampler", "anneal"], "invalid choice: 'anneal'"),
        (["--seqlen", "8192", "--hdim", "128", "--heads", "16", "--heads-kv", "5"], "multiple of heads_kv"),
        (["--seqlen", "8192", "--hdim", "128", "--deterministic"], "--pass bwd"),
        (["--seqlen", "8192", "--hdim", "128", "--dtype", "fp8"], "invalid choice: 'fp8'"),
        (["--seqlen", "8192", "--hdim", "128", "--pass", "bwd", "--provider", "fa2", "--deterministic"],
         "no deterministic backward"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(args, needle):
    r = fa4_tune(*args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("fa4-tune: error: ") and needle in lines[0]
    assert r.stdout == ""


def test_without_gpu_checks_feasibility_and_says_timing_needs_a_gpu(tmp_path):
    """The default provider is our kernels, also without a GPU: their feasible space, what
    rejected the rest (by the rule that did, none unclassified), and compiled kernels."""
    db = tmp_path / "r.db"
    r = fa4_tune("--seqlen", "8192", "--hdim", "128", "--trials", "2", "--db", f"sqlite:///{db}")
    assert r.returncode == 0, r.stderr
    p = get_provider("fa4")
    prob = Problem.standard(8192, 128)
    assert r.stdout.startswith("fa4-tune: fa4 on sm90 (no CUDA GPU here)"), r.stdout
    n_feasible = len(p.feasible_configs(prob, SM90))
    assert f"{n_feasible} feasible" in r.stdout
    assert "Timing needs a CUDA GPU" in r.stdout
    assert p.describe(p.default_config(prob, SM90)) in r.stdout
    kinds = re.findall(r"^  rejected by ([a-z ]+): (\d+) configs \((\d+) by it alone", r.stdout, re.M)
    assert {k for k, _, _ in kinds} >= {"shared memory", "registers", "knob combination"}, r.stdout
    assert all(k in VIOLATION_KINDS for k, _, _ in kinds), r.stdout
    assert "compile-only: 2 of 2 kernels compiled for sm90" in r.stdout, r.stdout
    assert not db.exists()  # nothing pretended to be measured


def test_without_gpu_json(tmp_path):
    r = fa4_tune("--seqlen", "4096", "--hdim", "64", "--causal", "--json", "--trials", "1")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    prob = Problem.standard(4096, 64, causal=True)
    assert rep["problem"] == prob.to_dict() and rep["provider"] == "fa4"
    p = get_provider("fa4")
    feasible = p.feasible_configs(prob, SM90)
    assert rep["feasible"] == len(feasible)
    assert rep["configs"] == rep["feasible"] + rep["infeasible"]
    assert rep["default"]["config"] == config_to_dict(p.default_config(prob, SM90))
    assert "timing needs a CUDA GPU" in rep["timing"]
    # Each kind counts the configs it rejects, once per config; the configs only it rejects add
    # up to at most the infeasible total.
    reasons = rep["infeasible_reasons"]
    assert sum(r["only"] for r in reasons.values()) <= rep["infeasible"] <= sum(r["count"] for r in reasons.values())
    assert set(reasons) <= set(VIOLATION_KINDS)


def test_replay_end_to_end_and_resume(tmp_path):
    prob = Problem.standard(8192, 128)
    rec = write_synthetic(tmp_path / "rec.json", [prob])
    args = ["--seqlen", "8192", "--hdim", "128", "--provider", f"replay:{rec}",
            "--db", f"sqlite:///{tmp_path / 'r.db'}"]
    r = fa4_tune(*args, "--trials", "30", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["best"]["config"] == config_to_dict(best_synthetic(prob))
    assert res["trials"] == 30 and res["resumed_with"] == 0
    assert res["db_url"].endswith("r.db") and res["storage"].endswith("r.optuna.journal")
    r2 = fa4_tune(*args, "--trials", "40", "--json")  # same study, larger budget
    res2 = json.loads(r2.stdout)
    assert r2.returncode == 0 and res2["resumed_with"] == 30 and res2["trials"] == 40
    table = fa4_tune(*args, "--trials", "40")  # human table
    assert table.returncode == 0
    for needle in ("default", "best", "speedup best/default", "results DB:", "Optuna study:",
                   "best config: the default with tile_n=160\n"):
        assert needle in table.stdout


def test_a_time_budget_stops_the_trials_and_skips_the_shapes_after_it(tmp_path):
    """--budget-s: no trial starts once the budget is spent; the shapes not reached are named."""
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("seqlen,hdim,batch,heads\n8192,128,2,16\n8192,64,2,32\n")
    r = fa4_tune("--shapes", str(shapes), "--provider", "plugin:tests.tuner.fake_providers:SlowReplay", "--trials", "30",
                 "--budget-s", "8", "--verify-rounds", "0", "--db", f"sqlite:///{tmp_path / 'r.db'}", "--json",
                 env_extra={"FA4_TEST_SLOW_S": "0.5"})
    assert r.returncode == 0, r.stderr
    (res,) = json.loads(r.stdout)["results"]
    assert res["out_of_time"] and 1 <= res["trials"] < 30
    assert "b2_sq8192_sk8192_hq32_hkv32_d64_dv64_bf16_full_nondet_fwd not tuned" in r.stderr, r.stderr
    bad = fa4_tune("--seqlen", "1024", "--hdim", "64", "--budget-s", "0")
    assert bad.returncode == 2 and "--budget-s must be a positive number of seconds, got 0" in bad.stderr
