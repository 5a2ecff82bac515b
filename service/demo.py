"""The demo dataset: real H200 measurements loaded into a results DB through ``ResultsStore``.

    python3 -m service.demo sqlite:////tmp/demo.db     # or: fa4-serve --demo

Five recorded sources, nothing synthesised. Ours and the peers' bench numbers were measured on
the H200 on 2026-12-01 with the kernels of source fingerprint ``MEASURED_SOURCE`` (session 8,
bench/RESULTS.md); the reference's knob sweep is of 2026-11-30:

- ``seed/h200-2026-12-01.sqlite``: the results DB of the ``fa4`` tuning runs (``fa4-tune --seqlen
  8192 --hdim 64,128 --trials 14``), copied row by row (devices, problems, configs, measurements with
  their study and trial numbers and source fingerprints);
- ``providers/data/ref_fa4_h200.json``: the reference FA4 (``flash-attn-4``) knob sweep at S=8192, stored
  as one study per shape (trial number = position in the sweep, the provider default flagged);
- ``seed/bench-fwd-h200-2026-12-01.log``: ``python3 bench/bench_fwd.py --seqlens 1024,4096,8192,16384``,
  the side-by-side forward table of fa4, flash-attn-4, cudnn and fa2, each at its default config;
- ``seed/check-fwd-h200-2026-12-01.log``: ``python3 bench/check_fwd.py --no-check --seqlens 8192``,
  the same four providers at S=8192, minutes later;
- ``seed/check-bwd-h200-2026-12-01.log``: ``python3 bench/check_bwd.py --no-check``, the backward at
  S=8192 of fa4 and flash-attn-4 in both modes, cudnn and fa2 (non-deterministic only: they have no
  deterministic mode).

Each log names the fa4 source fingerprint it measured (its "fa4 source:" line); fa4's rows carry
it, so the dashboard can say when the running kernels are newer than the demo's numbers.

The logs keep TFLOP/s only; ``median_ms`` is recovered as ``problem.flops / TFLOP/s`` (the harness's
own definition, and the benches'), no IQR or samples are made up, and the rows carry
``versions["seed_source"]`` so they are told apart in the raw JSON. Where two forward logs timed
the same (shape, provider), only the newer measurement is loaded, so each point has one source.
"""

from __future__ import annotations

import atexit
import json
import re
import shutil
import signal
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from fa4.knobs import config_from_dict, config_to_dict
from fa4.problem import Problem

SEED_DIR = Path(__file__).resolve().parent / "seed"
SEED_DB = SEED_DIR / "h200-2026-12-01.sqlite"
BENCH_LOG = SEED_DIR / "bench-fwd-h200-2026-12-01.log"
FWD_LOG = SEED_DIR / "check-fwd-h200-2026-12-01.log"
BWD_LOG = SEED_DIR / "check-bwd-h200-2026-12-01.log"
# The kernel source (fa4.fingerprint) every fa4 number of the demo was measured with.
MEASURED_SOURCE = "15f1b0a3fd233111"
REF_SWEEP = Path(__file__).resolve().parents[1] / "providers" / "data" / "ref_fa4_h200.json"

_BENCH_HEADER = re.compile(r"^\s*S\s+hd\s+causal\s+(?P<providers>.+?)\s*$")
_BENCH_ROW = re.compile(r"^\s*(?P<s>\d+)\s+(?P<hd>\d+)\s+(?P<causal>yes|no)\s+(?P<cells>.+?)\s*$")
# One provider's cell: "307.2 (0.78)" (TFLOP/s and ratio to the reference), "393.0", or "- status".
_BENCH_CELL = re.compile(r"-\s+(?P<status>\w+)|(?P<tflops>\d+(?:\.\d+)?)(?:\s+\(\d+(?:\.\d+)?\))?")
_BENCH_FOOTER = re.compile(r"^(?P<device>[^,]+), (?P<date>\S+); TFLOP/s")
_CHECK_DEVICE = re.compile(r"^device: (?P<name>.+?) torch (?P<torch>\S+)\s*$")
_SOURCE = re.compile(r"^fa4 source: (?P<fp>[0-9a-f]+)\s*$")

# The column names bench/check_fwd.py and bench/check_bwd.py print for people, as (provider,
# deterministic). Both scripts call every provider without a config: ours and the reference pick
# their own default, SDPA has no knobs.
FWD_COLUMNS = {"fa4 (ours)": ("fa4", False), "ref FA4": ("flash-attn-4", False), "cuDNN": ("cudnn", False),
               "FA2": ("fa2", False)}
BWD_COLUMNS = {"ours": ("fa4", False), "ours det": ("fa4", True), "ref FA4": ("flash-attn-4", False),
               "ref FA4 det": ("flash-attn-4", True), "cuDNN": ("cudnn", False), "FA2": ("fa2", False)}
# check_*.py logs carry no date: these are the times the H200 run's files were written (session 8).
MEASURED_AT = {FWD_LOG.name: "2026-12-01T12:02:06+00:00", BWD_LOG.name: "2026-12-01T12:03:21+00:00"}
# The knobs a log's provider ran with where they differ from today's default (the logs name no
# config: they ran the default of their day). Empty: these logs ran today's defaults; a later
# default change pins the knobs of the day here, so the rows name the kernel that was timed.
MEASURED_WITH: dict[str, dict[str, dict]] = {}


def _knob_cls(provider: str, problem: Problem):
    from providers import get_provider

    return get_provider(provider).knob_cls_for(problem)


def parse_bench_log(text: str) -> dict:
    """``{"device": name, "date": iso, "rows": [{"seqlen", "head_dim", "causal", "provider", "status", "tflops"}]}``."""
    providers: list[str] | None = None
    rows, device, date, source = [], None, None, None
    for line in text.splitlines():
        src = _SOURCE.match(line)
        if src:
            source = src.group("fp")
            continue
        if providers is None:
            h = _BENCH_HEADER.match(line)
            if h:
                providers = h.group("providers").split()
            continue
        f = _BENCH_FOOTER.match(line)
        if f:
            device, date = f.group("device").strip(), f.group("date")
            continue
        r = _BENCH_ROW.match(line)
        if not r:
            continue  # compiler warnings interleaved with the table
        cells = list(_BENCH_CELL.finditer(r.group("cells")))
        if len(cells) != len(providers):
            raise ValueError(f"bench log row has {len(cells)} cells for {len(providers)} providers: {line!r}")
        for name, c in zip(providers, cells):
            rows.append({
                "seqlen": int(r.group("s")), "head_dim": int(r.group("hd")), "causal": r.group("causal") == "yes",
                "provider": name,
                "status": "ok" if c.group("tflops") else c.group("status"),
                "tflops": float(c.group("tflops")) if c.group("tflops") else None,
            })
    if providers is None or device is None:
        raise ValueError("not a bench_fwd.py table: header or footer line missing")
    return {"device": device, "date": date, "rows": rows, "source": source}


def parse_check_log(text: str) -> dict:
    """``{"device": name, "torch": version, "rows": [BENCH objects]}`` of a check_fwd.py / check_bwd.py log.

    Each ``BENCH {json}`` line is one shape: S, D, causal and TFLOP/s per column (null when that
    provider failed); what follows the object on the line are ratios derived from it.
    """
    device = torch = source = None
    rows = []
    decoder = json.JSONDecoder()
    for line in text.splitlines():
        d = _CHECK_DEVICE.match(line)
        src = _SOURCE.match(line)
        if src:
            source = src.group("fp")
        elif d:
            device, torch = d.group("name"), d.group("torch")
        elif line.startswith("BENCH "):
            row = decoder.raw_decode(line, len("BENCH "))[0]
            # check_bwd.py names head dims as text ("96", "192/128"), check_fwd.py as a number.
            d, _, dv = str(row["D"]).replace("v", "/").partition("/")
            row["D"] = int(d)
            if dv and int(dv) != row["D"]:
                row["Dv"] = int(dv)
            rows.append(row)
    if device is None or not rows:
        raise ValueError("not a check_fwd.py / check_bwd.py log: 'device:' line or BENCH lines missing")
    return {"device": device, "torch": torch, "rows": rows, "source": source}


_DEVICE_KEYS = ("name", "compute_capability", "sm_count", "l2_bytes", "memory_bytes", "driver", "cuda", "torch",
                "cutlass_dsl", "provider_versions")


def _read_seed_db(seed_db: Path) -> tuple[dict[int, dict], list[dict]]:
    from store import ResultsStore

    # Opening a store migrates it: read a copy so the shipped file is never written.
    with tempfile.TemporaryDirectory(prefix="fa4-seed-") as tmp:
        copy = Path(tmp) / seed_db.name
        shutil.copyfile(seed_db, copy)
        src = ResultsStore.open(f"sqlite:///{copy}")
        try:
            devices = {d["id"]: {k: d[k] for k in _DEVICE_KEYS} for d in src.devices()}
            return devices, src.measurements(sort="id")
        finally:
            src.close()


def _copy_seed_db(store, devices: dict[int, dict], rows: list[dict]) -> int:
    dev_ids: dict[int, int] = {}
    for r in rows:
        d = devices[r["device_id"]]
        if r["device_id"] not in dev_ids:
            dev_ids[r["device_id"]] = store.upsert_device(d)
        problem = Problem.from_dict(r["problem"])
        cid = store.upsert_config(r["provider"], r["config"], _knob_cls(r["provider"], problem))
        store.add_measurement(
            dev_ids[r["device_id"]], store.upsert_problem(problem), cid,
            **{k: r[k] for k in ("status", "reason", "samples_ms", "median_ms", "iqr_ms", "tflops", "error",
                                 "ref_error", "source_fingerprint", "study_name", "trial_number", "is_default",
                                 "versions")},
            created_at=datetime.fromisoformat(r["created_at"]) if r["created_at"] else None,
        )
    return len(rows)


def _load_ref_sweep(store, path: Path) -> int:
    rec = json.loads(path.read_text())
    provider = rec["provider"]
    dev = store.upsert_device(rec["device"])
    created = datetime.fromisoformat(rec["date"])
    versions = {**rec.get("versions", {}), "seed_source": path.name}
    n = 0
    for entry in rec["problems"]:
        problem = Problem.from_dict(entry["problem"])
        knob_cls = _knob_cls(provider, problem)
        default = config_to_dict(config_from_dict(knob_cls, entry["default"]))
        pid = store.upsert_problem(problem)
        study = f"ref-sweep|{rec['device']['name'].replace(' ', '_')}|{provider}|{problem.key()}"
        for i, res in enumerate(entry["results"]):
            config = config_to_dict(config_from_dict(knob_cls, res["config"]))
            store.add_measurement(
                dev, pid, store.upsert_config(provider, config, knob_cls),
                **{k: res.get(k) for k in ("status", "reason", "median_ms", "iqr_ms", "tflops", "error",
                                           "ref_error")},
                samples_ms=res.get("samples_ms") or (), study_name=study, trial_number=i,
                is_default=config == default, versions=versions, created_at=created,
            )
            n += 1
    return n


def _recorded_defaults(seed_rows: list[dict], ref_sweep: Path) -> dict[tuple[str, int], dict]:
    """(provider, head_dim) -> the default config the recorded runs used.

    The bench ran each provider at its default of that day, which depended on head_dim only
    (bench/RESULTS.md); today's heuristic may differ, so the recordings say which config ran.
    """
    out = {(r["provider"], r["problem"]["head_dim"]): r["config"] for r in seed_rows if r["is_default"]}
    rec = json.loads(ref_sweep.read_text())
    for entry in rec["problems"]:
        out[(rec["provider"], entry["problem"]["head_dim"])] = entry["default"]
    return out


def _table_log_rows(path: Path, device: dict, defaults: dict[tuple[str, int], dict]) -> list[dict]:
    """The measured cells of a bench_fwd.py table, each at the default its provider ran that day."""
    table = parse_bench_log(path.read_text())
    if table["device"] != device["name"]:
        raise ValueError(f"{path.name} was measured on {table['device']}, not {device['name']}")
    created = datetime.fromisoformat(table["date"]) if table["date"] else None
    out = []
    for r in table["rows"]:
        if r["status"] != "ok":
            continue  # a '-' cell says the provider did not run; there is nothing to chart
        problem = Problem.standard(r["seqlen"], r["head_dim"], causal=r["causal"])
        config = None
        if _knob_cls(r["provider"], problem) is not None:
            config = defaults.get((r["provider"], r["head_dim"]))
            if config is None:
                raise ValueError(f"no recorded default config of {r['provider']} at head_dim {r['head_dim']}")
        out.append({"problem": problem, "provider": r["provider"], "config": config, "tflops": r["tflops"],
                    "created_at": created, "source": path.name,
                    "fingerprint": table["source"] if r["provider"] == "fa4" else None})
    return out


def _provider_default(provider: str, problem: Problem, pinned: dict | None = None) -> dict | None:
    """The provider's default config for the problem, with the knobs in ``pinned`` set as given."""
    import dataclasses

    from fa4.arch import SM90
    from providers import get_provider

    config = get_provider(provider).default_config(problem, SM90)
    if config is not None and pinned:
        config = dataclasses.replace(config, **pinned)
    return None if config is None else config_to_dict(config)


def _check_log_rows(path: Path, device: dict, pass_: str, columns: dict[str, tuple[str, bool]]) -> list[dict]:
    """The measured cells of a check_fwd.py / check_bwd.py log (S, 16k tokens, heads*hd = 2048, bf16).

    The configs are the defaults these runs used: the logs were shipped with the default changes
    they measured (fa4 fwd hd64 192x128 at 521 TFLOP/s is the +2.9% of
    bench/logs/effects_s2_tile_n.log), and where a default changed since, MEASURED_WITH pins the
    knobs of the day.
    """
    log = parse_check_log(path.read_text())
    if (log["device"], log["torch"]) != (device["name"], device["torch"]):
        raise ValueError(f"{path.name} was measured on {log['device']} with torch {log['torch']}, "
                         f"not {device['name']} with torch {device['torch']}")
    created = datetime.fromisoformat(MEASURED_AT[path.name])
    out = []
    for row in log["rows"]:
        shape = {k: row[k] for k in ("S", "D", "Dv", "causal") if k in row}
        unknown = sorted(set(row) - set(shape) - set(columns))
        if unknown:
            # A --variants run times non-default configs under ad-hoc names: not a default measurement.
            raise ValueError(f"{path.name}: columns {unknown} are not among {sorted(columns)}")
        for column, (provider, deterministic) in columns.items():
            if row.get(column) is None:
                continue  # missing or null: that provider did not run this shape
            problem = Problem.standard(row["S"], row["D"], head_dim_v=row.get("Dv"), causal=bool(row["causal"]),
                                       deterministic=deterministic,
                                       pass_=pass_)
            pinned = MEASURED_WITH.get(path.name, {}).get(provider)
            out.append({"problem": problem, "provider": provider,
                        "config": _provider_default(provider, problem, pinned),
                        "tflops": float(row[column]), "created_at": created, "source": path.name,
                        "fingerprint": log["source"] if provider == "fa4" else None})
    return out


def _load_bench_rows(store, device: dict, rows: list[dict]) -> dict[str, int]:
    """Store the bench cells, the newest per (problem, provider) only; returns rows kept per source file."""
    oldest = datetime.min.replace(tzinfo=timezone.utc)
    newest: dict[tuple[Problem, str], dict] = {}
    for r in rows:
        key = (r["problem"], r["provider"])
        if key not in newest or (r["created_at"] or oldest) > (newest[key]["created_at"] or oldest):
            newest[key] = r
    dev = store.upsert_device(device)
    kept = dict.fromkeys((r["source"] for r in rows), 0)
    for r in rows:
        if newest[(r["problem"], r["provider"])] is not r:
            continue
        problem = r["problem"]
        cid = store.upsert_config(r["provider"], r["config"], _knob_cls(r["provider"], problem))
        # The store needs a time for an 'ok' row: the logs' TFLOP/s turned back into one.
        median_ms = problem.flops / (r["tflops"] * 1e12) * 1e3
        store.add_measurement(dev, store.upsert_problem(problem), cid, status="ok", median_ms=median_ms,
                              tflops=r["tflops"], is_default=True, versions={"seed_source": r["source"]},
                              source_fingerprint=r.get("fingerprint") or "", created_at=r["created_at"])
        kept[r["source"]] += 1
    return kept


def build_demo_db(url: str, *, seed_db: Path = SEED_DB, ref_sweep: Path = REF_SWEEP,
                  bench_log: Path = BENCH_LOG, fwd_log: Path = FWD_LOG, bwd_log: Path = BWD_LOG) -> dict[str, int]:
    """Load the recorded H200 data into the (new or empty) database at ``url``; returns rows per source."""
    from store import ResultsStore

    store = ResultsStore.open(url)
    try:
        if store.count():
            raise ValueError(f"{store.url} already holds measurements; the demo loads into an empty database")
        devices, rows = _read_seed_db(seed_db)
        counts = {"seed_db": _copy_seed_db(store, devices, rows), "ref_sweep": _load_ref_sweep(store, ref_sweep)}
        # The bench ran on the machine of the tuning runs minutes later; its stack is theirs
        # plus the reference FA4 of the sweep.
        seed_dev = next(iter(devices.values()))
        ref_versions = json.loads(ref_sweep.read_text())["device"]["provider_versions"]
        device = {**seed_dev, "provider_versions": {**seed_dev["provider_versions"], **ref_versions}}
        # The check_*.py logs are of session 2 on that machine and stack (they say so: device, torch).
        bench = (_table_log_rows(bench_log, device, _recorded_defaults(rows, ref_sweep))
                 + _check_log_rows(fwd_log, device, "fwd", FWD_COLUMNS)
                 + _check_log_rows(bwd_log, device, "bwd", BWD_COLUMNS))
        kept = _load_bench_rows(store, device, bench)
        counts.update({key: kept.get(path.name, 0) for key, path in
                       (("bench_log", bench_log), ("fwd_log", fwd_log), ("bwd_log", bwd_log))})
    finally:
        store.close()
    return counts


def temporary_demo_db() -> str:
    """A fresh SQLite file holding the demo data, deleted when this process exits (``fa4-serve --demo``)."""
    tmp = tempfile.mkdtemp(prefix="fa4-demo-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    # uvicorn re-raises the SIGTERM it caught once it has shut down; with the default handler
    # that kills the process before atexit runs, so turn it into a normal exit.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    url = f"sqlite:///{Path(tmp) / 'demo.db'}"
    build_demo_db(url)
    return url


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m service.demo DB_URL   (an empty database)", file=sys.stderr)
        return 2
    counts = build_demo_db(args[0])
    print(", ".join(f"{k}: {v} rows" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
