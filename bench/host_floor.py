"""What a forward + backward call costs the host, piece by piece, and PyTorch's own floor for it.

    python3 bench/host_floor.py [--calls 2000] [--shape 1,128,4,128] [--ab ROUNDS [--arms A,B,...]]

bench/host_cost.py measures the whole call; this splits it (us per call, 2000 calls then one
sync, lower of 2 loops, B1 S128 H4 D128 bf16 causal by default):
- floor: torch.autograd.grad through a do-nothing autograd.Function on CUDA tensors (the engine's
  hand-off to its device thread and back, no kernels): no attention call can cost less;
- floor+3: the same with three 1-element CUDA kernels in the forward and three in the backward;
- ours fwd (no grad), ours fwd under autograd (the Function's apply, no backward);
- ours bwd host path alone: fa4.launch._backward called directly (no autograd engine);
- ours fwd+bwd: the full call, as bench/host_cost.py;
- the whole call's pieces put together one at a time, to find what only the whole costs: ours fwd then
  bwd host path called directly (no engine); the bwd host path run by the engine (a Function whose
  forward does nothing and whose backward is _backward); the bwd host path alone on a second thread
  (the engine runs backward() on its device thread).

--ab ROUNDS then times the rows named by --arms (prefixes of the row names; by default PyTorch's
floor + 3 kernels, ours fwd+bwd and cuDNN's) interleaved: ROUNDS rounds of --calls calls each, the
order rotating every round, and each later arm against the first by its per-round ratio. The host's
speed moves by tens of percent between loops and machines (session 42: one arm 175-244 us over five
loops), which one loop a row cannot tell from a difference between rows.
"""

from __future__ import annotations


import torch
from host_cost import failure, tiny_inputs, tiny_parser, warm_per_call_us  # bench/host_cost.py's loop (run from bench/)

import fa4
from fa4 import launch


class Nothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, g):
        return g, g, g


class BwdOnly(torch.autograd.Function):
    """Nothing's forward; backward is our backward host path on fixed inputs (set in main)."""

    run = None

    @staticmethod
    def forward(ctx, q, k, v):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, g):
        return BwdOnly.run()[:3]


def on_thread(fn, calls: int) -> float:
    """per_call_us(fn, calls) on a new thread, after 20 warm-up calls there (the engine's backward
    runs on its own thread)."""
    import threading

    def work():
        box.append(warm_per_call_us(fn, calls))

    box = []
    t = threading.Thread(target=work)
    t.start()
    t.join()
    return box[0]


class Three(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q)
        return q.add(1), k.add(1), v.add(1)

    @staticmethod
    def backward(ctx, g1, g2, g3):
        return g1.mul(2), g2.mul(2), g3.mul(2)


def interleaved(arms: dict, rounds: int, timer) -> dict:
    """{name: [us a call, one a round]} for warm ``arms`` {name: fn}, timed by ``timer(fn)`` in
    rounds whose order rotates, so a drift of the host's speed falls on every arm alike."""
    names = list(arms)
    out = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            out[n].append(timer(arms[n]))
    return out


def ab_summary(times: dict) -> list[str]:
    """Each arm's median and range, then each later arm's per-round ratio to the first (median and
    range: a ratio whose range spans 1 is no difference)."""
    import statistics

    names = list(times)
    rows = [f"  {n:42s} median {statistics.median(t):8.1f}  range {min(t):.1f}-{max(t):.1f}" for n, t in times.items()]
    for n in names[1:]:
        r = [b / a for a, b in zip(times[names[0]], times[n])]
        rows.append(f"  {n} / {names[0]}: median {statistics.median(r):.3f}, range {min(r):.3f}-{max(r):.3f} "
                    f"over {len(r)} rounds")
    return rows


def pick(loops: dict, prefixes: str) -> dict:
    """The loops whose names start with each comma-separated prefix, in the prefixes' order; a prefix
    that names no loop, or more than one, is an error."""
    out = {}
    for p in (x.strip() for x in prefixes.split(",") if x.strip()):
        hits = [n for n in loops if n.startswith(p)]
        if len(hits) != 1:
            raise SystemExit(f"--arms: {p!r} names {len(hits)} rows ({', '.join(hits) or 'none'}); rows: {', '.join(loops)}")
        if isinstance(loops[hits[0]], tuple):  # ("thread", fn): timed on a thread of its own
            raise SystemExit(f"--arms: {hits[0]!r} runs on its own thread, not in the rounds")
        out[hits[0]] = loops[hits[0]]
    return out


def main() -> int:
    ap = tiny_parser(__doc__)
    ap.add_argument("--ab", type=int, default=0, metavar="ROUNDS",
                    help="then time the --arms rows interleaved, ROUNDS rounds of --calls calls")
    ap.add_argument("--arms", default="floor+3,ours fwd+bwd,sdpa cudnn", help="row-name prefixes, comma-separated")
    a = ap.parse_args()
    (b, s, h, d), (q, k, v, do), (qg, kg, vg) = tiny_inputs(a.shape)
    small = [torch.randn(1, device="cuda", requires_grad=True) for _ in range(3)]
    g1 = torch.ones(1, device="cuda")

    out, lse = fa4.flash_attn_func(qg, kg, vg, provider="fa4", causal=True, return_lse=True)
    cfg = launch.bwd_config_for(qg, kg, vg, True, False, None)
    scale = 1.0 / d ** 0.5
    o_det, lse_det = out.detach(), lse.detach()

    def fwd():
        with torch.no_grad():
            fa4.flash_attn_func(q, k, v, provider="fa4", causal=True)

    def bwd():
        return launch._backward(do, q, k, v, o_det, lse_det, scale, True, False, cfg)

    def fwd_then_bwd():
        fwd()
        bwd()

    BwdOnly.run = bwd

    loops = {
        "floor (autograd.grad, no-op Function)": lambda: torch.autograd.grad(Nothing.apply(*small), small[0], g1),
        "floor+3 (3 kernels each way)": lambda: torch.autograd.grad(Three.apply(*small), small, (g1, g1, g1)),
        "ours fwd, no grad": fwd,
        "ours fwd under autograd (no backward)": lambda: fa4.flash_attn_func(qg, kg, vg, provider="fa4", causal=True),
        "ours bwd host path alone (_backward)": lambda: launch._backward(do, q, k, v, o_det, lse_det, scale, True,
                                                                         False, cfg),
        "ours fwd+bwd (autograd.grad)": lambda: torch.autograd.grad(fa4.flash_attn_func(qg, kg, vg, provider="fa4", causal=True),
                                                                    (qg, kg, vg), do),
        "ours fwd then bwd host path (no engine)": fwd_then_bwd,
        "ours bwd host path under the engine": lambda: torch.autograd.grad(BwdOnly.apply(qg, kg, vg), (qg, kg, vg),
                                                                            do),
        "ours bwd host path alone, second thread": ("thread", bwd),
        "sdpa cudnn fwd+bwd": lambda: torch.autograd.grad(
            fa4.flash_attn_func(qg, kg, vg, causal=True, provider="cudnn"), (qg, kg, vg), do),
    }
    arms = pick(loops, a.arms) if a.ab else {}
    print(f"B{b} S{s} H{h} D{d} bf16 causal, {a.calls} calls, one sync; us per call (lower of 2 loops)")
    for name, fn in loops.items():
        try:
            if isinstance(fn, tuple):  # ("thread", fn): warmed and timed on a new thread
                us = on_thread(fn[1], a.calls)
            else:
                us = warm_per_call_us(fn, a.calls)
            print(f"  {name:42s} {us:8.1f}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"  {name:42s} {failure(e)}", flush=True)
    if arms:
        from host_cost import per_call_us

        print(f"interleaved, {a.ab} rounds of {a.calls} calls, us a call:")
        for row in ab_summary(interleaved(arms, a.ab, lambda fn: per_call_us(fn, a.calls))):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
