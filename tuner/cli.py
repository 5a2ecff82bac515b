"""fa4-tune: tune an attention kernel's knobs for one problem on this GPU."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from fa4.decode_problem import DecodeProblem, problem_from_dict
from fa4.problem import DTYPES, PASSES, Problem
from fa4.timing import DEFAULT, L2_STATES, LAUNCHES, Timing

from .study import SAMPLERS, TuneError

EXIT_USAGE = 2
EXIT_ENV = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


DISTRIBUTED_HELP = """\
distributed tuning:
  --devices 0,1 (or all)   one worker process per GPU (CUDA_VISIBLE_DEVICES pinned), all on the
                           same Optuna studies; a lock file per GPU keeps a second fa4-tune off it.
  --seqlen 1024,2048 --hdim 64,128, or --shapes FILE (JSON list / CSV with a header of
                           seqlen,hdim[,hdim_v,batch,heads,heads_kv,seqlen_k,causal,dtype,pass,varlen_mean]):
                           several shapes; workers start on different shapes and share trials.
  storage: one host -> leave --storage out (a journal file beside the DB; safe for many
           processes). Several hosts -> --storage postgresql://user:pass@host/db on each host
           (same command everywhere). Both use heartbeats: a dead worker's trial is retried.
  --push URL               send the finished results to a fa4-tune service (POST /v1/results,
                           token from $FA4_API_TOKEN); retries are idempotent, failures only warn.
"""


def _choice_help(flag: str, choices: dict) -> str:
    import textwrap

    return "".join(textwrap.fill(doc, 96, initial_indent=f"  {flag} {name:<{15 - len(flag)}s} ",
                                 subsequent_indent=" " * 19, break_on_hyphens=False) + "\n" for name, doc in choices.items())


TIMING_HELP = "timing mode (recorded on every measurement; lookups match on it):\n" + _choice_help(
    "--launch", LAUNCHES) + _choice_help("--l2", L2_STATES) + (
    f"  default: {DEFAULT.name}. Tune in the mode you serve in: a model served under CUDA graphs needs\n"
    "  --launch graph (kernels look their configs up in graph mode while a graph is captured; see\n"
    "  FA4_TUNING_TIMING in the README). Each mode is its own Optuna study.\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="fa4-tune",
        description="Tune an attention kernel's knobs for one problem (or a list of them); "
        "results go to the results DB.",
        epilog=TIMING_HELP + "\n" + DISTRIBUTED_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seqlen", help="query sequence length (a comma-separated list makes a grid with --hdim)")
    p.add_argument("--hdim", help="head dimension of q and k, and of v unless --hdim-v (a comma-separated list makes a grid)")
    p.add_argument("--hdim-v", type=int, help="head dimension of v and the output (default: --hdim; 128 with --hdim 192 "
                                              "is the DeepSeek-style split)")
    p.add_argument("--shapes", metavar="FILE", help="tune every shape listed in a JSON or CSV file")
    p.add_argument("--batch", type=_ints, help="batch size (default: 16384 tokens / seqlen; with --decode 1, and a "
                                               "comma-separated list makes a grid)")
    p.add_argument("--heads", type=int, help="query heads (default: 2048 / hdim)")
    p.add_argument("--heads-kv", type=int, help="key/value heads (default: --heads; fewer = GQA)")
    p.add_argument("--seqlen-k", type=_ints, help="key/value sequence length (default: --seqlen); with --decode the "
                                                  "KV cache capacity per sequence (required, a list makes a grid)")
    p.add_argument("--decode", action="store_true",
                   help="tune decode steps (fa4.flash_attn_with_kvcache; provider fa4-decode): --seqlen new "
                        "tokens per sequence (default 1) against --seqlen-k cached keys in pages of --page-size")
    p.add_argument("--page-size", type=int, default=0, help="--decode: keys per KV-cache page (0: contiguous cache)")
    p.add_argument("--seqlen-k-mean", type=int, default=0,
                   help="--decode: the mean of cache_seqlens where known (0: every sequence full)")
    p.add_argument("--causal", action="store_true", help="causal mask (bottom-right aligned)")
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--pass", dest="pass_", choices=PASSES, default="fwd", help="fwd, or bwd (the backward timed)")
    p.add_argument("--deterministic", action="store_true", help="require a deterministic backward")
    p.add_argument("--window", metavar="L,R",
                   help="sliding window: each query row sees L keys left and R right of its diagonal "
                   "(bottom-right aligned); -1 or an empty side = unbounded, e.g. 1023,0 or 1023,-1")
    p.add_argument("--softcap", type=float, default=0.0, metavar="C",
                   help="softcap the scores: C * tanh(s / C) (default 0: off)")
    p.add_argument("--sink", action="store_true", help="learnable attention sinks (one logit per query head)")
    p.add_argument("--varlen-mean", metavar="MQ[,MK]",
                   help="packed variable-length sequences (flash_attn_varlen_func): --batch sequences (default "
                   "16384 / MQ), the longest --seqlen (--seqlen-k) long, of mean length MQ (keys: MK, default MQ "
                   "scaled by seqlen_k / seqlen); the lengths are spread evenly (fa4.problem.varlen_lengths), "
                   "e.g. --batch 8 --seqlen 4096 --varlen-mean 2048")
    p.add_argument("--provider", help="implementation to tune (default: fa4, our kernels; flash-attn-4, cudnn, fa2 are the peers)")
    p.add_argument("--trials", type=int, default=40, help="trials the study should hold (default 40)")
    p.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    p.add_argument("--budget-s", type=float, metavar="S",
                   help="stop starting trials after S seconds of the run (shapes in the order given: a recorded "
                   "file lists the most GPU time first); what was measured is still re-measured and stored")
    p.add_argument("--verify-rounds", type=int, default=7, metavar="N",
                   help="re-measure the top 3 configs against the default, interleaved over N rounds, and "
                   "serve a challenger only if its gain beats the rounds' spread (default 7; 0: off)")
    p.add_argument("--launch", choices=tuple(LAUNCHES), default=DEFAULT.launch,
                   help=f"time eager launches or replays of a CUDA graph (default {DEFAULT.launch}; see below)")
    p.add_argument("--l2", choices=tuple(L2_STATES), default=DEFAULT.l2,
                   help=f"flush the L2 before each repetition (cold) or not (warm) (default {DEFAULT.l2})")
    p.add_argument("--db", help="results DB: SQLAlchemy URL or SQLite path (default: $FA4_DB, else user data dir)")
    p.add_argument("--storage", help="Optuna storage: a journal file (one host, default: beside the DB) or "
                   "postgresql://... (several hosts)")
    p.add_argument("--devices", help="GPUs to tune on, one worker each: 0,1 or all "
                   "(cpu0,cpu1: virtual slots for GPU-less providers such as replay)")
    p.add_argument("--push", metavar="URL", help="send finished results to a fa4-tune service ($FA4_API_TOKEN)")
    p.add_argument("--heartbeat", type=int, metavar="S",
                   help="seconds between worker heartbeats (default 10; 3 missed = worker dead)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _die(msg: str, code: int = EXIT_USAGE):
    print(f"fa4-tune: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def parse_window(text: str | None) -> tuple[int, int]:
    """--window L,R as (window_left, window_right): -1 (or an empty side) is unbounded."""
    if text is None:
        return -1, -1
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        left, right = (int(x) if x.strip() else -1 for x in parts)
    except ValueError:
        _die(f"--window takes L,R (two integers, -1 = unbounded), got {text!r}")
    if left < -1 or right < -1:
        _die(f"--window sides must be >= 0, or -1 for unbounded, got {text!r}")
    return left, right


def parse_varlen_mean(text: str | None) -> dict:
    """--varlen-mean MQ[,MK] as Problem.standard's keywords (none without the flag)."""
    if text is None:
        return {}
    try:
        means = [int(x) for x in text.split(",")]
        if not 1 <= len(means) <= 2 or min(means) < 1:
            raise ValueError
    except ValueError:
        _die(f"--varlen-mean takes MQ or MQ,MK (positive integers: mean query and key lengths), got {text!r}")
    # Without MK the key side's mean follows the query side's (fa4.problem.default_varlen_mean_k).
    return {"varlen": True, "varlen_mean_q": means[0], **({"varlen_mean_k": means[1]} if len(means) == 2 else {})}


def _ints(text: str) -> list[int]:
    """An integer, or a comma-separated list of them (a grid; decode only)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or a comma-separated list, got {text!r}") from None


def decode_problems_from_args(a) -> list[DecodeProblem]:
    """--decode: a DecodeProblem per (batch, seqlen_k) of the grid."""
    from .shapes import ShapeError, parse_int_list

    if (a.shapes or a.pass_ != "fwd" or a.deterministic or a.window or a.softcap or a.sink or a.hdim_v
            or a.varlen_mean):
        _die("--decode takes --batch, --seqlen (new tokens), --seqlen-k, --heads, --heads-kv, --hdim, "
             "--page-size, --seqlen-k-mean, --dtype and --causal only")
    if not a.seqlen_k or a.hdim is None or a.heads is None:
        _die("--decode needs --seqlen-k, --hdim and --heads")
    try:
        seqlen_q = parse_int_list("--seqlen", a.seqlen) if a.seqlen is not None else [1]
        hdims = parse_int_list("--hdim", a.hdim)
        return [DecodeProblem(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=a.heads, heads_kv=a.heads_kv or a.heads,
                              head_dim=d, page_size=a.page_size, seqlen_k_mean=a.seqlen_k_mean, dtype=a.dtype,
                              causal=a.causal)
                for b in (a.batch or [1]) for sk in a.seqlen_k for sq in seqlen_q for d in hdims]
    except (ShapeError, ValueError) as e:
        _die(str(e))


def problems_from_args(a) -> list[Problem]:
    from .shapes import ShapeError, grid, load_shapes, parse_int_list

    if a.decode:
        return decode_problems_from_args(a)
    for flag, name in (("--batch", "batch"), ("--seqlen-k", "seqlen_k")):
        v = getattr(a, name)
        if v is not None and len(v) > 1:
            _die(f"{flag} takes one value (lists make a grid with --decode only)")
        setattr(a, name, None if v is None else v[0])
    if a.page_size or a.seqlen_k_mean:
        _die("--page-size and --seqlen-k-mean apply to --decode")

    if a.budget_s is not None and not a.budget_s > 0:
        _die(f"--budget-s must be a positive number of seconds, got {a.budget_s}")
    if a.verify_rounds is not None and a.verify_rounds < 0:
        _die(f"--verify-rounds must be 0 (off) or a positive integer, got {a.verify_rounds}")
    for flag, v in (("--batch", a.batch), ("--heads", a.heads), ("--heads-kv", a.heads_kv),
                    ("--seqlen-k", a.seqlen_k), ("--hdim-v", a.hdim_v), ("--trials", a.trials),
                    ("--heartbeat", a.heartbeat)):
        if v is not None and v <= 0:
            _die(f"{flag} must be a positive integer, got {v}")
    if a.deterministic and a.pass_ != "bwd":
        _die("--deterministic applies to the backward: add --pass bwd")
    window_left, window_right = parse_window(a.window)
    if not (a.softcap >= 0 and math.isfinite(a.softcap)):
        _die(f"--softcap must be a finite number >= 0 (0: off), got {a.softcap}")
    defaults = {"batch": a.batch, "heads_q": a.heads, "heads_kv": a.heads_kv, "seqlen_k": a.seqlen_k,
                "head_dim_v": a.hdim_v,
                "dtype": a.dtype, "causal": a.causal, "deterministic": a.deterministic, "pass_": a.pass_,
                "window_left": window_left, "window_right": window_right, "softcap": float(a.softcap),
                "sink": a.sink, **parse_varlen_mean(a.varlen_mean)}
    try:
        if a.shapes:
            if a.seqlen is not None or a.hdim is not None:
                _die("give either --shapes FILE or --seqlen/--hdim, not both")
            return load_shapes(a.shapes, {k: v for k, v in defaults.items() if v is not None})
        if a.seqlen is None:
            _die("the following arguments are required: --seqlen, --hdim (or --shapes FILE)")
        if a.hdim is None:
            _die("the following arguments are required: --hdim (or --shapes FILE)")
        return grid(parse_int_list("--seqlen", a.seqlen), parse_int_list("--hdim", a.hdim), defaults)
    except (ShapeError, ValueError) as e:
        _die(str(e))


def problem_from_args(a) -> Problem:
    """The one problem of a single-shape command line."""
    problems = problems_from_args(a)
    if len(problems) != 1:
        _die(f"this command line describes {len(problems)} shapes, not one")
    return problems[0]


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_no_gpu(report: dict, console) -> None:
    from rich.markup import escape

    console.print(f"[bold]fa4-tune[/]: {report['provider']} on {report['arch']} (no CUDA GPU here)")
    console.print(f"problem: {problem_from_dict(report['problem']).key()}")
    console.print(
        f"search space: {report['configs']} configs for this problem (of {report['space']} declared), "
        f"{report['feasible']} feasible, "
        f"{report['infeasible']} infeasible"
    )
    for kind, r in report["infeasible_reasons"].items():
        console.print(escape(f"  rejected by {kind}: {r['count']} configs ({r['only']} by it alone; e.g. {r['example']})"))
    d = report["default"]
    state = "feasible" if not d["violations"] else "INFEASIBLE: " + "; ".join(d["violations"])
    console.print(escape(f"default config: {d['label']} ({state})"))
    comp = report["compile"] or {}
    if "skipped" in comp:
        console.print(escape(f"compile-only: skipped ({comp['skipped']})"))
    else:
        console.print(
            f"compile-only: {comp['ok']} of {comp['compiled']} kernels compiled for {report['arch']} "
            f"({comp['distinct_kernels']} distinct kernels in the feasible space; --trials caps how many), "
            f"{len(comp['errors'])} failed"
        )
        for e in comp["errors"][:5]:
            console.print(escape(f"  {e['config']}: {e['error']}"))
    console.print("[bold yellow]Timing needs a CUDA GPU:[/] nothing was measured or stored. Run on a CUDA GPU to tune.")


def _unit(problem) -> str:
    """What a measurement's throughput column holds: TB/s of K+V read for decode problems."""
    kind = problem.get("kind") if isinstance(problem, dict) else getattr(problem, "kind", None)
    return "TB/s" if kind == "decode" else "TFLOP/s"


def _row(row: dict | None, unit: str = "TFLOP/s") -> str:
    if row is None:
        return "none measured ok"
    if row.get("tflops") is None:
        return f"{row.get('status') or 'not measured'}: {row.get('reason') or ''}".rstrip(": ")
    return (f"{row['tflops']:.{3 if unit == 'TB/s' else 1}f} {unit}, median {_fmt(row['median_ms'], '.4f')} ms "
            f"(IQR {_fmt(row['iqr_ms'], '.4f')}), max error {_fmt(row['error'], '.2e')}, trial {row['trial']}")


def _changes(changes: dict | None) -> str:
    if changes is None:
        return "-"
    if not changes:
        return "the default"
    return "the default with " + ", ".join(f"{k}={v}" for k, v in changes.items())


def _served(v: dict) -> str:
    """What lookups serve after the top configs were re-measured against the default."""
    conf = f"{v['gain'] * 100:+.1f}% +- {v['spread'] * 100:.1f}% over {v['rounds']} interleaved rounds"
    if v["significant"]:
        return f"{_changes(v['changes'])} ({conf})"
    return f"the default: no significant gain ({conf})"


def _trial_counts(res) -> str:
    """measured / infeasible / failed, with the failures by kind."""
    st = dict(res.statuses)
    repeats = res.trials - sum(st.values())  # a config proposed again is answered from its first trial
    ok, infeasible = st.pop("ok", 0), st.pop("infeasible", 0)
    failed = sum(st.values())
    kinds = f" ({', '.join(f'{k} {v}' for k, v in sorted(st.items()))})" if st else ""
    again = f", {repeats} repeated a config already tried (not measured again)" if repeats else ""
    space = f" (of {res.feasible_configs} feasible configs)" if res.feasible_configs is not None else ""
    return (f"{res.trials} in study{space}: {ok} measured ok, {infeasible} infeasible, {failed} failed"
            f"{kinds}{again}")


def print_result(res, console) -> None:
    """The outcome as lines of text, not a table: piped or in an 80-column terminal a table is
    squeezed to ellipses and loses its numbers, lines only wrap."""
    from rich.markup import escape

    say = lambda text: console.print(escape(text))  # noqa: E731  data may hold brackets
    say(f"{res.provider} on {res.device}: {problem_from_dict(res.problem).key()}")
    say(f"timing: {res.timing}")
    say(f"default: {_row(res.default, _unit(res.problem))}")
    say(f"best:    {_row(res.best, _unit(res.problem))}")
    if res.default and res.default.get("status") not in (None, "ok"):
        say(f"default config failed: {res.default['status']}: {res.default['reason']}")
    say(f"speedup best/default: {'-' if res.speedup is None else f'{res.speedup:.3f}x'}")
    say(f"best config: {_changes(res.best_changes)}")
    if res.served is not None:
        say(f"served: {_served(res.served)}")
    if res.warm_start:
        say(f"warm start: {len(res.warm_start)} configs after the default, from the nearest measured shapes "
            f"({', '.join(dict.fromkeys(w['from'] for w in res.warm_start))})")
    say(f"trials: {_trial_counts(res)}" + (f"; resumed with {res.resumed_with}" if res.resumed_with else "")
        + ("; stopped by --budget-s" if res.out_of_time else ""))
    say(f"results DB: {res.db_url}")
    say(f"Optuna study: {res.study_name} in {res.storage}")


def _shape_label(p: Problem) -> str:
    if isinstance(p, DecodeProblem):
        return p.key()
    """Short enough for a table row; the full key is in the study name and --json."""
    kv = f"/{p.heads_kv}" if p.heads_kv != p.heads_q else ""
    sk = f"x{p.seqlen_k}" if p.seqlen_k != p.seqlen_q else ""
    flags = "".join(f" {f}" for f, on in (("causal", p.causal), ("det", p.deterministic)) if on)
    if p.has_window:
        flags += f" win{p.window_left},{p.window_right}"
    if p.softcap:
        flags += f" cap{p.softcap:g}"
    if p.sink:
        flags += " sink"
    if p.varlen:
        flags += f" varlen mean {p.varlen_mean_q}" + (f",{p.varlen_mean_k}" if p.varlen_mean_k != p.varlen_mean_q else "")
    dv = f"/{p.head_dim_v}" if p.head_dim_v != p.head_dim else ""
    return f"b{p.batch} s{p.seqlen_q}{sk} h{p.heads_q}{kv} d{p.head_dim}{dv} {p.dtype} {p.pass_}{flags}"


def print_summary(results: list[dict], console) -> None:
    """One line per shape for multi-shape runs (lines, for the reason print_result gives)."""
    from rich.markup import escape

    from .study import TuneResult

    if not results:
        return
    r0 = results[0]
    console.print(escape(f"{r0['provider']} on {r0['device']}: {len(results)} shapes, timing {r0.get('timing')}"))
    for r in map(lambda d: TuneResult(**d), results):
        d, b = r.default or {}, r.best or {}
        speed = "-" if r.speedup is None else f"{r.speedup:.3f}x"
        console.print(escape(
            f"{_shape_label(problem_from_dict(r.problem))}: default {_fmt(d.get('tflops'), '.1f')}, "
            f"best {_fmt(b.get('tflops'), '.3f' if _unit(r.problem) == 'TB/s' else '.1f')} {_unit(r.problem)}, speedup {speed}, error {_fmt(b.get('error'), '.1e')}; "
            f"best config: {_changes(r.best_changes)}; "
            + (f"served: {_served(r.served)}; " if r.served is not None else "")
            + f"trials: {_trial_counts(r)}"
        ))
    console.print(escape(f"results DB: {r0['db_url']}"))
    console.print(escape(f"Optuna studies in {r0['storage']}"))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    problems = problems_from_args(args)
    deadline = None if args.budget_s is None else time.time() + args.budget_s
    timing = Timing(args.launch, args.l2).name
    from rich.console import Console

    from .device import has_cuda
    from .study import Tuner, check_request, check_without_gpu, resolve_provider

    # Reasons and paths contain brackets (e.g. "fa4-tune[ref]"): no markup from data, no wrapping.
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if args.decode and args.provider is None:
        args.provider = "fa4-decode"
    try:
        provider = resolve_provider(args.provider)
        for problem in problems:
            check_request(provider, problem)
    except TuneError as e:
        _die(str(e))

    if provider.needs_gpu and not has_cuda():
        reports = [check_without_gpu(provider, p, compile_limit=args.trials) for p in problems]
        if args.json:
            print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
        else:
            for report in reports:
                print_no_gpu(report, out)
        return 0

    from . import fleet

    slots = None
    if args.devices:
        try:
            slots = fleet.parse_devices(args.devices, provider.needs_gpu, provider.name)
        except fleet.FleetError as e:
            _die(str(e))
    else:
        why = provider.available()
        if why:
            _die(f"{provider.name} is not available: {why}", EXIT_ENV)
    # With workers the same check runs while they start (it imports the provider's libraries, seconds
    # the workers spend importing too); a provider that is not available stops them, same message.
    token = None
    if args.push:
        from .push import TOKEN_ENV

        token = os.environ.get(TOKEN_ENV)
        if not token:
            _die(f"--push needs the service's API token in ${TOKEN_ENV}")

    from store import ResultsStore

    try:
        # Opened (and migrated) here, once, before any worker opens it.
        store = ResultsStore.open(args.db)
    except Exception as e:  # a bad URL, an unreachable server, a read-only path
        _die(f"cannot open the results DB {args.db or '(default)'}: {type(e).__name__}: {e}".splitlines()[0])
    spec = args.provider or provider.name
    try:
        from .study import default_storage

        storage = args.storage or default_storage(store.url)
        try:  # opened once here: an unwritable path or a bad URL is a usage error, not a traceback
            from .storage import open_storage

            open_storage(storage, args.heartbeat)
        except Exception as e:  # noqa: BLE001
            _die(f"cannot open the Optuna storage {storage}: {type(e).__name__}: {e}".splitlines()[0])
        if slots:
            outcome = fleet.run_fleet(
                slots, problems, provider_spec=spec, db=str(store.engine.url.render_as_string(hide_password=False)),
                storage=storage, sampler=args.sampler, trials=args.trials, heartbeat_s=args.heartbeat,
                verify_rounds=args.verify_rounds, deadline=deadline, timing=timing, preflight=lambda: (f"{provider.name} is not available: {why}"
                                   if (why := provider.available()) else None),
            )
            results, workers = outcome.results, outcome.workers
            if not outcome.complete:
                dead = ", ".join(f"{w['slot']}: {w['exit']}" for w in workers if w["returncode"] != 0)
                print(f"fa4-tune: not every study is complete ({dead or 'workers stopped early'}); "
                      "run the same command again to resume", file=sys.stderr)
        else:
            lock = None
            if provider.needs_gpu:  # a plain run times on the first visible GPU: lock it too
                lock = fleet.acquire(fleet.current_slot())
            # One measuring process for all the shapes: it keeps its imports, CUDA context and
            # compiled kernels from shape to shape (and is warmed while the first study opens).
            runner = None
            if provider.needs_gpu:
                from .worker import IsolatedRunner

                runner = IsolatedRunner()
                runner.prestart(spec)
            try:
                results, workers = [], None
                for problem in problems:
                    if deadline is not None and time.time() >= deadline:
                        print(f"fa4-tune: --budget-s {args.budget_s:g} spent: {problem.key()} not tuned",
                              file=sys.stderr)
                        continue
                    tuner = Tuner(provider, problem, store=store, storage=storage, sampler=args.sampler,
                                  trials=args.trials, provider_spec=spec, heartbeat_s=args.heartbeat,
                                  parallel="://" in storage, runner=runner, verify_rounds=args.verify_rounds,
                                  deadline=deadline, timing=timing)
                    results.append(_run_with_progress(tuner, err).to_dict())
            finally:
                if runner is not None:
                    runner.close()
                if lock is not None:
                    os.close(lock)
        push = None
        if args.push:
            from .push import describe, push_results

            push = push_results(store, [r["study_name"] for r in results], args.push, token)
            print(f"fa4-tune: {describe(push)}", file=sys.stderr)
    except fleet.Unavailable as e:
        _die(str(e), EXIT_ENV)
    except (TuneError, fleet.FleetError) as e:
        _die(str(e))
    except fleet.SlotBusy as e:
        _die(str(e), EXIT_ENV)
    except KeyboardInterrupt:
        print("fa4-tune: interrupted; run the same command again to resume the study", file=sys.stderr)
        return 130
    finally:
        store.close()
    incomplete = slots is not None and not outcome.complete
    if args.json:
        extra = {k: v for k, v in (("workers", workers), ("push", push)) if v is not None}
        doc = dict(results[0], **extra) if len(problems) == 1 and results else {"results": results, **extra}
        print(json.dumps(doc, indent=2, default=str))
    elif len(problems) == 1 and results:
        from .study import TuneResult

        print_result(TuneResult(**results[0]), out)
    else:
        print_summary(results, out)
    return EXIT_ENV if incomplete else 0


def _run_with_progress(tuner, console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.fields[what]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=console, transient=False,
    )
    state = {"task": None, "best": None}

    def on_start(t, todo, before):
        if before:
            console.print(f"resuming study {t.name} with {before} finished trials")
        state["task"] = progress.add_task("starting", total=max(todo, 1) if todo else 1,
                                          what=t.provider.name, completed=0 if todo else 1)

    def on_trial(t, study, trial):
        row = t.trial_row(trial) or {}
        if trial.value is not None and (state["best"] is None or trial.value > state["best"][0]):
            cfg = t.provider.config_from_dict(t.problem, trial.params) if trial.params else None
            state["best"] = (trial.value, t.provider.describe(cfg))
        best = f"best {state['best'][0]:.3g} {_unit(t.problem)} ({state['best'][1]})" if state["best"] else "best: none yet"
        last = row.get("status", "?")
        progress.update(state["task"], advance=1, description=f"{best}; last: {last}")

    with progress:
        return tuner.run(on_trial=on_trial, on_start=on_start)


def entry() -> None:
    """The fa4-tune program: main(), then an exit that skips the interpreter's teardown (the CuTe DSL
    and CUDA libraries a provider loaded take seconds to unload; every result is already in the DB,
    the journal and on stdout)."""
    import logging

    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code or 0)


if __name__ == "__main__":
    entry()
