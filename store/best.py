"""Which config to serve for a problem: exact measurement, nearest measured shape, or the heuristic.

Decode problems (fa4.decode_problem) follow the same rule without the nearest-shape steps.

Kept apart from the HTTP layer so the launch-time lookup and tests can reason
about the same rules.

Every answer is for one timing mode (fa4.timing: eager or CUDA-graph launches, cold or warm
L2) and is built from rows of that mode only: a config picked under eager launches is never
served to a caller under CUDA graphs. Without a row of the asked mode the answer is the heuristic
default, and its notes say which other modes were measured; the nearest-shape rule applies
within the mode. A nearest shape's config is served with this shape's heuristic on the knobs where
the two shapes' heuristics differ (carry_config): a tuned delta travels, a shape-dependent choice
does not.
"""

from __future__ import annotations

import dataclasses
import math

from fa4.arch import SM90, Arch, arch_from_capability
from fa4.decode_problem import DecodeProblem, problem_from_dict
from fa4.knobs import config_from_dict, config_to_dict
from fa4.problem import Problem
from fa4.timing import DEFAULT_TIMING, canonical as canonical_timing
from store import ResultsStore

# How many nearest shapes to try before giving up on the nearest rule (each costs one query;
# a candidate is skipped only when its config is no longer valid for the running code).
MAX_NEAREST_CANDIDATES = 16


def seqlen_distance(a: Problem, b: Problem) -> float:
    """Distance in log space of the sequence lengths: 1k vs 2k is as far as 8k vs 16k."""
    return abs(math.log(a.seqlen_q / b.seqlen_q)) + abs(math.log(a.seqlen_k / b.seqlen_k))


def shape_distance(a: Problem, b: Problem) -> float:
    """Batch and head counts in log space, the tie-breaker after seqlen."""
    return (
        abs(math.log(a.batch / b.batch))
        + abs(math.log(a.heads_q / b.heads_q))
        + abs(math.log(a.heads_kv / b.heads_kv))
    )


def rank_nearest(problem: Problem, candidates: list[Problem]) -> list[Problem]:
    """Candidates ordered nearest first: seqlen distance, then batch/heads, then a stable key."""
    def key(c: Problem):
        # Rounded so that float noise in logs never outranks the batch/heads tie-break.
        return (round(seqlen_distance(problem, c), 9), round(shape_distance(problem, c), 9), c.key())

    return sorted((c for c in candidates if c != problem), key=key)


_UNSET = object()


def arch_for(device_row: dict | None, device: str, arch: Arch | None, notes: list[str]) -> Arch:
    if arch is not None:
        return arch
    if device_row is None:
        notes.append(f"device {device!r} is not in the database; feasibility judged for {SM90.name}")
        return SM90
    try:
        major, minor = (int(x) for x in device_row["compute_capability"].split("."))
        return arch_from_capability(major, minor)
    except ValueError as e:
        notes.append(f"{e}; feasibility judged for {SM90.name}")
        return SM90


def carry_config(provider, problem: Problem, measured: Problem, arch: Arch, cfg) -> tuple[object, list[str]]:
    """A config measured on shape ``measured`` carried to ``problem``: the knobs the tuner moved off
    ``measured``'s heuristic default keep their tuned value, and every knob whose heuristic value
    differs between the two shapes takes ``problem``'s own. The heuristic's shape-dependent choices
    are measured ones (fa4.sm90.bwd_defaults: the GQA 'loop' reduce below 2k queries is 2.6x the
    atomic one at Sq 128 / Sk 8k); a neighbour's config would undo them: session 43 served the
    Llama-3-8B 8k/8k default to Sq 128 / Sk 8k and its backward took 2.3x as long. Returns the
    config and the knobs kept from ``problem``'s heuristic as "name=value (measured shape: value)".
    A provider without a default for either shape gets the measured config unchanged."""
    if measured == problem:
        return cfg, []
    try:
        mine = provider.default_config(problem, arch)
        theirs = provider.default_config(measured, arch)
    except Exception:  # no heuristic to compare with (e.g. no kernel for this arch): the row as measured
        return cfg, []
    if mine is None or theirs is None or type(mine) is not type(cfg) or type(theirs) is not type(cfg):
        return cfg, []
    kept, changes = [], {}
    for f in dataclasses.fields(cfg):
        m, t = getattr(mine, f.name), getattr(theirs, f.name)
        if m != t:
            changes[f.name] = m
            kept.append(f"{f.name}={m!r} (measured shape: {t!r})")
    return dataclasses.replace(cfg, **changes), kept


def _usable_config(provider, problem: Problem, arch: Arch, row: dict,
                   measured: Problem | None = None) -> tuple[dict | None, str | None, list[str]]:
    """The row's config, measured on ``measured`` (default ``problem``), carried to ``problem``
    (carry_config) and re-validated against the running knob class: (config, None, knobs kept from
    the heuristic), or (None, why, []) when unusable."""
    knob_cls = provider.knob_cls_for(problem)
    if knob_cls is None:
        return None, None, []
    try:
        cfg = config_from_dict(knob_cls, row["config"] or {})
    except (ValueError, TypeError) as e:
        return None, f"measurement {row['id']} has a config the running knob class rejects: {e}", []
    cfg, kept = carry_config(provider, problem, measured or problem, arch, cfg)
    try:
        bad = provider.violations(cfg, problem, arch)
    except Exception as e:  # a provider bug must not turn into a 5xx
        bad = [f"{type(e).__name__}: {e}"]
    if bad:
        carried = f" (with this shape's heuristic {', '.join(kept)})" if kept else ""
        return None, f"measurement {row['id']}'s config{carried} is infeasible for this problem: {'; '.join(bad)}", []
    return config_to_dict(cfg), None, kept


def _answer(provenance: str, stale: bool, notes: list[str], device: str, provider_name: str,
            problem: Problem, running_fp: str | None, row: dict | None = None,
            config: dict | None = None, distance: float | None = None, device_row: dict | None = None,
            timing: str = DEFAULT_TIMING) -> dict:
    out = {
        "provenance": provenance,
        "timing": timing,
        "stale": stale,
        "notes": notes,
        "device": device,
        "provider": provider_name,
        "problem": problem.to_dict(),
        "measured_problem": None,
        "config": config,
        "tflops": None,
        "median_ms": None,
        "iqr_ms": None,
        "error": None,
        "ref_error": None,
        "n_samples": None,
        "measured_at": None,
        "versions": None,
        "device_versions": None,
        "measurement_id": None,
        "source_fingerprint": None,
        "running_fingerprint": running_fp,
        "distance": distance,
        "verdict": None,
    }
    if row is not None:
        v = row.get("verdict")
        out["verdict"] = None if v is None else {
            "significant": v["significant"], "gain": v["gain"], "spread": v["spread"],
            "rounds": len(v["rounds"].get("tflops", [])), "judged_at": v["created_at"],
        }
        out.update(
            measured_problem=row["problem"],
            tflops=row["tflops"],
            median_ms=row["median_ms"],
            iqr_ms=row["iqr_ms"],
            error=row["error"],
            ref_error=row["ref_error"],
            n_samples=row["n_samples"],
            measured_at=row["created_at"],
            versions=row["versions"],
            measurement_id=row["id"],
            source_fingerprint=row["source_fingerprint"],
        )
    if device_row is not None:
        # The software stack of the measuring machine: a driver or library upgrade is a new device row.
        out["device_versions"] = {k: device_row[k] for k in ("driver", "cuda", "torch", "cutlass_dsl",
                                                              "provider_versions")}
    return out


def _fastest(rows: list[dict], fp: str | None) -> dict | None:
    """The row to serve of one problem's rows, of source ``fp`` unless None: the row the newest
    verdict serves (the study's winners re-measured against the default: tuner/verify.py), else
    the row with the most TFLOP/s (ties: the earliest). The same rule as ``ResultsStore.best``."""
    judged = [r for r in rows if r.get("verdict") and (fp is None or r["source_fingerprint"] == fp)]
    if judged:
        return max(judged, key=lambda r: (r["verdict"]["created_at"], r["verdict"]["id"]))
    best = None
    for r in rows:
        if fp is not None and r["source_fingerprint"] != fp:
            continue
        if best is None or r["tflops"] > best["tflops"] or (r["tflops"] == best["tflops"] and r["id"] < best["id"]):
            best = r
    return best


def index_rows(rows: list[dict]) -> dict[Problem | DecodeProblem, list[dict]]:
    """A family's rows grouped by the problem they measured (attention or decode)."""
    by_problem: dict[Problem | DecodeProblem, list[dict]] = {}
    for r in rows:
        by_problem.setdefault(problem_from_dict(r["problem"]), []).append(r)
    return by_problem


def rows_of_mode(by_problem: dict[Problem, list[dict]], timing: str) -> tuple[dict[Problem, list[dict]], dict[str, int]]:
    """The rows timed in ``timing`` (by problem; problems without any left out), and how many
    rows each other mode has. Rows stored before timing modes existed carry no "timing" key only
    in callers' own caches: they are the default mode's."""
    mine: dict[Problem, list[dict]] = {}
    other_modes: dict[str, int] = {}
    for p, rs in by_problem.items():
        for r in rs:
            t = r.get("timing", DEFAULT_TIMING)
            if t == timing:
                mine.setdefault(p, []).append(r)
            else:
                other_modes[t] = other_modes.get(t, 0) + 1
    return mine, other_modes


def neighbour_configs(store: ResultsStore, provider, device: str, problem: Problem, *,
                      running_fp: str | None, arch: Arch | None = None, limit: int = 3,
                      timing: str = DEFAULT_TIMING) -> list[dict]:
    """The configs served for the ``limit`` nearest measured shapes of ``problem``'s family on this
    device (not ``problem`` itself), nearest first, each carried to ``problem`` (carry_config) and
    re-validated for it: a new
    study's warm start. Rows of the running source come first; stale ones only where no current
    neighbour exists; rows of the asked timing mode only. Each item: {"config": knob dict, "from":
    problem key, "distance": float}."""
    notes: list[str] = []
    arch = arch_for(store.device_by_name(device), device, arch, notes)
    by_problem, _ = rows_of_mode(index_rows(store.family_rows(device, provider.name, problem)),
                                 canonical_timing(timing))
    out: list[dict] = []
    for fp in ((running_fp, None) if running_fp is not None else (None,)):
        for cand in rank_nearest(problem, list(by_problem)):
            if len(out) >= limit:
                return out
            if any(o["from"] == cand.key() for o in out):
                continue
            row = _fastest(by_problem[cand], fp)
            if row is None:
                continue
            cfg, _, _ = _usable_config(provider, problem, arch, row, cand)
            if cfg is None or any(o["config"] == cfg for o in out):
                continue
            out.append({"config": cfg, "from": cand.key(),
                        "distance": seqlen_distance(problem, cand) + shape_distance(problem, cand)})
    return out


def best_config(store: ResultsStore, provider, device: str, problem: Problem, *,
                running_fp: str | None, arch: Arch | None = None, rows: dict[Problem, list[dict]] | None = None,
                device_row=_UNSET, get_device=None, timing: str = DEFAULT_TIMING) -> dict:
    """The answer of GET /v1/configs/best (a dict shaped like ``schemas.BestConfig``).

    ``running_fp`` is the source fingerprint of the kernel code that will use the
    answer; rows from other source are stale and never served as exact. None means
    the fingerprint is unknown and every row counts as current. ``rows`` (the
    family's rows, ``index_rows(store.family_rows(...))``) and ``device_row`` may be
    passed by a caller that caches them, and ``get_device`` (device id -> row) likewise;
    otherwise they are read from ``store``.

    ``timing`` (a mode of fa4.timing) is the mode the caller runs in: only rows of that mode
    count; rows of other modes are named in the notes of a default answer, never served.

    A :class:`DecodeProblem` (GET /v1/configs/best-decode) takes step 1 only: its exact shape's
    row of the running source, else the heuristic (provenance exact or default, never nearest).
    """
    name = provider.name
    timing = canonical_timing(timing)
    notes: list[str] = []
    if device_row is _UNSET:
        device_row = store.device_by_name(device)
    arch = arch_for(device_row, device, arch, notes)
    family_rows = rows if rows is not None else index_rows(store.family_rows(device, name, problem))
    by_problem, other_modes = rows_of_mode(family_rows, timing)

    def try_rows(candidates, fp) -> tuple[dict, dict | None, Problem] | None:
        for cand in candidates:
            row = _fastest(by_problem.get(cand, ()), fp)
            if row is None:
                continue
            cfg, why, kept = _usable_config(provider, problem, arch, row, cand)
            if why:
                notes.append(why)
                continue
            if kept:
                notes.append(f"shape {cand.key()}'s config carried with this shape's heuristic where the two "
                             f"shapes' heuristics differ: {', '.join(kept)}")
            return row, cfg, cand
        return None

    def family(fp) -> list[Problem]:
        have = [p for p, rs in by_problem.items() if fp is None or any(r["source_fingerprint"] == fp for r in rs)]
        return rank_nearest(problem, have)

    # 1. Exact shape, current source.
    def measured_on(row: dict) -> dict | None:
        return (get_device or store.get_device)(row["device_id"])

    hit = try_rows([problem], running_fp)
    if hit:
        row, cfg, _ = hit
        return _answer("exact", False, notes, device, name, problem, running_fp, row, cfg, 0.0, measured_on(row), timing)

    stale_exact = None
    if running_fp is not None:
        stale_exact = _fastest(by_problem.get(problem, ()), None)
        if stale_exact is not None:
            notes.append(
                f"this exact shape was measured (measurement {stale_exact['id']}) from kernel source "
                f"{stale_exact['source_fingerprint']!r}, not the running {running_fp!r}: stale, never served as exact"
            )

    # A decode problem is answered by its exact shape of the running source only: its best split
    # count depends on batch and context length too steeply for a neighbour's (or an older
    # kernel's, whose split heuristic and tiles may differ) to beat the heuristic.
    if isinstance(problem, DecodeProblem):
        return _default_answer(provider, problem, arch, notes, by_problem, other_modes, device, running_fp, timing,
                               "decode problems are served from their exact shape only (no nearest-shape rule)")

    # 2. Nearest measured shape of the same family, current source.
    hit = try_rows(family(running_fp)[:MAX_NEAREST_CANDIDATES], running_fp)
    if hit:
        row, cfg, cand = hit
        notes.append(f"nearest measured shape {cand.key()} (this shape has no current measurement)")
        return _answer("nearest", False, notes, device, name, problem, running_fp, row, cfg,
                       seqlen_distance(problem, cand) + shape_distance(problem, cand), measured_on(row), timing)

    # 3. Stale rows still beat a heuristic (the knob class and feasibility were re-checked),
    #    but they are labelled: nearest in code version, if not in shape.
    if running_fp is not None:
        hit = try_rows(([problem] if stale_exact else []) + family(None)[:MAX_NEAREST_CANDIDATES], None)
        if hit:
            row, cfg, cand = hit
            notes.append(
                f"served a stale measurement (source {row['source_fingerprint']!r}, running {running_fp!r}) "
                f"of shape {cand.key()}; re-tune to refresh it"
            )
            return _answer("nearest", True, notes, device, name, problem, running_fp, row, cfg,
                           seqlen_distance(problem, cand) + shape_distance(problem, cand), measured_on(row), timing)

    # 4. The provider's own heuristic.
    return _default_answer(provider, problem, arch, notes, by_problem, other_modes, device, running_fp, timing)


def _default_answer(provider, problem, arch: Arch, notes: list[str], by_problem: dict, other_modes: dict,
                    device: str, running_fp: str | None, timing: str, why: str | None = None) -> dict:
    """The answer when nothing measured is served: the provider's heuristic, with the notes saying why."""
    if not by_problem:
        notes.append(f"no measurements under {timing} for this device, provider and problem family"
                     + (f" (rows timed {', '.join(f'{t}: {n}' for t, n in sorted(other_modes.items()))} are "
                        f"never served to a {timing} caller)" if other_modes else ""))
    if why:
        notes.append(why)
    notes.append("nothing usable was measured for this device, provider and problem family: heuristic default")
    try:
        default = provider.default_config(problem, arch)
        config = None if default is None else config_to_dict(default)
    except Exception as e:  # e.g. no kernel for this arch: say so instead of failing the request
        notes.append(f"the provider has no default config here: {type(e).__name__}: {e}")
        config = None
    return _answer("default", False, notes, device, provider.name, problem, running_fp, None, config, timing=timing)


def provider_speeds(store: ResultsStore, device: str, problem: Problem, providers, *, running_fp: str | None,
                    timing: str = DEFAULT_TIMING) -> dict[str, dict]:
    """What a plain call of each provider in ``providers`` runs on this exact problem, as measured
    on ``device`` in ``timing``'s mode (rows that passed the correctness gate only): the answer of
    fa4's per-shape dispatch (``provider="auto"``).

    fa4: the config the launch-time lookup serves when it is this shape's own current measurement,
    else fa4's default config measured on this shape from the running source. A peer: its default
    configuration (what its public API runs; a tuned reference config is not reachable from it).
    Each value: {"tflops", "median_ms", "iqr_ms", "measurement_id", "what"}; providers without
    such a row are left out.
    """
    from fa4.rules import Fa4Rules

    timing = canonical_timing(timing)
    out: dict[str, dict] = {}
    for name in providers:
        by_problem, _ = rows_of_mode(index_rows(store.family_rows(device, name, problem)), timing)
        rows = by_problem.get(problem, [])
        row, what = None, "default configuration"
        if name == "fa4":
            ans = best_config(store, Fa4Rules(), device, problem, running_fp=running_fp, timing=timing)
            if ans["provenance"] == "exact" and not ans["stale"]:
                row = next((r for r in rows if r["id"] == ans["measurement_id"]), None)
                what = "the served config"
            if row is None:
                row = _fastest([r for r in rows if r["is_default"]], running_fp)
        else:
            row = _fastest([r for r in rows if r["is_default"]], None)
        if row is not None:
            out[name] = {"tflops": row["tflops"], "median_ms": row["median_ms"], "iqr_ms": row["iqr_ms"],
                         "measurement_id": row["id"], "what": what}
    return out
