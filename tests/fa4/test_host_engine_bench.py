"""bench/host_engine.py on the CPU machine: each loop adds exactly one of our Function's features to
the loop before it (the differences it prints are read as those features' costs), and our launches
run only in the loops that name them. The launches are CPU stand-ins that record their calls."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.fa4 import cpu_kernels

B, S, H, D = 1, 16, 2, 8


def _loops(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))  # its host_cost import
    mod = cpu_kernels.bench_module(monkeypatch, "host_engine")
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(B, S, H, D, generator=g) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    calls = []

    def fwd_ours(q, k, v):
        calls.append("fwd")
        return q * 2, torch.full((B, H, S), 3.0)

    def bwd_ours(dout, q, k, v, o, lse):
        calls.append(("bwd", dout, q, k, v, o, lse))
        return dout * 5, k * 0 + 6, v * 0 + 7

    def with_grad():
        calls.append("with_grad")
        return qg * 1 + kg * 2 + vg * 3

    def via_api():
        calls.append("via_api")
        return qg * 1 + kg * 2 + vg * 3

    loops = mod.engine_loops(qg, kg, vg, do, (B, H, S), fwd_ours, bwd_ours, with_grad, via_api)
    return loops, calls, (qg, kg, vg, do)


def test_each_loop_runs_only_the_launches_it_names(monkeypatch):
    loops, calls, _ = _loops(monkeypatch)
    want = {"e0": [], "e1": [], "e2": [], "e3": [], "e4": ["fwd"], "e5": ["bwd"], "e6": ["fwd", "bwd"],
            "e7": ["with_grad"], "e8": ["via_api"], "d1": [], "d2": []}
    assert [name[:2] for name in loops] == list(want)
    for name, fn in loops.items():
        calls.clear()
        fn()
        assert [c if isinstance(c, str) else c[0] for c in calls] == want[name[:2]], name


def test_the_floor_passes_do_through_and_every_later_loop_returns_fresh_grads(monkeypatch):
    loops, _, (qg, kg, vg, do) = _loops(monkeypatch)
    names = list(loops)
    floor = loops[names[0]]()
    assert all(t.data_ptr() == do.data_ptr() for t in floor)  # e0: dO itself, three times
    for name in names[1:4]:  # e1-e3: three fresh tensors of the inputs' shapes
        grads = loops[name]()
        assert len({t.data_ptr() for t in grads} | {do.data_ptr()}) == 4, name
        assert [t.shape for t in grads] == [qg.shape, kg.shape, vg.shape], name
    # d1: three distinct tensors made before backward ran; d2: three views of dO itself.
    d1 = loops[next(n for n in names if n.startswith("d1"))]()
    assert len({t.data_ptr() for t in d1} | {do.data_ptr()}) == 4
    d2 = loops[next(n for n in names if n.startswith("d2"))]()
    assert all(t.data_ptr() == do.data_ptr() for t in d2) and len({id(t) for t in d2} | {id(do)}) == 4


def test_our_backward_gets_what_the_forward_saved_and_its_grads_reach_the_caller(monkeypatch):
    loops, calls, (qg, kg, vg, do) = _loops(monkeypatch)
    e6 = next(fn for name, fn in loops.items() if name.startswith("e6"))
    calls.clear()
    dq, dk, dv = e6()
    (_, dout, q, k, v, o, lse), = [c for c in calls if not isinstance(c, str)]
    assert torch.equal(dout, do)
    assert torch.equal(q, qg.detach()) and torch.equal(k, kg.detach()) and torch.equal(v, vg.detach())
    assert torch.equal(o, qg.detach() * 2)  # the forward launch's O, saved and unpacked
    assert torch.equal(lse, torch.full((B, H, S), 3.0))
    assert torch.equal(dq, do * 5) and torch.equal(dk, torch.full_like(dk, 6.0)) and torch.equal(dv, torch.full_like(dv, 7.0))
    # The API loops differentiate what they return: d(q + 2k + 3v) against dO.
    e8 = next(fn for name, fn in loops.items() if name.startswith("e8"))
    gq, gk, gv = e8()
    assert torch.equal(gq, do) and torch.equal(gk, 2 * do) and torch.equal(gv, 3 * do)


def test_main_wires_our_launches_into_the_loops_and_prints_each_time(monkeypatch, capsys):
    """main() with the GPU faked: CUDA tensors made on the CPU, our launch entry points replaced by
    stand-ins that record their arguments, the timer returning a different figure a loop."""
    import sys

    import fa4
    from fa4 import launch

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    mod = cpu_kernels.bench_module(monkeypatch, "host_engine")
    randn = torch.randn
    monkeypatch.setattr(mod.torch, "randn", lambda *s, device=None, dtype=None: randn(*s).to(dtype))
    seen = []
    monkeypatch.setattr(launch, "bwd_config_for", lambda *a: seen.append(("cfg", a[3:])) or "CFG")
    monkeypatch.setattr(launch, "_forward", lambda q, k, v, scale, causal, lse, *a: seen.append(
        ("fwd", scale, causal, lse)) or (q * 1, torch.zeros(q.shape[0], q.shape[2], q.shape[1])))
    monkeypatch.setattr(launch, "_backward", lambda dout, q, k, v, o, lse, scale, causal, det, cfg: seen.append(
        ("bwd", scale, causal, det, cfg)) or (dout * 1, dout * 1, dout * 1))
    monkeypatch.setattr(launch, "_with_grad", lambda q, k, v, *a: seen.append(("with_grad", a)) or q + k + v)
    monkeypatch.setattr(fa4, "flash_attn_func", lambda q, k, v, **kw: seen.append(("api", kw)) or q + k + v)
    ticks = iter(range(1, 100))
    monkeypatch.setattr(mod, "warm_per_call_us", lambda fn, calls: (fn(), 10.0 * next(ticks))[1])
    monkeypatch.setattr(sys, "argv", ["host_engine.py", "--shape", "1,16,2,64"])
    assert mod.main() == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:2] in {f"e{i}" for i in range(9)}]
    assert [r[0] for r in rows] == [f"e{i}" for i in range(9)]
    # Each loop timed twice (engine threads on, then off): e0 10 / 20, e1 30 / 40, ... e8 170 / 180.
    assert [(float(r[-2]), float(r[-1])) for r in rows[:1] + rows[4:]] == [
        (10.0 + 20 * i, 20.0 + 20 * i) for i in (0, 4, 5, 6, 7, 8)]
    assert out.count("( +20.0 /  +20.0)") == 3  # e1-e3 print their step over the loop before
    assert ("cfg", (True, False, None)) in seen
    assert ("fwd", 1.0 / 8.0, True, True) in seen and ("bwd", 1.0 / 8.0, True, False, "CFG") in seen
    assert ("with_grad", (None, True, False, None, None, False, None)) in seen
    assert ("api", {"provider": "fa4", "causal": True}) in seen


def test_rows_time_each_loop_with_the_engine_threads_on_then_off_and_step_from_the_loop_before(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    mod = cpu_kernels.bench_module(monkeypatch, "host_engine")
    seen = []

    def timer(fn, calls):
        # What the engine's mode is while a loop is timed: the fake's "cost" depends on it.
        threads = torch.autograd.is_multithreading_enabled()
        seen.append((fn(), threads, calls))
        return fn() * (2.0 if threads else 1.0)

    loops = {"e0 floor": lambda: 10.0, "e1 + fresh grads": lambda: 15.0, "e4 later": lambda: 40.0,
             "e5 fails": lambda: 1 / 0}
    rows = mod.timed_rows(loops, 7, timer=timer)
    assert [(v, t) for v, t, _ in seen] == [(10.0, True), (10.0, False), (15.0, True), (15.0, False),
                                           (40.0, True), (40.0, False)]
    assert {c for _, _, c in seen} == {7}
    assert torch.autograd.is_multithreading_enabled()  # restored after each loop
    assert rows[0].split()[-2:] == ["20.0", "10.0"]
    assert rows[1].split()[-6:] == ["30.0", "15.0", "(", "+10.0", "/", "+5.0)"]  # e1's step from e0, on / off
    assert rows[2].split()[-2:] == ["80.0", "40.0"]  # e4: no step printed
    assert "n/a (ZeroDivisionError" in rows[3]


def test_profile_runs_exactly_the_named_loops_under_the_profiler(monkeypatch, capsys):
    import sys
    import types

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    mod = cpu_kernels.bench_module(monkeypatch, "host_engine")
    profiled = []
    fake = types.ModuleType("host_profile")
    fake.profile = lambda fn, calls, label, top: profiled.append((label[:2], calls, len(fn())))
    monkeypatch.setitem(sys.modules, "host_profile", fake)
    monkeypatch.setattr(mod, "tiny_inputs", lambda shape: ((1, 16, 2, 8), (None,) * 4, tuple(
        torch.randn(1, 16, 2, 8).requires_grad_(True) for _ in range(3))))
    monkeypatch.setattr(mod, "engine_loops", lambda qg, *a, **kw: {
        f"e{i} loop": (lambda i=i: (qg,) * (i + 1)) for i in range(9)})
    monkeypatch.setattr(mod, "timed_rows", lambda loops, calls: [])
    from fa4 import launch
    monkeypatch.setattr(launch, "bwd_config_for", lambda *a: "CFG")
    monkeypatch.setattr(sys, "argv", ["host_engine.py", "--profile", "e1,e6", "--calls", "5000"])
    assert mod.main() == 0
    assert profiled == [("e1", 300, 2), ("e6", 300, 7)]  # each named loop once, at most 300 calls
