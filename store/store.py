"""The results store: the one API through which tuners and the service touch the database.

Every public method runs in its own short transaction and returns plain,
JSON-ready values (dicts, lists, str, numbers; datetimes as ISO-8601 UTC
strings), so no ORM object or session ever leaks to callers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fa4.knobs import config_from_dict, config_to_dict, json_schema
from fa4.decode_problem import DecodeProblem, problem_from_dict
from fa4.problem import Problem
from fa4.timing import DEFAULT_TIMING, canonical as canonical_timing

from . import models as m
from .engine import READ_ONLY, make_engine, masked, resolve_url
from .migrate import upgrade_to_head

STATUSES = m.STATUSES

_DEVICE_REQUIRED = ("name", "compute_capability", "sm_count", "l2_bytes", "memory_bytes")
_DEVICE_OPTIONAL = ("driver", "cuda", "torch", "cutlass_dsl", "provider_versions")
_PROBLEM_FIELDS = tuple(f.name for f in dataclasses.fields(Problem))
# Revision 0007: a problems row is an attention Problem or (kind "decode") a DecodeProblem; the
# decode-only fields are their own columns, the attention-only ones stay at the Problem defaults.
KINDS = ("attention", "decode")
_DECODE_FIELDS = tuple(f.name for f in dataclasses.fields(DecodeProblem))
_DECODE_ONLY = tuple(n for n in _DECODE_FIELDS if n not in _PROBLEM_FIELDS)
_KIND_DEFAULTS = {"kind": "attention", **{n: f.default for f in dataclasses.fields(DecodeProblem)
                                          for n in _DECODE_ONLY if f.name == n}}
_ATTENTION_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Problem)
                       if f.default is not dataclasses.MISSING}

# measurements() filters that match one column exactly, and where that column lives.
_EQ_FILTERS = {
    "device": m.Device.name,
    "provider": m.Config.provider,
    "study_name": m.Measurement.study_name,
    "source_fingerprint": m.Measurement.source_fingerprint,
    "is_default": m.Measurement.is_default,
    "timing": m.Measurement.timing,
    **{name: getattr(m.Problem, name) for name in _PROBLEM_FIELDS + tuple(_KIND_DEFAULTS)},
}

# measurements(sort=...) keys and the columns they order by.
SORT_KEYS = {
    "id": m.Measurement.id,
    "created_at": m.Measurement.created_at,
    "tflops": m.Measurement.tflops,
    "median_ms": m.Measurement.median_ms,
    "trial_number": m.Measurement.trial_number,
}


def canonical_json(value: Any) -> str:
    """The one textual form of a JSON value: sorted keys, no whitespace, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _utc(ts: datetime) -> datetime:
    # SQLite hands timestamps back without a zone, and callers may pass naive
    # ones; everything in the database is UTC.
    if ts.tzinfo is None:
        return ts.replace(tzinfo=timezone.utc)
    return ts.astimezone(timezone.utc)


def _iso(ts: datetime | None) -> str | None:
    return None if ts is None else _utc(ts).isoformat()


def _as_problem(problem: Problem | DecodeProblem | dict) -> Problem | DecodeProblem:
    """A Problem or DecodeProblem; a dict is a decode problem when it says ``"kind": "decode"``."""
    if isinstance(problem, (Problem, DecodeProblem)):
        return problem
    if isinstance(problem, dict):
        return problem_from_dict(problem)
    raise TypeError(f"expected fa4.problem.Problem, DecodeProblem or dict, got {type(problem).__name__}")


def _row_key(p: Problem | DecodeProblem) -> dict:
    """The problems-table columns that identify ``p`` (the unique constraint's)."""
    if isinstance(p, DecodeProblem):
        shared = {n: getattr(p, n) for n in _DECODE_FIELDS if n in _PROBLEM_FIELDS}
        return {**_ATTENTION_DEFAULTS, "head_dim_v": p.head_dim, **shared, "kind": "decode",
                **{n: getattr(p, n) for n in _DECODE_ONLY}}
    return {name: getattr(p, name) for name in _PROBLEM_FIELDS} | _KIND_DEFAULTS


def _json_ready(name: str, value: Any) -> Any:
    try:
        canonical_json(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} is not JSON-serialisable: {e}") from None
    return value


def _timing(name: str, value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return v


def _error_metric(value: Any) -> float | None:
    # A kernel that produced NaN/inf has no meaningful error value; the row's
    # status and reason carry that, and NULL keeps rows valid JSON on every backend.
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _device_dict(d: m.Device) -> dict:
    return {
        "id": d.id,
        "name": d.name,
        "compute_capability": d.compute_capability,
        "sm_count": d.sm_count,
        "l2_bytes": d.l2_bytes,
        "memory_bytes": d.memory_bytes,
        "driver": d.driver,
        "cuda": d.cuda,
        "torch": d.torch,
        "cutlass_dsl": d.cutlass_dsl,
        "provider_versions": d.provider_versions,
        "fingerprint": d.fingerprint,
        "created_at": _iso(d.created_at),
    }


def _problem_of(p: m.Problem) -> Problem | DecodeProblem:
    if p.kind == "decode":
        return DecodeProblem(**{name: getattr(p, name) for name in _DECODE_FIELDS})
    return Problem(**{name: getattr(p, name) for name in _PROBLEM_FIELDS})


def _config_dict(c: m.Config) -> dict:
    return {
        "id": c.id,
        "provider": c.provider,
        "config": c.config,
        "knob_schema": c.knob_schema,
    }


# Every column a measurement is read with, selected as plain columns: building ORM objects for
# a page of 1000 rows cost ~100 ms of the GIL (seen on the demo DB), which starved the service's
# event loop; tuples of these columns cost a fraction of that.
_MEASUREMENT_COLUMNS = (
    m.Measurement.id, m.Device.name.label("device"), m.Measurement.device_id, m.Measurement.problem_id,
    m.Config.provider, m.Config.config, m.Measurement.config_id, m.Measurement.status, m.Measurement.reason,
    m.Measurement.samples_ms, m.Measurement.n_samples, m.Measurement.median_ms, m.Measurement.iqr_ms,
    m.Measurement.tflops, m.Measurement.error, m.Measurement.ref_error, m.Measurement.source_fingerprint,
    m.Measurement.study_name, m.Measurement.trial_number, m.Measurement.is_default, m.Measurement.created_at,
    m.Measurement.versions, m.Measurement.timing,
    *(getattr(m.Problem, name).label(f"problem.{name}") for name in _PROBLEM_FIELDS + tuple(_KIND_DEFAULTS)),
)
_OUTER = tuple(c.key for c in _MEASUREMENT_COLUMNS if not c.key.startswith("problem."))

# The rows a best-config answer is built from, and the problem fields that make a family: one
# query serves every shape of a family (family_rows), and a new row changes that family only.
FAMILY_FIELDS = ("pass_", "dtype", "head_dim", "head_dim_v", "causal", "deterministic",
                 "window_left", "window_right", "softcap", "sink", "varlen")
_SERVED = (m.Measurement.status == "ok", m.Measurement.tflops.is_not(None))


def family_key(problem: Problem | DecodeProblem) -> tuple:
    """The FAMILY_FIELDS values of ``problem``'s row, in that order: what ``changes_since`` names a
    family by (a decode problem's are the attention-only columns' defaults, its head_dim_v its head_dim)."""
    row = _row_key(_as_problem(problem))
    return tuple(row[name] for name in FAMILY_FIELDS)


def problem_fields() -> list[dict]:
    """FAMILY_FIELDS as the REST API spells them, each with the value a Problem takes when the field
    is not set (None: it has no default), for clients that filter on them (the dashboard)."""
    defaults = {f.name: f.default for f in dataclasses.fields(Problem)}
    return [{"name": "pass" if f == "pass_" else f,
             "default": None if defaults[f] is dataclasses.MISSING else defaults[f]} for f in FAMILY_FIELDS]


# Problem.to_dict's spelling of each field (a row of the database is a valid Problem already:
# building one per row, and asdict() of it, was most of the cost of reading a page).
_PROBLEM_KEYS = tuple((f"problem.{name}", "pass" if name == "pass_" else name) for name in _PROBLEM_FIELDS)


def _measurement_dict(row) -> dict:
    mapping = row._mapping
    out = {k: mapping[k] for k in _OUTER}
    if mapping["problem.kind"] == "decode":
        out["problem"] = {"kind": "decode", **{n: mapping[f"problem.{n}"] for n in _DECODE_FIELDS}}
    else:  # attention rows keep Problem.to_dict's keys exactly
        out["problem"] = {key: mapping[col] for col, key in _PROBLEM_KEYS}
    out["samples_ms"] = list(out["samples_ms"] or [])
    out["created_at"] = _iso(out["created_at"])
    return out


def _verdict_query(device_name: str, provider: str, problem_conditions: list):
    """Verdicts of ``provider`` on the named device for the problems the conditions select."""
    return (
        select(m.Verdict)
        .join(m.Device, m.Device.id == m.Verdict.device_id)
        .join(m.Problem, m.Problem.id == m.Verdict.problem_id)
        .where(m.Device.name == device_name, m.Verdict.provider == provider, *problem_conditions)
    )


def _verdict_dict(row: m.Verdict) -> dict:
    return {
        "id": row.id, "study_name": row.study_name, "significant": row.significant,
        "gain": row.gain, "spread": row.spread, "rounds": row.rounds,
        "source_fingerprint": row.source_fingerprint, "created_at": _iso(row.created_at),
        "timing": row.timing,
    }


def _problem_conditions(problem: Problem | DecodeProblem) -> list:
    return [getattr(m.Problem, name) == value for name, value in _row_key(problem).items()]


# Measurements as plain rows of _MEASUREMENT_COLUMNS, joined to the tables we filter on; built
# once (statements are immutable, .where() makes a new one).
_MEASUREMENTS = (
    select(*_MEASUREMENT_COLUMNS)
    .select_from(m.Measurement)
    .join(m.Measurement.device)
    .join(m.Measurement.problem)
    .join(m.Measurement.config)
)


def _measurement_query():
    return _MEASUREMENTS


def _locals_without_self(ns: dict) -> dict:
    return {k: v for k, v in ns.items() if k != "self"}


def _new_measurement(
    *,
    device_id: int,
    problem_id: int,
    config_id: int,
    status: str,
    reason: str | None = None,
    samples_ms: Iterable[float] = (),
    median_ms: float | None = None,
    iqr_ms: float | None = None,
    tflops: float | None = None,
    error: float | None = None,
    ref_error: float | None = None,
    source_fingerprint: str = "",
    study_name: str | None = None,
    trial_number: int | None = None,
    is_default: bool = False,
    versions: dict | None = None,
    created_at: datetime | None = None,
    timing: str = DEFAULT_TIMING,
) -> m.Measurement:
    """A validated, not yet added Measurement row."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    timing = canonical_timing(timing)  # ValueError naming the modes
    samples = [_timing("samples_ms[]", x) for x in samples_ms]
    row = m.Measurement(
        device_id=int(device_id),
        problem_id=int(problem_id),
        config_id=int(config_id),
        status=status,
        reason=None if reason is None else str(reason),
        samples_ms=samples,
        n_samples=len(samples),
        median_ms=_timing("median_ms", median_ms),
        iqr_ms=_timing("iqr_ms", iqr_ms),
        tflops=_timing("tflops", tflops),
        error=_error_metric(error),
        ref_error=_error_metric(ref_error),
        source_fingerprint=str(source_fingerprint or ""),
        study_name=study_name,
        trial_number=None if trial_number is None else int(trial_number),
        is_default=bool(is_default),
        versions=None if versions is None else _json_ready("versions", dict(versions)),
        created_at=_utc(created_at) if created_at is not None else m.utcnow(),
        timing=timing,
    )
    if status == "ok" and (row.median_ms is None or row.tflops is None):
        raise ValueError("an 'ok' measurement needs median_ms and tflops")
    return row


def _check_refs(s: Session, row: m.Measurement) -> None:
    for model, ident in ((m.Device, row.device_id), (m.Problem, row.problem_id), (m.Config, row.config_id)):
        if s.get(model, ident) is None:
            raise ValueError(f"no {model.__tablename__} row with id {ident}")


class ResultsStore:
    """Measurements of attention kernels, keyed by device, problem and config.

    Create with :meth:`open`; the constructor takes an already configured engine.
    """

    def __init__(self, engine: Engine):
        self._engine = engine
        # Reads go through an engine view flagged read-only so that, on SQLite,
        # they do not queue behind (or block) writers for the write lock.
        self._read_engine = engine.execution_options(**{READ_ONLY: True})

    # -- lifecycle ---------------------------------------------------------------

    @classmethod
    def open(cls, url: str | None = None) -> "ResultsStore":
        """Connect to ``url`` (default: ``$FA4_DB``, else the user data dir) and migrate to head."""
        engine = make_engine(resolve_url(url))
        try:
            upgrade_to_head(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    @property
    def url(self) -> str:
        """The database URL with any password masked."""
        return masked(self._engine.url)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResultsStore({self.url!r})"

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with Session(self._engine, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with Session(self._read_engine) as s, s.begin():
            yield s

    def _get_or_create(self, model, key: dict, extra: dict) -> int:
        """Id of the row matching ``key``; insert it (with ``extra``) when missing.

        Another process may insert the same row between our SELECT and INSERT
        (PostgreSQL; SQLite writers are serialised). The savepoint lets us lose that
        race gracefully and read the winner's row.
        """
        with self._write() as s:
            found = s.scalar(select(model.id).filter_by(**key))
            if found is not None:
                return found
            obj = model(**key, **extra)
            try:
                with s.begin_nested():
                    s.add(obj)
                    s.flush()
                return obj.id
            except IntegrityError:
                found = s.scalar(select(model.id).filter_by(**key))
                if found is None:
                    raise
                return found

    # -- devices -----------------------------------------------------------------

    def upsert_device(self, info: dict) -> int:
        """Id of the device described by ``info``; same GPU + same software stack = same id."""
        missing = [k for k in _DEVICE_REQUIRED if info.get(k) in (None, "")]
        if missing:
            raise ValueError(f"device info lacks {', '.join(missing)}")
        unknown = sorted(set(info) - set(_DEVICE_REQUIRED) - set(_DEVICE_OPTIONAL))
        if unknown:
            raise ValueError(f"unknown device info key(s): {', '.join(unknown)}")
        cc = info["compute_capability"]
        if isinstance(cc, (tuple, list)):
            cc = ".".join(str(x) for x in cc)
        fields = {
            "name": str(info["name"]),
            "compute_capability": str(cc),
            "sm_count": int(info["sm_count"]),
            "l2_bytes": int(info["l2_bytes"]),
            "memory_bytes": int(info["memory_bytes"]),
            **{k: (None if info.get(k) is None else str(info[k])) for k in ("driver", "cuda", "torch", "cutlass_dsl")},
            "provider_versions": _json_ready("provider_versions", dict(info.get("provider_versions") or {})),
        }
        for k in ("sm_count", "l2_bytes", "memory_bytes"):
            if fields[k] <= 0:
                raise ValueError(f"device {k} must be positive, got {fields[k]}")
        fingerprint = _sha256(canonical_json(fields))
        return self._get_or_create(m.Device, {"fingerprint": fingerprint}, fields)

    def get_device(self, device_id: int) -> dict | None:
        with self._read() as s:
            d = s.get(m.Device, device_id)
            return None if d is None else _device_dict(d)

    def devices(self) -> list[dict]:
        with self._read() as s:
            return [_device_dict(d) for d in s.scalars(select(m.Device).order_by(m.Device.id))]

    # -- problems ----------------------------------------------------------------

    def upsert_problem(self, problem: Problem | DecodeProblem | dict) -> int:
        p = _as_problem(problem)
        key = {"pass_" if name == "pass" else name: v for name, v in _row_key(p).items()}
        return self._get_or_create(m.Problem, key, {})

    def get_problem(self, problem_id: int) -> Problem | DecodeProblem | None:
        with self._read() as s:
            p = s.get(m.Problem, problem_id)
            return None if p is None else _problem_of(p)

    # -- configs -----------------------------------------------------------------

    def upsert_config(self, provider: str, config: dict | None, knob_cls: type | None = None) -> int:
        """Id of ``provider``'s config; validated against ``knob_cls`` when given.

        With a knob class, missing knobs take their declared defaults before the
        canonical form is built, so ``{}`` and the explicit defaults are one row.
        Raises ValueError for unknown knobs or values off a knob's menu.
        """
        if not isinstance(provider, str) or not provider.strip():
            raise ValueError(f"provider must be a non-empty string, got {provider!r}")
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            config = config_to_dict(config)
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"config must be a dict or None, got {type(config).__name__}")
        schema = None
        if knob_cls is not None:
            if config is None:
                raise ValueError(f"provider {provider!r} has knobs ({knob_cls.__name__}); a config is required")
            values = config_to_dict(config_from_dict(knob_cls, config))
            schema = json_schema(knob_cls)
        else:
            # Without a knob class there is nothing to validate against; an empty
            # mapping means the same as "no knobs".
            values = _json_ready("config", dict(config)) if config else None
        text = canonical_json(values)
        return self._get_or_create(
            m.Config,
            {"provider": provider, "config_hash": _sha256(text)},
            {"config_json": text, "config": values, "knob_schema": schema},
        )

    def get_config(self, config_id: int) -> dict | None:
        with self._read() as s:
            c = s.get(m.Config, config_id)
            return None if c is None else _config_dict(c)

    # -- measurements ------------------------------------------------------------

    def add_measurement(
        self,
        device_id: int,
        problem_id: int,
        config_id: int,
        *,
        status: str,
        reason: str | None = None,
        samples_ms: Iterable[float] = (),
        median_ms: float | None = None,
        iqr_ms: float | None = None,
        tflops: float | None = None,
        error: float | None = None,
        ref_error: float | None = None,
        source_fingerprint: str = "",
        study_name: str | None = None,
        trial_number: int | None = None,
        is_default: bool = False,
        versions: dict | None = None,
        created_at: datetime | None = None,
        timing: str = DEFAULT_TIMING,
    ) -> int:
        """Record one candidate's outcome in a single transaction; returns the row id.

        ``timing``: the mode it was timed in (fa4.timing), "eager-cold" unless told."""
        row = _new_measurement(**_locals_without_self(locals()))
        with self._write() as s:
            _check_refs(s, row)
            s.add(row)
            s.flush()
            return row.id

    def add_measurement_once(self, idempotency_key: str, device_id: int, problem_id: int, config_id: int,
                             **fields) -> tuple[int, bool]:
        """Like :meth:`add_measurement`, but a second call with the same key inserts nothing.

        Returns ``(row id, created)``; a retry gets the first call's row id and False.
        """
        key = str(idempotency_key)
        if not key or len(key) > 64:
            raise ValueError("idempotency key must be 1..64 characters")
        row = _new_measurement(device_id=device_id, problem_id=problem_id, config_id=config_id, **fields)
        row.idempotency_key = key
        lookup = select(m.Measurement.id).where(m.Measurement.idempotency_key == key)
        with self._write() as s:
            # SQLite writers hold the write lock from BEGIN, so this check cannot race;
            # on PostgreSQL a concurrent twin may still win, which the savepoint absorbs.
            found = s.scalar(lookup)
            if found is not None:
                return found, False
            _check_refs(s, row)
            try:
                with s.begin_nested():
                    s.add(row)
                    s.flush()
                return row.id, True
            except IntegrityError:
                found = s.scalar(lookup)
                if found is None:
                    raise
                return found, False

    def get_measurement(self, measurement_id: int) -> dict | None:
        q = _measurement_query().where(m.Measurement.id == int(measurement_id))
        with self._read() as s:
            row = s.execute(q).first()
            return None if row is None else _measurement_dict(row)

    def _ok_rows(self, device_name: str, provider: str, problem: Problem | dict, timing: str):
        p = _as_problem(problem)
        return _measurement_query().where(
            m.Device.name == device_name,
            m.Config.provider == provider,
            m.Measurement.status == "ok",
            m.Measurement.timing == canonical_timing(timing),
            *_problem_conditions(p),
        )

    def best(
        self,
        device_name: str,
        provider: str,
        problem: Problem | dict,
        *,
        source_fingerprint: str | None = None,
        timing: str = DEFAULT_TIMING,
    ) -> dict | None:
        """The config to serve for ``provider`` on this problem and device, as its measurement row.

        The newest verdict's row where a study's winners were re-measured against the default
        (a challenger only where it beat the default beyond the rounds' spread; the row then
        carries the verdict under "verdict"); else the fastest 'ok' measurement (max TFLOP/s),
        ties to the earliest row. With ``source_fingerprint``, only rows measured from that
        kernel source count. Only rows and verdicts of the ``timing`` mode count, never another's.
        """
        verdict = self.verdict(device_name, provider, problem, source_fingerprint=source_fingerprint, timing=timing)
        if verdict is not None:
            return verdict["measurement"] | {"verdict": {k: v for k, v in verdict.items() if k != "measurement"}}
        q = self._ok_rows(device_name, provider, problem, timing).where(m.Measurement.tflops.is_not(None))
        if source_fingerprint is not None:
            q = q.where(m.Measurement.source_fingerprint == source_fingerprint)
        q = q.order_by(m.Measurement.tflops.desc(), m.Measurement.id.asc()).limit(1)
        with self._read() as s:
            row = s.execute(q).first()
            return None if row is None else _measurement_dict(row)

    def add_verdict(self, device_id: int, problem_id: int, provider: str, *, measurement_id: int,
                    significant: bool, gain: float, spread: float, rounds: dict, study_name: str | None = None,
                    source_fingerprint: str = "", timing: str = DEFAULT_TIMING) -> int:
        """Record a re-measurement's outcome (which row lookups serve) in one transaction.

        ``timing`` is the mode of the re-measurement; the served row must have been timed in it."""
        timing = canonical_timing(timing)
        row = m.Verdict(device_id=device_id, problem_id=problem_id, provider=provider, study_name=study_name,
                        measurement_id=measurement_id, significant=bool(significant), gain=float(gain),
                        spread=float(spread), rounds=rounds, source_fingerprint=source_fingerprint,
                        created_at=m.utcnow(), timing=timing)
        with self._write() as s:
            served = s.get(m.Measurement, measurement_id)
            if served is None:
                raise ValueError(f"no measurement {measurement_id} to serve")
            if served.timing != timing:
                raise ValueError(f"measurement {measurement_id} was timed {served.timing}, not {timing}: "
                                 "a verdict serves a row of its own timing mode")
            s.add(row)
            s.flush()
            return row.id

    def verdict(self, device_name: str, provider: str, problem: Problem | dict, *,
                source_fingerprint: str | None = None, timing: str = DEFAULT_TIMING) -> dict | None:
        """The newest verdict of the ``timing`` mode for the problem (with the measurement it serves), or None."""
        p = _as_problem(problem)
        q = _verdict_query(device_name, provider, _problem_conditions(p)).where(
            m.Verdict.timing == canonical_timing(timing))
        if source_fingerprint is not None:
            q = q.where(m.Verdict.source_fingerprint == source_fingerprint)
        q = q.order_by(m.Verdict.created_at.desc(), m.Verdict.id.desc()).limit(1)
        with self._read() as s:
            row = s.scalars(q).first()
            if row is None:
                return None
            return _verdict_dict(row) | {"measurement": _measurement_dict(
                s.execute(_measurement_query().where(m.Measurement.id == row.measurement_id)).one())}

    def verdicts(self, *, device: str | None = None, provider: str | None = None, timing: str | None = None,
                 study_name: str | None = None) -> list[dict]:
        """The newest verdict of each (device name, problem, provider, timing mode) matching the filters
        (None: any), ordered by device, provider, problem and mode.

        Each is the verdict's fields (``rounds`` as stored) plus ``device``, ``provider``, ``problem`` (a
        Problem dict) and ``measurement_id``: the row a lookup serves for that problem.
        """
        columns = _PROBLEM_FIELDS + tuple(n for n in _DECODE_ONLY + ("kind",) if n not in _PROBLEM_FIELDS)
        q = (
            select(m.Verdict, m.Device.name, *(getattr(m.Problem, name) for name in columns))
            .join(m.Device, m.Device.id == m.Verdict.device_id)
            .join(m.Problem, m.Problem.id == m.Verdict.problem_id)
        )
        if device is not None:
            q = q.where(m.Device.name == device)
        if provider is not None:
            q = q.where(m.Verdict.provider == provider)
        if timing is not None:
            q = q.where(m.Verdict.timing == canonical_timing(timing))
        if study_name is not None:
            q = q.where(m.Verdict.study_name == study_name)
        q = q.order_by(m.Verdict.created_at.asc(), m.Verdict.id.asc())
        newest: dict[tuple, dict] = {}
        with self._read() as s:
            for v, device_name, *fields in s.execute(q):
                row = dict(zip(columns, fields))
                if row["kind"] == "decode":  # as _measurement_dict spells a decode row's problem
                    problem = {"kind": "decode", **{n: row[n] for n in _DECODE_FIELDS}}
                else:
                    problem = {("pass" if n == "pass_" else n): row[n] for n in _PROBLEM_FIELDS}
                # Oldest first: a later verdict of the same key replaces an earlier one.
                newest[(device_name, v.problem_id, v.provider, v.timing)] = _verdict_dict(v) | {
                    "device": device_name, "provider": v.provider, "problem": problem,
                    "measurement_id": v.measurement_id}

        def order(v: dict) -> tuple:
            p = v["problem"]
            return (v["device"], v["provider"], p.get("pass", "decode"), p["dtype"], p["head_dim"], p["causal"],
                    p.get("deterministic", False), p["seqlen_q"], p["seqlen_k"], p["batch"], p["heads_q"],
                    p["heads_kv"], p.get("head_dim_v", p["head_dim"]), p.get("page_size", 0),
                    p.get("seqlen_k_mean", 0), v["timing"])

        return sorted(newest.values(), key=order)

    def default_result(self, device_name: str, provider: str, problem: Problem | dict, *,
                       timing: str = DEFAULT_TIMING) -> dict | None:
        """The newest 'ok' measurement of the provider's default (heuristic) config in the ``timing`` mode."""
        q = (
            self._ok_rows(device_name, provider, problem, timing)
            .where(m.Measurement.is_default.is_(True))
            .order_by(m.Measurement.created_at.desc(), m.Measurement.id.desc())
            .limit(1)
        )
        with self._read() as s:
            row = s.execute(q).first()
            return None if row is None else _measurement_dict(row)

    def _filtered(self, query, filters: dict):
        filters = dict(filters)
        if "pass" in filters:
            filters["pass_"] = filters.pop("pass")
        status = filters.pop("status", None)
        unknown = sorted(set(filters) - set(_EQ_FILTERS))
        if unknown:
            raise TypeError(f"unknown measurement filter(s): {', '.join(unknown)}")
        for name, value in filters.items():
            if value is not None:
                if name == "timing":
                    value = canonical_timing(value)
                query = query.where(_EQ_FILTERS[name] == value)
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            bad = [x for x in wanted if x not in STATUSES]
            if bad:
                raise ValueError(f"status must be among {STATUSES}, got {bad}")
            query = query.where(m.Measurement.status.in_(wanted))
        return query

    def measurements(
        self,
        *,
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = False,
        sort: str | None = None,
        **filters,
    ) -> list[dict]:
        """Measurements matching every given filter, oldest first unless ``newest_first``.

        Filters (None means "any"): device (name), provider, status (one or several),
        study_name, source_fingerprint, is_default, timing (a mode of fa4.timing), and any Problem field (pass_ or
        "pass", head_dim, causal, dtype, seqlen_q, ...). ``sort`` names one of
        ``SORT_KEYS`` (``"-tflops"``: descending) and overrides ``newest_first``.
        """
        q = self._filtered(_measurement_query(), filters)
        if sort is not None:
            desc = sort.startswith("-")
            col = SORT_KEYS.get(sort.lstrip("-"))
            if col is None:
                raise ValueError(f"sort must be one of {sorted(SORT_KEYS)} (prefix '-' for descending), got {sort!r}")
            # NULLs (failed trials have no TFLOP/s) go last either way; id breaks ties stably.
            primary = col.desc() if desc else col.asc()
            tie = m.Measurement.id.desc() if desc else m.Measurement.id.asc()
            q = q.order_by(col.is_(None), primary, tie)
        elif newest_first:
            q = q.order_by(m.Measurement.created_at.desc(), m.Measurement.id.desc())
        else:
            q = q.order_by(m.Measurement.id.asc())
        if offset:
            q = q.offset(int(offset))
        if limit is not None:
            q = q.limit(int(limit))
        with self._read() as s:
            return [_measurement_dict(r) for r in s.execute(q)]

    def count(self, **filters) -> int:
        """Number of measurements matching the same filters as :meth:`measurements`."""
        base = (
            select(func.count(m.Measurement.id))
            .select_from(m.Measurement)
            .join(m.Measurement.device)
            .join(m.Measurement.problem)
            .join(m.Measurement.config)
        )
        with self._read() as s:
            return int(s.scalar(self._filtered(base, filters)))

    def family_rows(self, device_name: str, provider: str, problem: Problem | dict) -> list[dict]:
        """Every 'ok' row with TFLOP/s of ``provider`` on the device in ``problem``'s family, any source
        and any timing mode (each row says its own: ``store.best`` keeps the asked mode's).

        One query that lets a caller answer best-config questions for any shape of the
        family in memory (see ``store.best``); oldest row first.
        """
        p = _as_problem(problem)
        # A decode problem's family is the decode rows with its family columns: decode and attention
        # rows share the shape columns, never a family.
        same = [getattr(m.Problem, name) == value for name, value in zip(FAMILY_FIELDS, family_key(p))]
        same.append(m.Problem.kind == (DecodeProblem.kind if isinstance(p, DecodeProblem) else "attention"))
        q = _measurement_query().where(
            m.Device.name == device_name,
            m.Config.provider == provider,
            *_SERVED,
            *same,
        ).order_by(m.Measurement.id.asc())
        vq = _verdict_query(device_name, provider, same).order_by(m.Verdict.created_at.asc(), m.Verdict.id.asc())
        with self._read() as s:
            rows = [_measurement_dict(r) for r in s.execute(q)]
            # The newest verdict of each (problem, source, timing mode) marks the row it serves, so a
            # caller that caches these rows applies the re-measurement's decision too (store.best).
            newest = {(v.problem_id, v.source_fingerprint, v.timing):
                      _verdict_dict(v) | {"measurement_id": v.measurement_id} for v in s.scalars(vq)}
        by_id = {r["id"]: r for r in rows}
        for v in newest.values():
            if v["measurement_id"] in by_id:
                by_id[v["measurement_id"]]["verdict"] = v
        return rows

    def provider_counts(self) -> dict[str, int]:
        """Number of measurements per provider name present in the database."""
        q = (
            select(m.Config.provider, func.count(m.Measurement.id))
            .join(m.Measurement, m.Measurement.config_id == m.Config.id)
            .group_by(m.Config.provider)
        )
        with self._read() as s:
            return {name: int(n) for name, n in s.execute(q)}

    def device_counts(self) -> dict[int, int]:
        """Number of measurements per device id."""
        q = select(m.Measurement.device_id, func.count(m.Measurement.id)).group_by(m.Measurement.device_id)
        with self._read() as s:
            return {int(d): int(n) for d, n in s.execute(q)}

    def device_by_name(self, name: str) -> dict | None:
        """The newest device row of that name (a driver upgrade makes a new row)."""
        q = select(m.Device).where(m.Device.name == name).order_by(m.Device.id.desc()).limit(1)
        with self._read() as s:
            d = s.scalars(q).first()
            return None if d is None else _device_dict(d)

    def generation(self) -> tuple[int, int, int]:
        """(newest measurement id, device id, verdict id): changes whenever rows that answers depend on are added.

        Rows are only ever appended, so two equal generations mean equal answers; a cache
        can check this one cheap query instead of expiring everything on a timer.
        """
        with self._read() as s:
            return self._generation(s)

    @staticmethod
    def _generation(s: Session) -> tuple[int, int, int]:
        q = select(*(select(func.max(t.id)).scalar_subquery() for t in (m.Measurement, m.Device, m.Verdict)))
        return tuple(int(x or 0) for x in s.execute(q).one())

    def changes_since(self, generation: tuple[int, int, int]) -> tuple[tuple[int, int, int], set[tuple], set[str]]:
        """What was appended after ``generation``: (the new generation, families, device names).

        A family is ``(device name, provider, *FAMILY_FIELDS values)`` of a new row that answers can
        be built from (see family_rows), or of a new verdict (it picks the row served); device names
        are those that got a new device row. One read transaction, so the three agree.
        """
        last_m, last_d, last_v = generation
        with self._read() as s:
            now = self._generation(s)
            now_m, now_d, now_v = now
            families: set[tuple] = set()
            if now_m > last_m:
                q = (
                    select(m.Device.name, m.Config.provider, *(getattr(m.Problem, f) for f in FAMILY_FIELDS))
                    .select_from(m.Measurement)
                    .join(m.Measurement.device).join(m.Measurement.problem).join(m.Measurement.config)
                    .where(m.Measurement.id > last_m, m.Measurement.id <= now_m, *_SERVED)
                    .distinct()
                )
                families |= {tuple(r) for r in s.execute(q)}
            if now_v > last_v:
                q = (
                    select(m.Device.name, m.Verdict.provider, *(getattr(m.Problem, f) for f in FAMILY_FIELDS))
                    .select_from(m.Verdict)
                    .join(m.Device, m.Device.id == m.Verdict.device_id)
                    .join(m.Problem, m.Problem.id == m.Verdict.problem_id)
                    .where(m.Verdict.id > last_v, m.Verdict.id <= now_v)
                    .distinct()
                )
                families |= {tuple(r) for r in s.execute(q)}
            names: set[str] = set()
            if now_d > last_d:
                q = select(m.Device.name).where(m.Device.id > last_d, m.Device.id <= now_d).distinct()
                names = set(s.scalars(q))
        return now, families, names

    def ping(self) -> None:
        """Raise when the database cannot be reached."""
        with self._read() as s:
            s.execute(select(1))
