"""A study's winner is kept only when its gain over the default is real.

On the shared H200 one config times 3-5% apart from run to run, and a study's trials are timed
minutes apart: the best trial of 40 is often a noise winner. So before a challenger is served,
the top candidates and the default are measured again in one process, interleaved over several
rounds (the order alternates, every round draws fresh inputs, clocks are warmed and L2 flushed
before each repetition), and each challenger is judged by its per-round ratio to the default:
paired within a round, the ratios cancel the drift between rounds. A challenger wins only if the
median ratio's gain exceeds the spread of the ratios (half their range) and it won every round;
otherwise the default stays and the report says "no significant gain (x% +- y%)".
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace


@dataclass
class Judgement:
    winner: int  # index into the candidates; 0 (the default) when no challenger's gain is real
    gains: list[float]  # per candidate: median over rounds of its TFLOP/s over the default's, minus 1
    spreads: list[float]  # per candidate: half the range of those ratios
    failed: list[str | None]  # per candidate: why its re-measurement failed, else None

    @property
    def significant(self) -> bool:
        return self.winner != 0

    def describe(self, i: int | None = None) -> str:
        i = self.winner if i is None else i
        return f"{self.gains[i] * 100:+.1f}% +- {self.spreads[i] * 100:.1f}%"


def judge(rounds: list[list[float | None]], failed: list[str | None] | None = None) -> Judgement:
    """``rounds[r][i]``: TFLOP/s of candidate ``i`` (0 = the default) in round ``r`` (None when
    that measurement failed). A candidate that failed in any round cannot win."""
    n = len(rounds[0])
    failed = list(failed or [None] * n)
    for row in rounds:
        for i, x in enumerate(row):
            if x is None and failed[i] is None:
                failed[i] = "a re-measurement failed"
    gains, spreads, worst = [0.0] * n, [0.0] * n, [0.0] * n
    if failed[0] is not None:  # no paired reference: nothing can be shown to beat it
        return Judgement(0, gains, spreads, failed)
    for i in range(1, n):
        if failed[i] is not None:
            continue
        ratios = [row[i] / row[0] for row in rounds]
        gains[i] = statistics.median(ratios) - 1.0
        spreads[i] = (max(ratios) - min(ratios)) / 2.0
        worst[i] = min(ratios) - 1.0
    # Real: the median gain beats the spread and the challenger won every round. Simulated with
    # +-4% uniform noise per measurement, 7 rounds and 3 challengers that are no faster, a
    # challenger is wrongly kept about 1% of the time (tests/tuner/test_verify.py).
    real = [i for i in range(1, n) if failed[i] is None and gains[i] > spreads[i] and worst[i] > 0]
    winner = max(real, key=lambda i: (gains[i], -i)) if real else 0
    return Judgement(winner, gains, spreads, failed)


def remeasure(runner, spec: str, problem, configs: list[dict | None], settings, rounds: int):
    """TFLOP/s of each config per round, interleaved in ``runner``'s one measuring process.

    Round r measures the configs forwards when r is even and backwards when odd (a config is
    never always first after a slow one), with inputs drawn from a seed of its own; the
    correctness gate already passed in the study, so it is not run again."""
    out, order, failed = [], [], [None] * len(configs)
    for r in range(rounds):
        idx = list(range(len(configs)))[:: 1 if r % 2 == 0 else -1]
        s = replace(settings, seed=settings.seed + 7919 * (r + 1), check=False)
        row = [None] * len(configs)
        for i in idx:
            m = runner.run(spec, problem, configs[i], s)
            if m.ok:
                row[i] = m.tflops
            elif failed[i] is None:
                failed[i] = f"round {r}: {m.status}: {m.reason}"
        out.append(row)
        order.append(idx)
    return out, order, failed


__all__ = ["Judgement", "judge", "remeasure"]
