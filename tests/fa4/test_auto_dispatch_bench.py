"""bench/auto_dispatch.py on the CPU machine (CUDA tensors, events and triton faked): issue 20's
auto bar. A row where our own call or auto's cannot run must fail the run (session 23's first try
ran with the CuTe DSL off the path: every fa4 and auto call raised, and the script still printed
"0 slower" and exited 0), and --loop times back-to-back calls between two events."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.fa4 import cpu_kernels

GPT2 = "seqlen,hdim,batch,heads,heads_kv,seqlen_k,causal,dtype,pass\n1024,64,2,2,2,1024,1,bf16,fwd\n"


class _Clock:
    """CUDA events on a fake GPU clock that the faked calls advance."""

    now = 0.0

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = _Clock.now

        def elapsed_time(self, other):
            return other.t - self.t


def _run(monkeypatch, tmp_path, ms, broken=(), argv=()):
    """main() over one GPT-2-like row; ``ms`` per provider is what one call advances the clock;
    the providers in ``broken`` raise. Returns (rc, printed text, providers called)."""
    mod = cpu_kernels.bench_module(monkeypatch, "auto_dispatch")
    import fa4

    shapes = tmp_path / "shapes.csv"
    shapes.write_text(GPT2)
    called = []

    def fake_call(q, k, v, causal=False, provider="auto"):
        called.append(provider)
        if provider in broken:
            raise ModuleNotFoundError("No module named 'cutlass'")
        _Clock.now += ms[provider]
        return q + 0.0 * (k.sum() + v.sum())  # on the autograd graph of all three

    class Choice:
        fwd = train = "fa4"

    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *s, device=None, **kw: randn(*s, **kw))
    monkeypatch.setattr(fa4, "flash_attn_func", fake_call)
    monkeypatch.setattr(fa4, "explain_auto", lambda *a, **kw: Choice())
    monkeypatch.setattr(torch.cuda, "Event", _Clock.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    # do_bench: one call's clock advance, as a flushed rep times it.
    sys.modules["triton.testing"].do_bench = lambda fn, **kw: (lambda t0: (fn(), _Clock.now - t0)[1])(_Clock.now)
    monkeypatch.setattr(sys, "argv", ["auto_dispatch.py", "--db", f"sqlite:///{tmp_path}/x.db", "--shapes",
                                      str(shapes), "--rounds", "2", *argv])
    rc = mod.main()
    return rc, called


def test_a_row_where_fa4_and_auto_cannot_run_fails_the_run(monkeypatch, tmp_path, capsys):
    ms = {"fa4": 0.1, "flash-attn-4": 0.1, "cudnn": 0.09, "fa2": 0.13, "auto": 0.1}
    rc, _ = _run(monkeypatch, tmp_path, ms, broken=("fa4", "flash-attn-4", "auto"))
    out = capsys.readouterr().out
    assert rc == 1
    assert "fa4 and auto CANNOT RUN" in out
    assert "or fa4 or auto cannot run: 2" in out  # the forward and the forward + backward rows


def test_auto_within_noise_of_the_fastest_passes_and_a_slower_auto_fails(monkeypatch, tmp_path, capsys):
    ms = {"fa4": 0.100, "flash-attn-4": 0.104, "cudnn": 0.099, "fa2": 0.134, "auto": 0.101}
    rc, _ = _run(monkeypatch, tmp_path, ms)
    out = capsys.readouterr().out
    assert rc == 0 and ": 0" in out.splitlines()[-1]
    ms["cudnn"] = 0.085
    rc, _ = _run(monkeypatch, tmp_path, ms)
    out = capsys.readouterr().out
    assert rc == 1 and "SLOWER" in out
    line = next(x for x in out.splitlines() if x.startswith("B2 Sq1024 Sk1024 H2/2 d64 causal fwd:"))
    assert "auto/fastest 1.188" in line  # 0.101 / 0.085


@pytest.mark.parametrize("n", [1, 7])
def test_loop_times_n_back_to_back_calls_per_call(monkeypatch, tmp_path, capsys, n):
    ms = {"fa4": 0.1, "flash-attn-4": 0.2, "cudnn": 0.3, "fa2": 0.4, "auto": 0.1}
    rc, called = _run(monkeypatch, tmp_path, ms, argv=("--loop", str(n)))
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("B2 Sq1024 Sk1024 H2/2 d64 causal fwd:"))
    assert "fa4 0.100 ms, flash-attn-4 0.200 ms, cudnn 0.300 ms, fa2 0.400 ms, auto 0.100 ms" in line
    assert f"({n} back-to-back calls)" in out and "do_bench" not in out
    # Per provider and kind: 3 checks, then per round 3 warm-up calls and n timed ones.
    assert called.count("cudnn") == 2 * (3 + 2 * (3 + n))
    assert rc == 0
