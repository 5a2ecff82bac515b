"""provider="auto" against each provider it chooses from, timed in one process on the GPU.

    python3 bench/auto_dispatch.py --db sqlite:///auto.db --measure     # store each provider's default
    python3 bench/auto_dispatch.py --db sqlite:///auto.db               # then: auto vs every provider

``--measure`` runs ``fa4-tune --shapes FILE --provider P --trials 1 --l2 cold|warm`` for fa4,
flash-attn-4, cudnn and fa2 (each one's default configuration, forward and backward rows,
correctness-gated, in both L2 modes) into the DB. Without it, each shape of FILE is timed as a plain call of every provider and with
provider="auto" (FA4_DB pointing at the DB): the forward without grad, and forward + backward
with grad; do_bench medians on fresh inputs, in --rounds interleaved rounds (each round in a rotated
order, so no provider is always timed first or last), the median of the rounds per provider: a
host-bound call's time drifts over a process (session 20: every host-bound provider 15-40% slower in
its second round than in its first, FA2's GPU-bound calls flat), so the best of two rounds favoured
whoever came early. A line per shape names auto's choice and auto / the fastest provider; "SLOWER"
marks a ratio above 1 + --noise. Each row also gives the Python garbage collector's time per call
during its rounds (gc.callbacks), and --gc-freeze moves every object alive after the warm-up into
the permanent generation (gc.freeze) to tell the collector's share of the drift from the host's.
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROVIDERS = ("fa4", "flash-attn-4", "cudnn", "fa2")


def measure(db: str, shapes: str) -> None:
    # Both L2 modes: eager-warm (back-to-back calls) is where a host-bound provider shows its host
    # cost per call, which fa4.auto charges on top of the cold-L2 numbers.
    for l2 in ("cold", "warm"):
        for p in PROVIDERS:
            cmd = ["fa4-tune", "--shapes", shapes, "--provider", p, "--trials", "1", "--l2", l2, "--db", db]
            print("$ " + " ".join(cmd), flush=True)
            rc = subprocess.call(cmd)
            print(f"rc={rc}", flush=True)


class GcClock:
    """Seconds the garbage collector ran and collections per generation, since the last reset."""

    def __init__(self):
        self.seconds, self.collections, self._t0 = 0.0, [0, 0, 0], None
        gc.callbacks.append(self._cb)

    def _cb(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self.collections[info["generation"]] += 1
            self._t0 = None

    def reset(self):
        self.seconds, self.collections = 0.0, [0, 0, 0]


def back_to_back(fn, n: int) -> float:
    """Milliseconds per call over ``n`` consecutive calls (after 3 warm-up calls): the GPU's time or
    the host's, whichever is longer, as a loop with nothing else queued sees it."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def rows(shapes: str) -> list[dict]:
    with open(shapes) as f:
        seen, out = set(), []
        for r in csv.DictReader(f):
            key = tuple(v for k, v in r.items() if k != "pass")
            if key not in seen:  # one entry per shape: both passes are timed
                seen.add(key)
                out.append(r)
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--shapes", default=str(Path(__file__).parent / "shapes" / "issue16_table.csv"))
    ap.add_argument("--measure", action="store_true")
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds, rotated order; their median")
    ap.add_argument("--rep", type=int, default=50, help="do_bench's rep (ms) per provider and round")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after each shape's warm-up calls")
    ap.add_argument("--loop", type=int, default=0, metavar="N",
                    help="time N back-to-back calls between two CUDA events (nothing in between: a host-bound "
                         "call shows its host cost, as in a launch-bound program) instead of do_bench, whose "
                         "L2 flush before each call hides up to its own length of a call's host path")
    a = ap.parse_args()
    if a.measure:
        measure(a.db, a.shapes)
        return 0
    os.environ["FA4_DB"] = a.db
    os.environ["FA4_LOOKUP_LOCAL_DB"] = "1"  # the device scripts turn the local lookup off; auto reads the DB
    import torch
    from triton.testing import do_bench

    import fa4

    slower = 0
    clock = GcClock()
    for r in rows(a.shapes):
        b, sq, sk = int(r["batch"]), int(r["seqlen"]), int(r["seqlen_k"])
        hq, hkv, d = int(r["heads"]), int(r["heads_kv"]), int(r["hdim"])
        causal = r["causal"].strip() in ("1", "true", "True")
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[r["dtype"]]
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dt)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt)
        do = torch.randn(b, sq, hq, d, device="cuda", dtype=dt)
        choice = fa4.explain_auto(q, k, v, causal)
        name = f"B{b} Sq{sq} Sk{sk} H{hq}/{hkv} d{d}{' causal' if causal else ''}"
        for kind in ("fwd", "fwd+bwd"):
            runs, gcs, failed = {}, {}, set()
            names = (*PROVIDERS, "auto")
            # Interleaved rounds, each in a rotated order: every provider is timed at every position.
            order = [names[(i + rnd) % len(names)] for rnd in range(a.rounds) for i in range(len(names))]
            fns = {}
            for p in names:
                if kind == "fwd":
                    def fn(p=p):
                        with torch.no_grad():
                            return fa4.flash_attn_func(q, k, v, causal=causal, provider=p)
                else:
                    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

                    def fn(p=p, qg=qg, kg=kg, vg=vg):
                        out = fa4.flash_attn_func(qg, kg, vg, causal=causal, provider=p)
                        torch.autograd.grad(out, (qg, kg, vg), do)
                try:
                    for _ in range(3):
                        fn()
                except Exception as e:
                    failed.add(p)
                    print(f"  {name} {kind} {p}: cannot run ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
                    continue
                fns[p] = fn
            if a.gc_freeze:
                gc.collect()
                gc.freeze()
            for p in order:
                if p in failed:
                    continue
                calls = [0]

                def counted(fn=fns[p]):
                    calls[0] += 1
                    return fn()

                clock.reset()
                t = back_to_back(counted, a.loop) if a.loop else do_bench(counted, warmup=25, rep=a.rep)
                runs.setdefault(p, []).append(t)
                g = gcs.setdefault(p, [0.0, 0, [0, 0, 0]])
                g[0] += clock.seconds
                g[1] += calls[0]
                g[2] = [x + y for x, y in zip(g[2], clock.collections)]
            if a.gc_freeze:
                gc.unfreeze()
            times = {p: statistics.median(ts) for p, ts in runs.items()}
            missing = [p for p in ("fa4", "auto") if p in failed]
            if missing:
                # A row where our own call or auto's cannot run is a failure, never a pass by default.
                slower += 1
                print(f"{name} {kind}: {' and '.join(missing)} CANNOT RUN", flush=True)
                continue
            best = min((t for p, t in times.items() if p != "auto"), default=None)
            chosen = choice.fwd if kind == "fwd" else choice.train
            ratio = times.get("auto", float("nan")) / best if best else float("nan")
            bad = ratio > 1 + a.noise
            slower += bad
            print(f"{name} {kind} (rounds, in order: " + "; ".join(f"{p} " + "/".join(f"{t:.3f}" for t in ts)
                                                                for p, ts in runs.items()) + ")")
            print(f"{name} {kind} gc per call: " + "; ".join(
                f"{p} {1e6 * s / max(n, 1):.1f} us (collections g0/g1/g2 {'/'.join(map(str, c))})"
                for p, (s, n, c) in gcs.items()) + (" [gc frozen]" if a.gc_freeze else ""))
            print(f"{name} {kind}: " + ", ".join(f"{p} {t:.3f} ms" for p, t in times.items())
                  + f" (medians of {a.rounds}) | auto chose {chosen}: auto/fastest {ratio:.3f}"
                  + ("  SLOWER" if bad else ""), flush=True)
    how = f"{a.loop} back-to-back calls" if a.loop else "do_bench"
    print(f"shapes where auto is slower than the fastest provider beyond {a.noise:.0%} ({how}), "
          f"or fa4 or auto cannot run: {slower}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
