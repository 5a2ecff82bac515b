"""One declaration per knob.

Every tunable kernel declares its knobs exactly once: a frozen dataclass whose
fields are created with :func:`knob`. The choices and the documentation live in
the field metadata, and everything else (the Optuna search space, the JSON
schema stored with results, the REST schema, the dashboard filters) is derived
from that dataclass by the helpers below. Nothing else in the repository may
list knob names.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

_KNOB = "fa4_knob"


@dataclass(frozen=True)
class KnobSpec:
    """What a knob is, read back from its field metadata."""

    name: str
    choices: tuple
    default: Any
    doc: str
    # A runtime knob is a kernel argument, not compiled in: None for compile-time knobs, else
    # the function from the knob's value to the argument the kernel takes.
    runtime: Callable[[Any], Any] | None = None
    # Which problems the knob means something for (None: all). Elsewhere only its default is
    # feasible (the kernel's violations() says so), and iter_configs(cls, problem) enumerates
    # only the default.
    applies: Callable[[Any], bool] | None = None
    # Which configs the knob has no effect in (None: none): there a config with any value of it
    # is the default's kernel and launch. iter_configs(cls, problem) then yields the default only,
    # and compile_time_config maps the others to it.
    inert: Callable[[Any], bool] | None = None
    # What the knob's other values need of the knobs declared before it (None: nothing), as a
    # function of their values (a dict): where it is False only the default is feasible (the
    # kernel's violations() says so), and iter_configs enumerates only the default there.
    requires: Callable[[dict], bool] | None = None

    @property
    def kind(self) -> str:
        """JSON type of the knob's values (all choices share one type)."""
        sample = self.choices[0]
        if isinstance(sample, bool):
            return "boolean"
        if isinstance(sample, int):
            return "integer"
        if isinstance(sample, float):
            return "number"
        return "string"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "type": self.kind,
            "choices": list(self.choices),
            "default": self.default,
            "doc": self.doc,
        }


class Violation(str):
    """One reason a config cannot run a problem: the text says how, ``kind`` names the budget or
    rule it breaks, so reports can say what rejected a config ("shared memory: 33,840 configs")
    without parsing the text. A str, so every caller that shows or stores reasons is unchanged."""

    kind: str

    def __new__(cls, kind: str, text: str):
        s = super().__new__(cls, text)
        s.kind = kind
        return s

    def __reduce__(self):  # a str subclass pickles as a plain str otherwise (worker processes)
        return (Violation, (self.kind, str(self)))


#: The kinds of violation the kernels' ``violations()`` report, in the order reports list them.
VIOLATION_KINDS = (
    "problem",          # the kernel does not take this problem at all (head dim, pass, arch)
    "problem contradiction",  # a knob restates the problem and disagrees with it
    "tile shape",       # WGMMA / TMA / warpgroup shape rules
    "shared memory",    # the per-CTA shared-memory budget
    "registers",        # fragments over the register budget, or measured spills
    "value range",      # a setting the dtype cannot hold (tau)
    "knob combination",  # two knobs that do not work together
    "not built",        # a declared value the kernel does not implement yet
)


def violation_kind(reason: str) -> str:
    """The kind of a reason: its own for a :class:`Violation`, "unclassified" for plain text
    (providers that wrap another library's checks)."""
    return getattr(reason, "kind", None) or "unclassified"


def _same(value):
    return value


def knob(choices: Sequence, default: Any, doc: str, *, runtime: bool | Callable[[Any], Any] = False,
         applies: Callable[[Any], bool] | None = None, inert: Callable[[Any], bool] | None = None,
         requires: Callable[[dict], bool] | None = None):
    """A dataclass field that is a tunable knob with a finite set of choices.

    ``runtime`` marks a knob the kernel takes as an argument at launch instead of compiling it
    in: True passes the value as it is, a function converts it (e.g. an order name to the
    integer flag the kernel tests). Configs that differ only in runtime knobs share one
    compiled kernel, and the launch passes :func:`runtime_args` in declaration order, which
    is the order of those parameters in the kernel's signature.

    ``applies(problem)`` narrows the knob to the problems it means something for (e.g. a softcap
    knob to softcap problems): elsewhere the kernel's violations() must refuse every value but
    the default, which lets iter_configs skip them (tests/fa4/test_knob_applies.py checks that).
    ``inert(config)`` says where the knob has no effect (e.g. the polynomial's element pattern
    at a polynomial fraction of 0): such configs stay feasible (a stored or hand-written one still
    runs) but are the default's kernel, so a tuner does not measure them as another config.
    ``requires(values)`` says which values of the knobs declared before it the other values of
    this one need (e.g. a layout's tile size the layout itself): elsewhere violations() must
    refuse them, and iter_configs does not enumerate them (a space of a few knobs that only
    mean something together grows by their feasible combinations, not by their product).
    """
    choices = tuple(choices)
    if not choices:
        raise ValueError("a knob needs at least one choice")
    if default not in choices:
        raise ValueError(f"default {default!r} is not one of the choices {choices!r}")
    kinds = {type(c) for c in choices}
    if len(kinds) != 1:
        raise ValueError(f"all choices of a knob must share one type, got {kinds}")
    convert = _same if runtime is True else (runtime or None)
    return field(default=default, metadata={_KNOB: {"choices": choices, "doc": doc, "runtime": convert,
                                                    "applies": applies, "inert": inert,
                                                    "requires": requires}})


def is_knob_class(cls) -> bool:
    return dataclasses.is_dataclass(cls) and all(_KNOB in f.metadata for f in dataclasses.fields(cls))


_specs_of: dict[type, tuple] = {}


def knob_specs(cls) -> list[KnobSpec]:
    """The knobs of a config dataclass, in declaration order."""
    # Built once per class: a launch derives its runtime arguments and compile key from them, and
    # rebuilding them (dataclasses.fields, one KnobSpec per knob) cost ~65 us a call.
    specs = _specs_of.get(cls)
    if specs is None:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls!r} is not a knob dataclass")
        built = []
        for f in dataclasses.fields(cls):
            meta = f.metadata.get(_KNOB)
            if meta is None:
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with knob()")
            built.append(KnobSpec(f.name, meta["choices"], f.default, meta["doc"], meta.get("runtime"),
                                  meta.get("applies"), meta.get("inert"), meta.get("requires")))
        specs = _specs_of[cls] = tuple(built)
    return list(specs)


def runtime_knobs(cls) -> tuple[str, ...]:
    """Names of the knobs of ``cls`` marked runtime, in declaration order."""
    return tuple(s.name for s in knob_specs(cls) if s.runtime is not None)


def runtime_args(config) -> tuple:
    """The kernel arguments of ``config``'s runtime knobs, converted, in declaration order."""
    return tuple(s.runtime(getattr(config, s.name)) for s in knob_specs(type(config)) if s.runtime is not None)


def compile_time_config(config):
    """``config`` with its runtime knobs, and the knobs inert in it, at their defaults: the part
    that selects the compiled kernel."""
    specs = knob_specs(type(config))
    defaults = {s.name: s.default for s in specs if s.runtime is not None}
    return dataclasses.replace(canonical_config(config), **defaults)


def canonical_config(config):
    """``config`` with each knob that has no effect in it (its ``inert``) at its default: the same
    kernel and launch, one name for it."""
    inert = {s.name: s.default for s in knob_specs(type(config))
             if s.inert is not None and getattr(config, s.name) != s.default and s.inert(config)}
    return dataclasses.replace(config, **inert) if inert else config


class RuntimeKnobNames:
    """``RUNTIME_KNOBS = RuntimeKnobNames()`` in a knob class: the runtime knobs' names, read
    from the declaration (a class attribute without annotation is no dataclass field)."""

    def __get__(self, obj, owner) -> tuple[str, ...]:
        return runtime_knobs(owner)


def search_space(cls) -> dict[str, tuple]:
    """name -> choices, the space the tuner samples from."""
    return {s.name: s.choices for s in knob_specs(cls)}


def space_size(cls) -> int:
    n = 1
    for s in knob_specs(cls):
        n *= len(s.choices)
    return n


def problem_choices(spec: KnobSpec, problem=None) -> tuple:
    """The values of a knob worth enumerating for ``problem``: its default alone where the knob
    does not apply (every other value is infeasible there), else all its choices."""
    if problem is not None and spec.applies is not None and not spec.applies(problem):
        return (spec.default,)
    return spec.choices


def iter_configs(cls, problem=None, *, vary_runtime: bool = True) -> Iterator:
    """Every point of the search space; with ``problem``, the configs worth tuning for it: the
    knobs that do not apply to it at their default only, and no config in which a knob with a
    value other than its default has no effect (canonical_config: the same kernel as a config
    that is enumerated). The feasible configs are then still all there up to that renaming, in
    the same order, and a forward problem without softcap enumerates under a fifth of the space.
    ``vary_runtime=False`` holds the runtime knobs at their defaults: one config per compiled
    kernel (compile_time_config), for walks over the kernels rather than the launches."""
    specs = knob_specs(cls)
    names = [s.name for s in specs]
    inert = [s for s in specs if s.inert is not None] if problem is not None else []

    def values_of(spec):
        if not vary_runtime and spec.runtime is not None:
            return (spec.default,)
        return problem_choices(spec, problem)

    # Runs of knobs between those with ``requires``: a plain product within a run, and a knob with
    # requires takes its other values only after a prefix that meets them. The order is the
    # product's over the declaration, less the skipped configs.
    cuts = [i for i, s in enumerate(specs) if s.requires is not None]
    bounds = list(zip([0] + cuts, cuts + [len(specs)]))

    def walk(part: int, prefix: tuple):
        lo, hi = bounds[part]
        if lo in cuts:
            spec = specs[lo]
            ok = spec.requires(dict(zip(names, prefix)))
            head = tuple((v,) for v in values_of(spec) if ok or v == spec.default)
            lo += 1
        else:
            head = ((),)
        for first in head:
            for rest in itertools.product(*(values_of(s) for s in specs[lo:hi])):
                values = prefix + first + rest
                if part + 1 < len(bounds):
                    yield from walk(part + 1, values)
                else:
                    yield values

    for values in walk(0, ()):
        config = cls(**dict(zip(names, values)))
        if any(getattr(config, s.name) != s.default and s.inert(config) for s in inert):
            continue
        yield config


def random_configs(cls, n: int, seed: int = 0, problem=None) -> list:
    """``n`` configs drawn uniformly from the space (with ``problem``: from problem_choices, the
    knobs that do not apply at their default), for checks too slow over millions of configs."""
    rng = random.Random(seed)
    specs = knob_specs(cls)
    return [cls(**{s.name: rng.choice(problem_choices(s, problem)) for s in specs}) for _ in range(n)]


def config_to_dict(config) -> dict:
    return dataclasses.asdict(config)


def as_config(cls, value, name: str = "config"):
    """``value`` as a ``cls``: the object itself or a dict of its knobs; anything else is a ValueError."""
    if isinstance(value, dict):
        value = config_from_dict(cls, value)
    if not isinstance(value, cls):
        raise ValueError(f"{name} must be a {cls.__name__} or a dict of its knobs")
    return value


def retired_knobs(cls) -> dict[str, str]:
    """Knob names ``cls`` no longer declares, with why (its ``RETIRED_KNOBS``; empty if none)."""
    return dict(getattr(cls, "RETIRED_KNOBS", None) or {})


def config_from_dict(cls, data: dict):
    """Build a config from a mapping, rejecting unknown names and values off the menu.

    Missing knobs take their declared default. Raises ValueError with a message
    that names the offending knob.
    """
    specs = {s.name: s for s in knob_specs(cls)}
    # Names an older declaration had (cls.RETIRED_KNOBS: name -> why) are dropped, not refused:
    # rows stored and clients built before the change keep working.
    retired = retired_knobs(cls)
    data = {k: v for k, v in data.items() if k not in retired}
    unknown = sorted(set(data) - set(specs))
    if unknown:
        raise ValueError(f"unknown knob(s) for {cls.__name__}: {', '.join(unknown)}")
    values = {}
    for name, spec in specs.items():
        if name not in data:
            values[name] = spec.default
            continue
        v = data[name]
        # JSON round trips turn 0.25 into 0.25 but may turn 1.0 into 1; accept equal numbers.
        match = [c for c in spec.choices if type(c) is type(v) and c == v]
        if not match and spec.kind in ("number", "integer") and not isinstance(v, bool):
            match = [c for c in spec.choices if isinstance(v, (int, float)) and c == v]
        if not match:
            raise ValueError(
                f"{cls.__name__}.{name} = {v!r} is not one of {list(spec.choices)}"
            )
        values[name] = match[0]
    return cls(**values)


def json_schema(cls) -> dict:
    """A JSON schema of the config, stored beside results so rows stay readable."""
    props = {}
    for s in knob_specs(cls):
        props[s.name] = {
            "type": s.kind,
            "enum": list(s.choices),
            "default": s.default,
            "description": s.doc,
        }
    return {
        "title": cls.__name__,
        "type": "object",
        "properties": props,
        "additionalProperties": False,
    }
