"""Request and response models of the REST API.

Problem fields, statuses and passes come from ``fa4.problem`` and the DB models, timing modes from
``fa4.timing``;
knob models are built from the providers' knob dataclasses at run time
(:func:`knob_model`), so no knob name is ever written here.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from datetime import datetime
from functools import lru_cache
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, create_model, field_validator

from fa4.arch import ARCHES
from fa4.decode_problem import DecodeProblem
from fa4.knobs import knob_specs
from fa4.problem import DTYPES, PASSES
from fa4.timing import ALL as ALL_TIMINGS, DEFAULT_TIMING, TIMINGS
from store.models import STATUSES

# Column widths of the results DB: larger values would fail at INSERT time (a 5xx),
# so they are rejected up front with a 422.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# Limits of what one posted result may carry. The harness times at most 200 repetitions per
# candidate (tuner/harness.py max_reps), so 10,000 samples leave 50x room; free text is bounded
# so that no stored row can make later listings huge (a 55 MB versions blob once did).
MAX_SAMPLES = 10_000
MAX_REASON_CHARS = 10_000
MAX_JSON_FIELD_BYTES = 16 * 1024  # versions, provider_versions: package -> version maps
# The request body limit, checked before a byte of the body is parsed: the largest valid
# result is ~0.4 MB (10,000 samples of ~24 characters, a reason of 10,000 characters escaped
# to 6 bytes each, 2 x 16 KiB of JSON fields), so 1 MiB leaves 2.5x room.
MAX_BODY_BYTES = 1024 * 1024

Status = Literal[STATUSES]  # type: ignore[valid-type]
Pass = Literal[PASSES]  # type: ignore[valid-type]
Dtype = Literal[DTYPES]  # type: ignore[valid-type]
Provenance = Literal["exact", "nearest", "default"]
TimingName = Literal[TIMINGS]  # type: ignore[valid-type]
TIMING_DOC = ("How the measurement was timed, '<launch>-<l2>' (GET /v1/timings describes each mode): "
              + "; ".join(f"{t.name}: {t.doc}" for t in ALL_TIMINGS))


def _no_nul(value: Any) -> Any:
    # PostgreSQL text cannot hold NUL; refusing it everywhere keeps both backends alike.
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if isinstance(value, dict):
        for k, v in value.items():
            _no_nul(k)
            _no_nul(v)
    if isinstance(value, list):
        for v in value:
            _no_nul(v)
    return value


def _bounded_json(value: Any) -> Any:
    if value is not None and len(json.dumps(value, separators=(",", ":"))) > MAX_JSON_FIELD_BYTES:
        raise ValueError(f"must be at most {MAX_JSON_FIELD_BYTES} bytes as JSON")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


Size = Field(gt=0, le=INT32_MAX)


class ProblemIn(_Strict):
    """An attention shape (``fa4.problem.Problem``); ``pass`` is fwd or bwd."""

    batch: int = Size
    seqlen_q: int = Size
    seqlen_k: int = Size
    heads_q: int = Size
    heads_kv: int = Size
    head_dim: int = Size
    head_dim_v: int = Size
    dtype: Dtype = "bf16"
    causal: bool = False
    deterministic: bool = False
    pass_: Pass = Field("fwd", alias="pass")
    # Issue 18's features; the defaults are the plain problem.
    window_left: int = Field(-1, ge=-1, le=INT32_MAX, description="keys left of the diagonal a row sees; -1: unbounded")
    window_right: int = Field(-1, ge=-1, le=INT32_MAX, description="keys right of the diagonal; -1: unbounded")
    softcap: float = Field(0.0, ge=0, allow_inf_nan=False, description="c * tanh(s / c) on the scores; 0: off")
    sink: bool = Field(False, description="a learnable per-head sink logit in the softmax denominator")
    varlen: bool = Field(False, description="packed variable-length sequences: batch = sequences, seqlens = the longest")
    varlen_mean_q: int = Field(0, ge=0, le=INT32_MAX, description="varlen: mean query rows per sequence; 0 otherwise")
    varlen_mean_k: int = Field(0, ge=0, le=INT32_MAX, description="varlen: mean keys per sequence; 0 otherwise")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_problem_dict(self) -> dict:
        return self.model_dump(by_alias=True)


def _decode_fields() -> dict:
    """Pydantic fields of fa4.decode_problem.DecodeProblem, one per dataclass field and typed as it is.

    Only the types and the database's column widths are checked here; the problem's own rules
    (positive sizes, GQA divisibility, ...) are ``DecodeProblem.errors()``, applied when the
    service builds the problem (a 422 naming the rule).
    """
    hints = typing.get_type_hints(DecodeProblem)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(DecodeProblem):
        kind = hints[f.name]
        default = ... if f.default is dataclasses.MISSING else f.default
        doc = f"DecodeProblem.{f.name}" + ("" if default is ... else f" (default {default!r})")
        if kind is int:
            fields[f.name] = (int, Field(default, ge=0, le=INT32_MAX, description=doc))
        elif f.name == "dtype":
            fields[f.name] = (Dtype, Field(default, description=doc))
        else:
            fields[f.name] = (kind, Field(default, description=doc))
    return fields


class _DecodeProblemBase(_Strict):
    def to_problem(self) -> DecodeProblem:
        """The DecodeProblem (ValueError with its rules' reasons when it is not one)."""
        return DecodeProblem(**{f.name: getattr(self, f.name) for f in dataclasses.fields(DecodeProblem)})


DecodeProblemIn = create_model(
    "DecodeProblemIn",
    __base__=_DecodeProblemBase,
    __doc__="A decode step's shape (``fa4.decode_problem.DecodeProblem``), as its ``to_dict()`` spells it.",
    kind=(Literal["decode"], Field(description="Tells a decode problem from an attention one")),
    **_decode_fields(),
)


# The query of GET /v1/configs/best-decode: who asks (as GET /v1/configs/best's first parameters),
# then the problem's fields, generated from the dataclass so that a new field is a new parameter.
# Unknown parameters are refused: a misspelt field would otherwise answer its default's problem.
DecodeConfigQuery = create_model(
    "DecodeConfigQuery",
    __base__=_DecodeProblemBase,
    __doc__="The query of GET /v1/configs/best-decode: the device, provider and caller, then DecodeProblem's fields.",
    device=(str, Field(min_length=1, max_length=255, pattern=r"^[^\x00]*$", description="GPU name, e.g. 'NVIDIA H200'",
                       examples=["NVIDIA H200"])),
    provider=(str, Field("fa4-decode", min_length=1, max_length=64, pattern=r"^[^\x00]*$", examples=["fa4-decode"])),
    source_fingerprint=(Optional[str], Field(
        None, max_length=128, pattern=r"^[^\x00]*$",
        description="Judge staleness against this kernel source (the caller's) instead of the service's own")),
    arch=(Optional[Literal[tuple(ARCHES)]], Field(  # type: ignore[valid-type]
        None, description="Arch for feasibility checks; default: the device's, from the database")),
    timing=(TimingName, Field(DEFAULT_TIMING, description="The timing mode the caller runs in; answered from "
                              "measurements of this mode only. " + TIMING_DOC)),
    **_decode_fields(),
)


def _problem_kind(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("kind", "attention")
    return "decode" if isinstance(value, DecodeProblemIn) else "attention"


# A posted problem: attention (ProblemIn, no "kind") or decode ("kind": "decode"). The tag is no
# part of the JSON path: the service's validation messages leave it out of their locations.
PROBLEM_KINDS = ("attention", "decode")
AnyProblemIn = Annotated[
    Union[Annotated[ProblemIn, Tag("attention")], Annotated[DecodeProblemIn, Tag("decode")]],
    Discriminator(_problem_kind),
]


class DeviceIn(_Strict):
    """A GPU and its software stack, as ``ResultsStore.upsert_device`` takes it."""

    name: str = Field(min_length=1, max_length=255)
    compute_capability: str = Field(min_length=1, max_length=16, pattern=r"^\d+\.\d+$")
    sm_count: int = Field(gt=0, le=INT32_MAX)
    l2_bytes: int = Field(gt=0, le=INT64_MAX)
    memory_bytes: int = Field(gt=0, le=INT64_MAX)
    driver: Optional[str] = Field(None, max_length=64)
    cuda: Optional[str] = Field(None, max_length=64)
    torch: Optional[str] = Field(None, max_length=64)
    cutlass_dsl: Optional[str] = Field(None, max_length=64)
    provider_versions: dict[str, str] = Field(
        default_factory=dict, description=f"package -> version; at most {MAX_JSON_FIELD_BYTES} bytes as JSON")

    @field_validator("*")
    @classmethod
    def _nul(cls, v):
        return _no_nul(v)

    @field_validator("provider_versions")
    @classmethod
    def _size(cls, v):
        return _bounded_json(v)


Timing = Field(None, ge=0, allow_inf_nan=False)


class ResultIn(_Strict):
    """One measurement sent by a remote tuner host."""

    device: DeviceIn
    provider: str = Field(min_length=1, max_length=64)
    problem: AnyProblemIn
    config: Optional[dict[str, Any]] = Field(
        None, description="Knob values; validated against the provider's knob dataclass for this pass "
        "(see GET /v1/providers/{name}/knobs). Omitted knobs take their defaults.",
    )
    status: Status
    reason: Optional[str] = Field(None, max_length=MAX_REASON_CHARS)
    samples_ms: list[float] = Field(default_factory=list, max_length=MAX_SAMPLES)
    median_ms: Optional[float] = Timing
    iqr_ms: Optional[float] = Timing
    tflops: Optional[float] = Timing
    error: Optional[float] = Field(None, allow_inf_nan=False)
    ref_error: Optional[float] = Field(None, allow_inf_nan=False)
    source_fingerprint: str = Field("", max_length=128)
    study_name: Optional[str] = Field(None, max_length=255)
    trial_number: Optional[int] = Field(None, ge=0, le=INT32_MAX)
    is_default: bool = False
    versions: Optional[dict[str, Any]] = Field(
        None, description=f"Library versions of the measurement; at most {MAX_JSON_FIELD_BYTES} bytes as JSON")
    created_at: Optional[datetime] = None
    timing: TimingName = Field(DEFAULT_TIMING, description=TIMING_DOC)
    idempotency_key: Optional[str] = Field(
        None, min_length=1, max_length=64,
        description="Retries with the same key store nothing new (the Idempotency-Key header works too). "
        "Without one, the hash of the payload is the key.",
    )

    @field_validator("*")
    @classmethod
    def _nul(cls, v):
        return _no_nul(v)

    @field_validator("versions")
    @classmethod
    def _versions_size(cls, v):
        return _bounded_json(v)

    @field_validator("samples_ms")
    @classmethod
    def _samples_finite(cls, v: list[float]) -> list[float]:
        for x in v:
            if not (x >= 0 and x != float("inf")):
                raise ValueError("samples_ms must be finite non-negative numbers")
        return v


class ResultCreated(BaseModel):
    id: int
    created: bool = Field(description="False when this was a retry of an already stored result")
    idempotency_key: str


class Measurement(BaseModel):
    """A stored measurement, as ``ResultsStore`` returns it."""

    id: int
    device: str
    device_id: int
    problem: dict[str, Any]
    problem_id: int
    provider: str
    config: Optional[dict[str, Any]]
    config_id: int
    status: str
    reason: Optional[str]
    samples_ms: list[float]
    n_samples: int
    median_ms: Optional[float]
    iqr_ms: Optional[float]
    tflops: Optional[float]
    error: Optional[float]
    ref_error: Optional[float]
    source_fingerprint: str
    study_name: Optional[str]
    trial_number: Optional[int]
    is_default: bool
    created_at: Optional[str]
    versions: Optional[dict[str, Any]]
    timing: TimingName = Field(description=TIMING_DOC)


class ResultsPage(BaseModel):
    total: int
    limit: int
    offset: int
    sort: str
    items: list[Measurement]


class VerdictOutcome(BaseModel):
    """What the interleaved re-measurement of a study's top configs against the default decided."""

    significant: bool = Field(description="True: the served challenger beat the default beyond the spread; "
                              "False: no significant gain, the default is served")
    gain: float = Field(description="Median over rounds of challenger/default TFLOP/s, minus 1 (the winner's, "
                        "or the closest challenger's when the default stays)")
    spread: float = Field(description="Half the range of those per-round ratios")
    rounds: int = Field(description="Interleaved rounds measured")


class Verdict(VerdictOutcome):
    judged_at: str


class VerdictListed(VerdictOutcome):
    """The newest verdict of one (device, problem, provider, timing mode), as GET /v1/verdicts lists them."""

    id: int
    study_name: Optional[str] = Field(description="The study whose top configs were re-measured")
    device: str
    provider: str
    problem: dict[str, Any] = Field(description="The problem re-measured (fa4.problem.Problem fields)")
    timing: TimingName = Field(description="The timing mode of the re-measurement and of the row it serves")
    created_at: Optional[str] = Field(description="When the verdict was recorded (ISO-8601 UTC)")
    measurement_id: int = Field(description="The measurement a lookup serves for the problem (GET /v1/configs/best)")
    source_fingerprint: str = Field(description="Kernel source the re-measurement ran")


class BestConfig(BaseModel):
    """The config to use for a problem, and where that answer comes from."""

    provenance: Provenance = Field(
        description="exact: measured on this very shape with the running kernel source; nearest: the best "
        "config of the nearest measured shape of the same family, with this shape's heuristic on every knob "
        "where the two shapes' heuristics differ (notes name them), or of this shape measured from other "
        "kernel source (see stale); default: the provider's heuristic, nothing usable was measured"
    )
    stale: bool = Field(description="The served measurement comes from different kernel source than the running one")
    timing: TimingName = Field(description="The timing mode asked for; only measurements of this mode answer it "
                               "(none of it: the default, with a note naming the modes measured)")
    notes: list[str] = Field(description="Why this answer and not a better one, in words")
    device: str
    provider: str
    problem: dict[str, Any] = Field(description="The problem asked about")
    measured_problem: Optional[dict[str, Any]] = Field(description="The problem the numbers were measured on")
    config: Optional[dict[str, Any]]
    tflops: Optional[float]
    median_ms: Optional[float]
    iqr_ms: Optional[float]
    error: Optional[float]
    ref_error: Optional[float]
    n_samples: Optional[int]
    measured_at: Optional[str]
    versions: Optional[dict[str, Any]] = Field(description="Library versions the measurement was taken with")
    device_versions: Optional[dict[str, Any]] = Field(
        description="Software stack of the measuring machine: driver, CUDA, torch, CuTe DSL, provider versions"
    )
    measurement_id: Optional[int]
    source_fingerprint: Optional[str] = Field(description="Kernel source the measurement was taken from")
    running_fingerprint: Optional[str] = Field(description="Kernel source staleness was judged against")
    distance: Optional[float] = Field(description="Shape distance to the measured problem (0 = exact)")
    verdict: Optional[Verdict] = Field(
        None, description="The confidence behind the served config: the study's top configs re-measured "
        "against the default, interleaved (null: not re-measured)")


class Device(BaseModel):
    id: int
    name: str
    compute_capability: str
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    driver: Optional[str]
    cuda: Optional[str]
    torch: Optional[str]
    cutlass_dsl: Optional[str]
    provider_versions: dict[str, Any]
    fingerprint: str
    created_at: Optional[str]
    n_results: int


class Provider(BaseModel):
    name: str
    available: bool
    unavailable_reason: Optional[str]
    passes: list[str]
    source_fingerprint: Optional[str]
    knob_classes: dict[str, Optional[str]] = Field(description="pass -> knob dataclass name (null: no knobs)")
    n_results: int


class Knob(BaseModel):
    name: str
    type: str
    choices: list[Any]
    default: Any
    doc: str


class PassKnobs(BaseModel):
    knob_class: Optional[str]
    knobs: list[Knob]
    json_schema: Optional[dict[str, Any]] = Field(description="JSON schema of the config object for this pass")


class ProviderKnobs(BaseModel):
    provider: str
    passes: dict[str, PassKnobs]


class Trial(BaseModel):
    trial_number: Optional[int]
    measurement_id: int
    status: str
    reason: Optional[str]
    config: Optional[dict[str, Any]]
    tflops: Optional[float]
    median_ms: Optional[float]
    error: Optional[float]
    is_default: bool
    created_at: Optional[str]


class Study(BaseModel):
    study_name: str
    device: str
    provider: str
    problem: dict[str, Any]
    timing: TimingName = Field(description="The timing mode the study's trials were measured in")
    n_trials: int
    n_ok: int
    best: Optional[Trial]
    trials: list[Trial]


class TimingMode(BaseModel):
    """One timing mode of fa4.timing, as GET /v1/timings lists them."""

    name: TimingName = Field(description="Canonical '<launch>-<l2>' form, as the timing parameters take it")
    launch: str = Field(description="eager: Python launches each repetition; graph: replays of a CUDA graph")
    l2: str = Field(description="cold: L2 flushed before each repetition; warm: not flushed")
    doc: str
    default: bool = Field(description="The mode of requests that name none (and of rows from before modes)")


class ProblemField(BaseModel):
    """A problem field that tells measurement families apart, as GET /v1/problem-fields lists them."""

    name: str = Field(description="The field's spelling in problems, filters and the results query")
    default: Any = Field(None, description="Its value in a problem that does not set it (null: always set)")


class Health(BaseModel):
    status: str
    database: str
    schema_revision: Optional[str]


class Error(BaseModel):
    error: str = Field(description="What went wrong, in one sentence")
    detail: Optional[list[dict[str, Any]]] = None


@lru_cache(maxsize=None)
def knob_model(knob_cls: type) -> type[BaseModel]:
    """A pydantic model of a knob dataclass: one Literal field per knob, unknown names refused.

    It gives the REST schema; validation of posted configs goes through
    ``fa4.knobs.config_from_dict`` so that the service and the tuner accept exactly
    the same values.
    """
    fields = {}
    for spec in knob_specs(knob_cls):
        fields[spec.name] = (Literal[spec.choices], Field(spec.default, description=spec.doc))
    return create_model(
        knob_cls.__name__,
        __config__=ConfigDict(extra="forbid"),
        # A dataclass without a docstring gets its signature as __doc__, which says nothing here.
        __doc__=f"Knob values of {knob_cls.__name__}; omitted knobs take their defaults.",
        **fields,
    )
