"""How a measurement was timed: the one declaration of the timing modes.

A config that wins under eager launches with a cold L2 need not win when the same kernel is
replayed from a CUDA graph (no launch overhead between kernels) or runs with its inputs still in
L2 (a decode step right after the previous layer). So every measurement records the mode it was
timed in, the tuner is told which mode to time (``fa4-tune --launch graph --l2 warm``), and every
lookup asks for one mode and is answered from rows of that mode only.

A mode is two choices, written ``"<launch>-<l2>"`` (``"eager-cold"``, ``"graph-warm"``, ...): that
canonical string is what the results DB, the REST API and the environment carry. The default,
``eager-cold``, is what fa4-tune measured before modes existed, so older rows read as it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Each choice, with what it means; the CLI's --help, the REST schema and the dashboard are built
# from these (never a second list).
LAUNCHES = {
    "eager": "each repetition launches the callable from Python, as an eager PyTorch program does",
    "graph": "the callable is captured once into a CUDA graph and each repetition replays the graph "
             "(torch.cuda.CUDAGraph), as a server running its model under CUDA graphs does",
}
L2_STATES = {
    "cold": "the L2 cache is flushed before each repetition (outside the timed region): inputs come "
            "from HBM, as when other work ran in between",
    "warm": "no flush: each repetition finds what the previous one left in L2, as in back-to-back calls",
}
SEPARATOR = "-"


@dataclass(frozen=True)
class Timing:
    """One timing mode: how each repetition is launched and the L2 state it starts from."""

    launch: str = "eager"
    l2: str = "cold"

    def __post_init__(self):
        if self.launch not in LAUNCHES:
            raise ValueError(f"launch must be one of {tuple(LAUNCHES)}, got {self.launch!r}")
        if self.l2 not in L2_STATES:
            raise ValueError(f"l2 must be one of {tuple(L2_STATES)}, got {self.l2!r}")

    @property
    def name(self) -> str:
        """The canonical string, e.g. ``"graph-cold"``."""
        return f"{self.launch}{SEPARATOR}{self.l2}"

    def __str__(self) -> str:
        return self.name

    @property
    def graph(self) -> bool:
        return self.launch == "graph"

    @property
    def flush_l2(self) -> bool:
        return self.l2 == "cold"

    @property
    def doc(self) -> str:
        return f"{self.launch}: {LAUNCHES[self.launch]}; {self.l2} L2: {L2_STATES[self.l2]}"

    @classmethod
    def parse(cls, value: "str | Timing | None") -> "Timing":
        """A Timing from its canonical string (None: the default); ValueError naming the choices."""
        if value is None:
            return DEFAULT
        if isinstance(value, Timing):
            return value
        text = str(value).strip().lower()
        launch, sep, l2 = text.partition(SEPARATOR)
        if not sep or launch not in LAUNCHES or l2 not in L2_STATES:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, got {value!r}")
        return cls(launch, l2)

    def to_dict(self) -> dict:
        return {"name": self.name, "launch": self.launch, "l2": self.l2, "doc": self.doc,
                "default": self == DEFAULT}


DEFAULT = Timing()
DEFAULT_TIMING = DEFAULT.name
# Every mode's canonical string, the default first.
ALL = tuple([DEFAULT] + [Timing(a, b) for a in LAUNCHES for b in L2_STATES if Timing(a, b) != DEFAULT])
TIMINGS = tuple(t.name for t in ALL)
# Longest canonical string: the width of the DB columns that hold one.
MAX_LEN = 16
assert max(map(len, TIMINGS)) <= MAX_LEN


def canonical(value: "str | Timing | None") -> str:
    """The canonical string of a mode given as a string, a Timing or None (the default)."""
    return Timing.parse(value).name


__all__ = ["ALL", "DEFAULT", "DEFAULT_TIMING", "L2_STATES", "LAUNCHES", "TIMINGS", "Timing", "canonical"]
