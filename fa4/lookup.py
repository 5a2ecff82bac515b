"""Launch-time config resolution (cached in process; never an HTTP call per launch).

Until the tuning service lands this resolves to the heuristic default of the
kernel's knob declaration; the cache is already keyed the way the service will be.
"""

from __future__ import annotations

from functools import lru_cache

from fa4.arch import Arch
from fa4.dispatch import fwd_entry
from fa4.problem import Problem


@lru_cache(maxsize=4096)
def resolve_fwd_config(problem: Problem, arch: Arch):
    return fwd_entry(arch).default_config(problem, arch)
