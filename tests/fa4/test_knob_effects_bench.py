"""bench/knob_effects.py on the CPU machine (CUDA tensors and triton faked): a model's exact shape
(SEQLEN:HDIM:CAUSAL:BATCH:HEADS), the peers timed in the same rotated rounds, the ratios to our
default, and the correctness gate (session 24's first call gated a causal default's mask_bits on a
non-causal case and refused every variant)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys

import torch

from tests.fa4 import cpu_kernels


def _run(monkeypatch, tmp_path, capsys, ms, argv, gate=None):
    """main() with each call advancing a fake clock by ``ms(provider, config)``; do_bench reports
    one call's advance. ``gate(config, causal)``: the faked check_fwd.check_case verdict.
    Returns (EFFECT rows, printed lines, the calls in order)."""
    mod = cpu_kernels.bench_module(monkeypatch, "knob_effects")
    import fa4

    clock = [0.0]
    calls = []

    def fake_call(q, k, v, provider="auto", causal=False, config=None):
        calls.append((provider, config, tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        clock[0] += ms(provider, config)
        return q

    def do_bench(fn, **kw):
        t0 = clock[0]
        fn()
        return clock[0] - t0

    sys.modules["triton.testing"].do_bench = do_bench
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *s, device=None, **kw: randn(*s, **kw))
    monkeypatch.setattr(fa4, "flash_attn_func", fake_call)
    if gate is not None:
        fake = tmp_path / "check_fwd.py"
        fake.write_text("GATE = None\ndef check_case(B, Sq, Sk, Hq, Hkv, D, causal, dtype, config):\n"
                        "    return GATE(config, causal), 'faked'\n")
        real = importlib.util.spec_from_file_location
        monkeypatch.setattr(importlib.util, "spec_from_file_location", lambda name, path: real(name, fake))
        real_exec = importlib.machinery.SourceFileLoader.exec_module

        def exec_module(loader, module):
            real_exec(loader, module)
            module.GATE = gate

        monkeypatch.setattr(importlib.machinery.SourceFileLoader, "exec_module", exec_module)
    monkeypatch.setattr(sys, "argv", ["knob_effects.py", *argv])
    mod.main()
    out = capsys.readouterr().out.splitlines()
    rows = [json.loads(x[len("EFFECT "):]) for x in out if x.startswith("EFFECT ")]
    return rows, out, calls


def _ms(provider, config):
    if provider != "fa4":
        return {"cudnn": 0.090, "flash-attn-4": 0.110}[provider]
    return 0.080 if config.ctas_per_sm == 2 else 0.100


def test_exact_shape_peers_and_ratios(monkeypatch, tmp_path, capsys):
    variants = [{}, {"ctas_per_sm": 2, "tile_m": 128, "tile_n": 64, "p_operand": "smem"}, {"tile_n": 96, "ctas_per_sm": 2}]
    rows, out, calls = _run(monkeypatch, tmp_path, capsys, _ms,
                            ["--shapes", "1024:64:1:3:2", "--rounds", "3", "--peers", "cudnn,flash-attn-4",
                             "--variants", json.dumps(variants)])
    # The exact shape: batch 3, 2 heads (not the 16k-token convention's 64 x 32).
    assert {c[2] for c in calls} == {(3, 1024, 2, 64)}
    assert all(r["batch"] == 3 and r["heads"] == 2 for r in rows)
    by = {r["change"]: r for r in rows}
    assert set(by) == {"default", json.dumps(variants[1]), "cudnn", "flash-attn-4"}
    assert any(x.startswith("SKIP infeasible") and "ctas_per_sm 2" in x for x in out)  # tile_n 96 spills
    assert by["default"]["vs_default"] == 1.0
    assert by[json.dumps(variants[1])]["vs_default"] == 1.25  # 0.100 / 0.080
    assert by["cudnn"]["vs_default"] == 1.111 and by["flash-attn-4"]["vs_default"] == 0.909
    assert all(len(r["rounds"]) == 3 for r in rows)
    # Rotated rounds: after the first call of each entry (its warm-up), three rounds of four
    # timed calls, each round starting one entry later.
    timed = [("default" if c[1] is None or c[1].ctas_per_sm == 1 else "c2") if c[0] == "fa4" else c[0]
             for c in calls[4:]]
    assert [timed[i * 4] for i in range(3)] == ["default", "c2", "cudnn"]


def test_the_gate_checks_the_shapes_own_mask_and_drops_wrong_variants(monkeypatch, tmp_path, capsys):
    seen = []

    def gate(config, causal):
        seen.append(causal)
        return config.kv_stages == 2  # the kv_stages 3 variant "fails" the reference

    rows, out, _ = _run(monkeypatch, tmp_path, capsys, _ms,
                        ["--shapes", "512:64:1:2:2", "--check", "--variants", '[{}, {"kv_stages": 3}]'], gate)
    # The causal default carries mask_bits: checked causal only (a non-causal check would refuse it).
    assert seen == [True, True]
    assert [r["change"] for r in rows] == ["default"]
    assert any(x.startswith("INCORRECT") and "kv_stages" in x for x in out)


def test_gqa_shape_gives_k_and_v_the_kv_heads(monkeypatch, tmp_path, capsys):
    """SEQLEN:HDIM:CAUSAL:BATCH:HEADS:KV_HEADS: k and v carry the K/V heads (Llama-3-8B's 32/8), and the
    default is that GQA problem's."""
    from fa4.problem import Problem
    from fa4.sm90.fwd_config import default_config

    rows, out, calls = _run(monkeypatch, tmp_path, capsys, _ms,
                            ["--shapes", "2048:128:1:1:32:8", "--variants", json.dumps([{}, {"head_swizzle": 1}])])
    assert {c[2:] for c in calls} == {((1, 2048, 32, 128), (1, 2048, 8, 128), (1, 2048, 8, 128))}
    assert all(r["heads"] == 32 and r["heads_kv"] == 8 for r in rows)
    want = default_config(Problem.standard(2048, 128, causal=True, batch=1, heads_q=32, heads_kv=8))
    assert want.head_swizzle == 8  # the causal hd128 default (8 heads' K/V fit L2)
    assert {c[1] for c in calls if c[1] is not None} == {want, dataclasses.replace(want, head_swizzle=1)}
    assert {r["change"] for r in rows} == {"default", json.dumps({"head_swizzle": 1})}
