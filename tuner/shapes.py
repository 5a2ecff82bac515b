"""Lists of problems to tune: a grid from the command line, or a JSON/CSV file.

A file entry is either a full problem (the results DB's spelling: seqlen_q, head_dim, ...,
as ``Problem.to_dict`` writes it, varlen, varlen_mean_q and varlen_mean_k included) or the command
line's short spelling (seqlen, hdim, hdim_v, batch, heads, heads_kv, seqlen_k, causal, dtype, pass,
deterministic, varlen_mean, varlen_mean_k: a packed varlen problem with seqlen the longest sequence) where
omitted sizes follow the standard benchmark convention and omitted flags come from the command line.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from pathlib import Path

from fa4.problem import Problem, default_varlen_mean_k

# The command line's short names -> Problem.standard's keyword arguments.
SHORT = {"hdim_v": "head_dim_v", "batch": "batch", "heads": "heads_q", "heads_kv": "heads_kv", "seqlen_k": "seqlen_k",
         "causal": "causal", "dtype": "dtype", "pass": "pass_", "deterministic": "deterministic",
         "window_left": "window_left", "window_right": "window_right", "softcap": "softcap", "sink": "sink",
         "varlen": "varlen", "varlen_mean": "varlen_mean_q", "varlen_mean_k": "varlen_mean_k"}
_BOOLS = ("causal", "deterministic", "sink", "varlen")
# The issue-18 features a full entry takes from the command line when it does not name them.
_FEATURES = ("window_left", "window_right", "softcap", "sink", "varlen", "varlen_mean_q", "varlen_mean_k")
_INTS = ("seqlen", "hdim", "hdim_v", "batch", "heads", "heads_kv", "seqlen_k", "seqlen_q", "head_dim", "head_dim_v",
         "heads_q")
# Integers where 0 means "off" (the varlen means of a dense row).
_COUNTS = ("varlen_mean", "varlen_mean_q", "varlen_mean_k")


class ShapeError(ValueError):
    """A shape list that cannot be read: a usage error."""


def _bool(v) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "y"):
        return True
    if s in ("0", "false", "no", "n", ""):
        return False
    raise ShapeError(f"not a boolean: {v!r}")


def _int(name: str, v, least: int = 1, what: str = "a positive integer") -> int:
    try:
        n = int(str(v).strip()) if not isinstance(v, int) or isinstance(v, bool) else v
    except ValueError:
        raise ShapeError(f"{name} must be an integer, got {v!r}") from None
    if isinstance(n, bool) or n < least:
        raise ShapeError(f"{name} must be {what}, got {v!r}")
    return n


def problem_from_entry(entry: dict, defaults: dict) -> Problem:
    """One problem from a file row; ``defaults`` are Problem.standard keywords from the CLI."""
    e = {k.strip().replace("-", "_") if k != "pass" else k: v for k, v in entry.items()
         if v is not None and str(v).strip() != ""}
    if "pass_" in e:
        e["pass"] = e.pop("pass_")
    for k in _INTS:
        if k in e:
            e[k] = _int(k, e[k])
    for k in _BOOLS:
        if k in e:
            e[k] = _bool(e[k])
    for k in _COUNTS:
        if k in e:
            e[k] = _int(k, e[k], least=0, what="an integer >= 0 (0: not varlen)")
    for k in ("window_left", "window_right"):
        if k in e:
            try:
                e[k] = int(str(e[k]).strip())
            except ValueError:
                raise ShapeError(f"{k} must be an integer (-1 = unbounded), got {e[k]!r}") from None
    if "softcap" in e:
        try:
            e["softcap"] = float(str(e["softcap"]).strip())
        except ValueError:
            raise ShapeError(f"softcap must be a number, got {e['softcap']!r}") from None
    if "seqlen_q" in e or "head_dim" in e:
        full = {**{"dtype": defaults.get("dtype", "bf16"), "causal": defaults.get("causal", False),
                   "deterministic": defaults.get("deterministic", False), "pass": defaults.get("pass_", "fwd")},
                **{k: defaults[k] for k in _FEATURES if k in defaults}, **e}
        if full.get("varlen") and not full.get("varlen_mean_k") and full.get("varlen_mean_q"):
            full["varlen_mean_k"] = default_varlen_mean_k(full["varlen_mean_q"], full.get("seqlen_q", 1),
                                                          full.get("seqlen_k", full.get("seqlen_q", 1)))
        return Problem.from_dict(full)
    unknown = sorted(set(e) - set(SHORT) - {"seqlen", "hdim"})
    if unknown:
        raise ShapeError(f"unknown shape field(s) {', '.join(unknown)} (use {', '.join(['seqlen', 'hdim', *SHORT])}, "
                         "or the full problem fields seqlen_q, head_dim, ...)")
    if "seqlen" not in e or "hdim" not in e:
        raise ShapeError(f"a shape needs seqlen and hdim: {entry}")
    kw = dict(defaults)
    kw.update({SHORT[k]: v for k, v in e.items() if k in SHORT})
    return Problem.standard(e["seqlen"], e["hdim"], **kw)


def load_shapes(path: str | Path, defaults: dict) -> list[Problem]:
    """Problems from a JSON list of objects or a CSV file with a header row."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ShapeError(f"cannot read --shapes {path}: {e.strerror or e}") from None
    if p.suffix.lower() == ".json" or text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ShapeError(f"--shapes {path}: invalid JSON: {e}") from None
        if isinstance(data, dict) and "shapes" in data:
            data = data["shapes"]
        if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
            raise ShapeError(f"--shapes {path}: expected a JSON list of objects")
        rows = data
    else:
        rows = list(csv.DictReader(io.StringIO(text)))
    if not rows:
        raise ShapeError(f"--shapes {path} lists no shapes")
    if all(isinstance(r.get("problem"), dict) for r in rows):
        # A recording (fa4.record_shapes): whole problems, most GPU time first.
        rows = sorted(rows, key=lambda r: -float(r.get("share") or 0.0))
    out = []
    for i, row in enumerate(rows, 1):
        try:
            if isinstance(row.get("problem"), dict):
                out.append(Problem.from_dict(row["problem"]))
                continue
            out.append(problem_from_entry(row, defaults))
        except (ShapeError, ValueError, TypeError, KeyError) as e:
            raise ShapeError(f"--shapes {path}, entry {i}: {e}") from None
    return unique(out)


def grid(seqlens: list[int], hdims: list[int], defaults: dict) -> list[Problem]:
    """Every (seqlen, hdim) pair, seqlen-major, with the CLI's other settings."""
    return unique([Problem.standard(s, d, **defaults) for s, d in itertools.product(seqlens, hdims)])


def unique(problems: list[Problem]) -> list[Problem]:
    """Duplicates would be one study anyway; keep the first of each, in order."""
    seen, out = set(), []
    for p in problems:
        if p.key() not in seen:
            seen.add(p.key())
            out.append(p)
    return out


def parse_int_list(flag: str, text: str) -> list[int]:
    """"8192" or "1024,2048,4096" -> ints (each must be positive)."""
    vals = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            v = int(part)
        except ValueError:
            raise ShapeError(f"{flag} takes integers or a comma-separated list, got {text!r}") from None
        if v <= 0:
            raise ShapeError(f"{flag} must be a positive integer, got {v}")
        vals.append(v)
    return vals
