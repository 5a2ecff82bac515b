"""What the autograd engine charges our Function on the tiny problem, one feature at a time.

    cd bench && python3 host_engine.py [--calls 2000] [--shape 1,128,4,128]

Session 39 (bench/host_floor.py, H100 host): our forward + backward host paths cost 62 us a call
without the engine and 197 us through it, while the engine's floor (a do-nothing Function) is 64.
Each loop here is torch.autograd.grad(outputs, (q, k, v), dO) through a Function that adds one
feature of ours to the one before (us a call, 2,000 calls then one sync, lower of two loops):

- e0: the floor at our shape: forward returns a view of q, backward passes dO through as the three grads;
- e1: backward returns three fresh tensors (empty_like), as ours does;
- e2: forward returns two fresh outputs (O and the LSE), materialize_grads off (ours);
- e3: e2 plus save_for_backward of q, k, v, O, LSE and None, unpacked in backward (ours);
- e4: e3 with our forward launch in place of the empty outputs;
- e5: e3 with our backward host path (fa4.launch._backward) in place of the empty grads;
- e6: e4 and e5 together: our Function's work, without fa4.launch._with_grad's resolution;
- e7: ours through launch._with_grad (the config resolved per call, as flash_attn_func's grad path);
- e8: ours through flash_attn_func(provider="fa4").

Two loops beside e1 ask what its fresh grads cost (session 41: +106 us with the engine's device
threads, +14 without): d1 returns three tensors the forward allocated (on the calling thread) and
kept in ctx, d2 three new views of dO (new tensor objects, no allocation).

The step from one line to the next is what that feature costs under the engine. A second column
times each loop again with the engine's device threads off (torch.autograd.set_multithreading_enabled
(False): backward() runs on the calling thread), so the thread hand-off's share of each step shows.
``--profile e0,e1`` then prints each named loop under torch.profiler (host_profile.profile).
"""

from __future__ import annotations


import torch
from host_cost import failure, tiny_inputs, tiny_parser, warm_per_call_us  # bench/host_cost.py's loop (run from bench/)


def engine_loops(qg, kg, vg, do, lse_shape, fwd_ours, bwd_ours, with_grad, via_api) -> dict:
    """The loops e0-e8 (module doc) by name, each a call of torch.autograd.grad w.r.t. (qg, kg, vg).
    ``fwd_ours(q, k, v)`` -> (O, LSE) and ``bwd_ours(dO, q, k, v, O, LSE)`` -> (dq, dk, dv) are our
    launches; ``with_grad()`` and ``via_api()`` return O through launch._with_grad and flash_attn_func."""
    inputs = (qg, kg, vg)

    def fwd_empty(q, k, v):
        return torch.empty_like(q), torch.empty(lse_shape, device=q.device, dtype=torch.float32)

    def bwd_empty(dout, q, k, v, o, lse):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def saving(fwd, bwd):
        class F(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                o, lse = fwd(q, k, v)
                ctx.set_materialize_grads(False)
                ctx.save_for_backward(q, k, v, o, lse, None)
                return o, lse

            @staticmethod
            def backward(ctx, dout, dlse):
                q, k, v, o, lse, _ = ctx.saved_tensors
                return bwd(dout, q, k, v, o, lse)

        return lambda: torch.autograd.grad(F.apply(*inputs)[0], inputs, do)

    class E0(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return q.view_as(q)

        @staticmethod
        def backward(ctx, g):
            return g, g, g

    class E1(E0):
        @staticmethod
        def backward(ctx, g):
            return torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)

    class E2(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.set_materialize_grads(False)
            return fwd_empty(q, k, v)

        @staticmethod
        def backward(ctx, dout, dlse):
            return torch.empty_like(dout), torch.empty_like(dout), torch.empty_like(dout)

    class D1(E0):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
            return q.view_as(q)

        @staticmethod
        def backward(ctx, g):
            return ctx.grads

    class D2(E0):
        @staticmethod
        def backward(ctx, g):
            return g.view_as(g), g.view_as(g), g.view_as(g)

    return {
        "e0 floor at our shape (view out, dO through)": lambda: torch.autograd.grad(E0.apply(*inputs), inputs, do),
        "e1 + fresh grads": lambda: torch.autograd.grad(E1.apply(*inputs), inputs, do),
        "e2 + two fresh outputs, no materialize": lambda: torch.autograd.grad(E2.apply(*inputs)[0], inputs, do),
        "e3 + save_for_backward (6) and unpack": saving(fwd_empty, bwd_empty),
        "e4 e3 with our forward launch": saving(fwd_ours, bwd_empty),
        "e5 e3 with our backward host path": saving(fwd_empty, bwd_ours),
        "e6 our forward and backward (no resolve)": saving(fwd_ours, bwd_ours),
        "e7 ours through launch._with_grad": lambda: torch.autograd.grad(with_grad(), inputs, do),
        "e8 ours through flash_attn_func": lambda: torch.autograd.grad(via_api(), inputs, do),
        "d1 e1's grads allocated in forward": lambda: torch.autograd.grad(D1.apply(*inputs), inputs, do),
        "d2 e1's grads as views of dO": lambda: torch.autograd.grad(D2.apply(*inputs), inputs, do),
    }


def main() -> int:
    import fa4
    from fa4 import launch

    ap = tiny_parser(__doc__)
    ap.add_argument("--profile", default="", help="comma-separated loop ids (e0..e8, d1, d2) to run under torch.profiler")
    a = ap.parse_args()
    (b, s, h, d), (q, k, v, do), (qg, kg, vg) = tiny_inputs(a.shape)
    scale = 1.0 / d ** 0.5
    cfg = launch.bwd_config_for(qg, kg, vg, True, False, None)
    loops = engine_loops(
        qg, kg, vg, do, (b, h, s),
        fwd_ours=lambda q, k, v: launch._forward(q, k, v, scale, True, True, None, None),
        bwd_ours=lambda dout, q, k, v, o, lse: launch._backward(dout, q, k, v, o, lse, scale, True, False, cfg)[:3],
        with_grad=lambda: launch._with_grad(qg, kg, vg, None, True, False, None, None, False, None),
        via_api=lambda: fa4.flash_attn_func(qg, kg, vg, provider="fa4", causal=True))
    print(f"B{b} S{s} H{h} D{d} bf16 causal, {a.calls} calls, one sync; us per call (lower of 2 loops);"
          " second column: the engine's device threads off")
    for line in timed_rows(loops, a.calls):
        print(line, flush=True)
    wanted = [x for x in a.profile.split(",") if x]
    if wanted:
        from host_profile import profile  # bench/host_profile.py (run from bench/)

        for name, fn in loops.items():
            if name[:2] in wanted:
                profile(fn, min(a.calls, 300), name, 18)
    return 0


def timed_rows(loops: dict, calls: int, timer=None) -> list[str]:
    """One row a loop: us a call as it runs, then with torch.autograd.set_multithreading_enabled(False),
    and for e1-e3 the step from the loop before (the feature's cost) in each."""
    timer = timer or warm_per_call_us
    rows, prev = [], None
    for name, fn in loops.items():
        try:
            us = [timer(fn, calls)]
            with torch.autograd.set_multithreading_enabled(False):
                us.append(timer(fn, calls))
            step = ""
            if prev is not None and name[:2] in ("e1", "e2", "e3"):
                step = "  (" + " / ".join(f"{u - p:+6.1f}" for u, p in zip(us, prev)) + ")"
            rows.append(f"  {name:46s} {us[0]:8.1f} {us[1]:8.1f}{step}")
            prev = us
        except Exception as e:  # noqa: BLE001
            rows.append(f"  {name:46s} {failure(e)}")
            prev = None
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
