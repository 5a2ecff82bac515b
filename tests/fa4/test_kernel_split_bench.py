"""bench/kernel_split.py on the CPU machine (the GPU, its profiler and triton faked): each --variants
entry runs our backward again with the default config's knobs overridden, beside the default and
the reference, and every side's kernel table is reported under its own name."""

from __future__ import annotations

import dataclasses
import json

from fa4.problem import Problem
from fa4.sm90.bwd_defaults import default_config
from tests.fa4 import cpu_kernels

LLAMA = Problem(1, 8192, 8192, 32, 8, 128, 128, causal=True, pass_="bwd")


def test_variants_are_profiled_with_their_overrides(monkeypatch, tmp_path, capsys):
    mod = cpu_kernels.bench_module(monkeypatch, "kernel_split")
    ran = []
    base = default_config(LLAMA)

    def ours(cfg):
        ran.append(cfg)

    def setup(name, det):
        return ours, lambda: ran.append("ref"), base, 2e12

    monkeypatch.setattr(mod.bwd_order, "setup", setup)
    # The profiler's table stood in for by one call: a side's time says which config ran.
    monkeypatch.setattr(mod, "kernel_times",
                        lambda fn, calls: (fn(), {"main": 100.0 if ran[-1] == base else 90.0, "post": 5.0})[1])
    out = tmp_path / "rows.json"
    mod.main(["--shapes", "llama3-8b-8k", "--calls", "2", "--out", str(out),
              "--variants", '[{"gqa_finish": "last_cta"}, {"gqa_reduce": "loop", "head_swizzle": 1}]'])
    assert ran == [base, "ref", dataclasses.replace(base, gqa_finish="last_cta"),
                   dataclasses.replace(base, gqa_reduce="loop", head_swizzle=1)]
    (row,) = json.loads(out.read_text())
    assert set(row) == {"name", "config", "flops", "ours", "ref", "ours gqa_finish=last_cta",
                        "ours gqa_reduce=loop,head_swizzle=1"}
    assert row["ours"] == {"main": 100.0, "post": 5.0} and row["ours gqa_finish=last_cta"]["main"] == 90.0
    text = capsys.readouterr().out
    # 95 us for 2 TFLOP: 21052.6 TFLOP/s (the figure is flops / total, whatever the units' scale).
    assert "ours gqa_finish=last_cta:     95.0 us per backward" in text
