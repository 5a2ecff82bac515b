"""The knob rules of fa4's Hopper kernels by pass, for code that must not load the launch path.

The tuner's provider, the results store's best-config rule and the service judge configs
(which knob class, feasible or not, the default) without torch or the CuTe DSL; fa4.dispatch's
entries import the launch code. One home for "which config module answers for this pass".
"""

from __future__ import annotations

from fa4.arch import Arch
from fa4.problem import Problem


def config_module(problem: Problem):
    """The sm90 config module of the problem's pass (its knob class, violations)."""
    if problem.pass_ == "bwd":
        from fa4.sm90 import bwd_config as m
    else:
        from fa4.sm90 import fwd_config as m
    return m


def defaults_module(problem: Problem):
    """The sm90 module of the problem's pass that holds its default_config (the backward's measured
    defaults live apart from its knob declaration)."""
    if problem.pass_ == "bwd":
        from fa4.sm90 import bwd_defaults as m
    else:
        from fa4.sm90 import fwd_config as m
    return m


def knob_cls(problem: Problem) -> type:
    m = config_module(problem)
    return m.BwdConfigSm90 if problem.pass_ == "bwd" else m.FwdConfigSm90


class Fa4Rules:
    """Our kernels' knob rules in the shape the best-config rule asks of a provider."""

    name = "fa4"

    def knob_cls_for(self, problem: Problem) -> type:
        return knob_cls(problem)

    def violations(self, config, problem: Problem, arch: Arch) -> list[str]:
        return config_module(problem).violations(config, problem, arch)

    def default_config(self, problem: Problem, arch: Arch):
        return defaults_module(problem).default_config(problem, arch)


class Fa4DecodeRules:
    """The decode kernel's knob rules (fa4.sm90.decode_config), in the same shape: what the results
    store's rule asks of provider "fa4-decode" to judge a DecodeProblem's measured configs."""

    name = "fa4-decode"

    def knob_cls_for(self, problem) -> type:
        from fa4.sm90.decode_config import DecodeConfigSm90

        return DecodeConfigSm90

    def violations(self, config, problem, arch: Arch) -> list[str]:
        from fa4.sm90 import decode_config

        return decode_config.violations(config, problem, arch)

    def default_config(self, problem, arch: Arch):
        from fa4.sm90 import decode_config

        return decode_config.default_config(problem, arch)
