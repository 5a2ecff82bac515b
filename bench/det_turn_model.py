"""A timed model of the deterministic backward's dQ turns (CPU): which launch order, walk direction
and turn order keep the machine busy, against the non-deterministic kernel's order.

The model: `--sms` SMs, one CTA an SM; CTAs start in launch order as SMs free up (groups of G heads,
key tile by key tile, longest key tiles first (LPT) or shortest first (SPT)); the CTA of key tile n
walks the query tiles n..num_n-1 of a causal head (up from the diagonal, or down to it), one unit of
time a tile (the diagonal's masked tile `--diag`), plus `--overhead` (half before its walk, half
after). Two dQ staging slots: a CTA computes tile k once its add of tile k-2 went out. A dQ add of
query tile i goes out when the tile's previous turn's add went out `--handoff` earlier (the
hand-off: completion, release, the next CTA's poll); the first turn waits for nothing.

Turn orders: 'launch' (today's kernels: the turns follow the launch order, so a CTA only waits
for CTAs launched before it), 'reversed' (the first turn to the key tile whose walk up reaches the
tile first: under LPT a CTA then waits for CTAs launched after it, which can deadlock a machine
whose free SMs are fewer than a group's CTAs; the model reports it), none (non-deterministic).

Today's deterministic defaults (bwd_defaults.default_launch_order, det_walk_down_pays): LPT walking
down with 16 heads a group at >= 64 key tiles a head (Llama-3.2-1B 8k), SPT walking up elsewhere
(one head a group; GPT-2-sized hd64 MHA a wave's worth). Session 41 asked whether LPT walking up with
reversed turns (the non-deterministic kernel's order, made deterministic) would beat them (the
printed table; bench/RESULTS.md). Printed: efficiency (total work / SMs / makespan) of the
non-deterministic order, then each deterministic order's makespan ratio to it.

    python3 bench/det_turn_model.py [--sms 132] [--handoff 0.2,0.4,0.6]
"""

from __future__ import annotations

import argparse
import heapq
from collections import defaultdict

# name: (key tiles a head, heads x batch)
SHAPES = {
    "llama3.2-1b-8k (H32, tile 128)": (64, 32),
    "qwen2.5-7b-4k (B2 H28)": (32, 56),
    "gpt2-1k (B16 H12)": (8, 192),
}
# label: (heads a group, longest first, walk down, turn order)
ORDERS = {
    "LPT up, reversed turns, G1": (1, True, False, "reversed"),
    "LPT up, reversed turns, G2": (2, True, False, "reversed"),
    "LPT down, launch turns, G16": (16, True, True, "launch"),
    "SPT up, launch turns, G1": (1, False, False, "launch"),
}


def launch_order(num_n: int, heads: int, group: int, longest_first: bool) -> list[tuple[int, int]]:
    """(head, key tile) of each CTA in launch order: groups of ``group`` heads, key tile by key tile."""
    out = []
    for g0 in range(0, heads, group):
        for m in range(num_n):
            n = m if longest_first else num_n - 1 - m
            out.extend((h, n) for h in range(g0, min(heads, g0 + group)))
    return out


def turn(i: int, n: int, order: str, longest_first: bool) -> int:
    """Key tile n's turn among the contributors 0..i of causal query tile i."""
    ascending = (order == "launch") == longest_first  # launch order: key tile 0 first under LPT
    return n if ascending else i - n


def makespan(num_n: int, heads: int, group: int, longest_first: bool, walk_down: bool, order: str | None,
             handoff: float, sms: int = 132, overhead: float = 1.0, diag: float = 0.6) -> float | None:
    """The model's makespan (module doc), or None where the turns deadlock the machine."""
    ctas = launch_order(num_n, heads, group, longest_first)
    walks = [list(range(n, num_n))[::-1] if walk_down else list(range(n, num_n)) for _, n in ctas]
    events: list = []
    seq = 0
    comp, sent, started = {}, {}, set()
    turn_sent: dict = {}  # (head, query tile, turn) -> when its add went out
    waiting = defaultdict(list)
    unsent = [len(w) for w in walks]  # a CTA ends when its last add went out

    def push(t, kind, c, k):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, c, k))

    def cost(c, k):
        return diag if walks[c][k] == ctas[c][1] else 1.0

    def try_compute(c, k, t):
        if k >= len(walks[c]) or (c, k) in started:
            return
        if (k >= 1 and (c, k - 1) not in comp) or (k >= 2 and (c, k - 2) not in sent):
            return
        started.add((c, k))
        push(max(t, comp.get((c, k - 1), t), sent.get((c, k - 2), t)) + cost(c, k), "comp", c, k)

    def turn_key(c, k):
        """(head, query tile, turn) of CTA c's add at walk position k."""
        h, n = ctas[c]
        i = walks[c][k]
        return h, i, turn(i, n, order, longest_first)

    def try_send(c, k):
        ready = comp[(c, k)]
        if order is not None:
            h, i, tn = turn_key(c, k)
            if tn > 0:
                prev = turn_sent.get((h, i, tn - 1))
                if prev is None:
                    waiting[(h, i, tn - 1)].append((c, k))
                    return
                ready = max(ready, prev + handoff)
        push(ready, "sent", c, k)

    resident = launched = done = 0
    end = 0.0

    def launch(t):
        nonlocal resident, launched
        while resident < sms and launched < len(ctas):
            resident += 1
            launched += 1
            try_compute(launched - 1, 0, t + overhead / 2)

    launch(0.0)
    while events:
        t, _, kind, c, k = heapq.heappop(events)
        if kind == "comp":
            comp[(c, k)] = t
            try_send(c, k)
            try_compute(c, k + 1, t)
            continue
        sent[(c, k)] = t
        if order is not None:
            key = turn_key(c, k)
            turn_sent[key] = t
            for c2, k2 in waiting.pop(key, []):
                try_send(c2, k2)
        try_compute(c, k + 2, t)
        unsent[c] -= 1
        if unsent[c] == 0:
            done += 1
            resident -= 1
            end = max(end, t + overhead / 2)
            launch(t + overhead / 2)
    return end if done == len(ctas) else None


def work(num_n: int, heads: int, overhead: float = 1.0, diag: float = 0.6) -> float:
    return heads * sum((num_n - n - 1) + diag + overhead for n in range(num_n))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--handoff", default="0.2,0.4,0.6", help="hand-off latencies, in steps")
    a = ap.parse_args()
    for name, (num_n, heads) in SHAPES.items():
        print(name)
        for h in (float(x) for x in a.handoff.split(",")):
            base = makespan(num_n, heads, 2, True, False, None, h, a.sms)
            cols = [f"non-det LPT up G2 efficiency {work(num_n, heads) / a.sms / base:.3f}"]
            for label, (g, lpt, down, order) in ORDERS.items():
                span = makespan(num_n, heads, g, lpt, down, order, h, a.sms)
                cols.append(f"{label} {'deadlock' if span is None else f'{base / span:.3f}'}")
            print(f"  hand-off {h}: " + " | ".join(cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
