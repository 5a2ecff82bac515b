"""fa4.record_shapes: the problems a program runs, with call counts and time shares, for fa4-tune."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fa4
from fa4 import launch, record
from fa4.problem import Problem
from tuner.shapes import load_shapes

ROOT = Path(__file__).resolve().parents[2]


@record.observed("fwd")
def fake_forward(q, k, v, softmax_scale, causal, return_lse, config, out, work=0):
    """A launch path with the real one's signature, whose cost is ``work`` matrix products."""
    for _ in range(work):
        torch.mm(torch.ones(96, 96), torch.ones(96, 96))
    return torch.zeros_like(q)


class _Cfg:
    deterministic = True


@record.observed("bwd")
def fake_backward(dout, q, k, v, out, lse, softmax_scale, causal, config):
    return q, k, v


def qkv(b, s, h, d, hkv=None, sk=None):
    q = torch.zeros(b, s, h, d, dtype=torch.bfloat16)
    k = torch.zeros(b, sk or s, hkv or h, d, dtype=torch.bfloat16)
    return q, k, k.clone()


def test_the_launch_paths_are_recorded():
    assert launch._forward.__wrapped__ and launch._backward.__wrapped__


def test_records_each_problem_with_calls_and_time_share(tmp_path):
    path = tmp_path / "shapes.json"
    big, small = qkv(2, 256, 8, 128, hkv=2), qkv(1, 64, 4, 64)
    with fa4.record_shapes(path) as rec:
        assert record.active() is rec
        for _ in range(3):
            fake_forward(*big, None, True, False, None, None, work=40)
        fake_forward(*small, None, False, False, None, None, work=1)
        fake_backward(torch.zeros(2, 256, 8, 128), *big, None, None, None, True, _Cfg())
    assert record.active() is None
    doc = json.loads(path.read_text())
    assert doc["format"] == record.FORMAT
    rows = doc["shapes"]
    got = {Problem.from_dict(r["problem"]).key(): r for r in rows}
    fwd = Problem(batch=2, seqlen_q=256, seqlen_k=256, heads_q=8, heads_kv=2, head_dim=128, head_dim_v=128,
                  causal=True)
    bwd = Problem(**{**fwd.to_dict(), "pass_": "bwd", "deterministic": True}) if "pass_" in fwd.to_dict() else None
    assert got[fwd.key()]["calls"] == 3
    assert [r["calls"] for r in rows if r["problem"]["head_dim"] == 64] == [1]
    assert sum(1 for k in got if k.endswith("_det_bwd")) == 1 and (bwd is None or bwd.key() in got)
    # Most time first; shares of the whole recorded time.
    assert [r["gpu_ms"] for r in rows] == sorted((r["gpu_ms"] for r in rows), reverse=True)
    assert rows[0]["problem"] == fwd.to_dict()
    assert sum(r["share"] for r in rows) == pytest.approx(1.0, abs=1e-4)
    assert doc["total_gpu_ms"] == pytest.approx(sum(r["gpu_ms"] for r in rows), abs=1e-3)
    # fa4-tune --shapes takes the file: the problems in order of time share.
    assert [p.key() for p in load_shapes(path, {})] == [Problem.from_dict(r["problem"]).key() for r in rows]


def test_nothing_is_recorded_outside_a_recording(tmp_path):
    with fa4.record_shapes(tmp_path / "a.json"):
        pass
    fake_forward(*qkv(1, 64, 4, 64), None, False, False, None, None)
    assert json.loads((tmp_path / "a.json").read_text())["shapes"] == []


def test_an_environment_variable_records_an_unmodified_script(tmp_path):
    path = tmp_path / "env.json"
    code = ("import torch, tests.fa4.test_record as t\n"
            "for _ in range(2): t.fake_forward(*t.qkv(1, 128, 4, 128), None, True, False, None, None)\n")
    env = dict(os.environ, FA4_RECORD_SHAPES=str(path), PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=120)
    rows = json.loads(path.read_text())["shapes"]
    assert len(rows) == 1 and rows[0]["calls"] == 2 and rows[0]["problem"]["seqlen_q"] == 128
