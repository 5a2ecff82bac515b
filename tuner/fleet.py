"""One tuning worker per GPU, all on the same Optuna studies (``fa4-tune --devices 0,1|all``).

Layout: the fa4-tune process takes an exclusive lock file per GPU (so a second fa4-tune
on this host cannot time on a GPU this one uses), then starts one worker process per GPU
with CUDA_VISIBLE_DEVICES set to that GPU alone and the lock's file descriptor inherited
(the lock lives as long as either process). A worker's measurements run in its own
isolated child (tuner/worker.py), which dies with the worker. So one GPU has exactly one
timing process, and timings never share a GPU.

Distribution is Optuna's own: every worker opens the same studies in the same storage and
asks them for trials. Worker k of n starts at shape k*len/n of the list and goes round, so
the workers begin on different shapes and then help each other finish; within a study
they share the trial budget (finished + running trials fill it). A worker that dies stops
beating; its running trial goes FAIL and is retried by whoever looks next (see
tuner/storage.py), and the others wait for studies that still have running trials before
they exit, so every shape ends with its full budget as long as one worker lives.

Virtual slots ``cpu0,cpu1,...`` stand in for GPUs with providers that need none (the replay
provider), so all of this runs in the tests on a CPU-only machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fa4.problem import Problem

from .device import cuda_device_count, cuda_device_uuids

_VIRTUAL = re.compile(r"^cpu(\d+)$")
EXIT_SLOT_BUSY = 3


class FleetError(ValueError):
    """A --devices request that cannot be honoured (usage error)."""


class Unavailable(Exception):
    """The provider cannot run here (the parent's preflight check, made while the workers start)."""


class SlotBusy(RuntimeError):
    """Another process holds the lock of a GPU we were asked to time on."""


@dataclass(frozen=True)
class Slot:
    name: str  # "gpu1" / "cpu0": labels the worker's trials and log lines
    cuda_visible: str  # CUDA_VISIBLE_DEVICES for its worker ("" for a virtual slot)
    lock_key: str  # one per physical GPU on this host


# ---- which devices ----------------------------------------------------------------------


def parse_devices(spec: str, needs_gpu: bool, provider: str, visible: str | None = None,
                  count: int | None = None, uuids: dict | None = None) -> list[Slot]:
    """Slots for ``--devices``: GPU ordinals ("0,1"), "all", or virtual "cpu0,cpu1" (CPU providers).

    GPU ordinals count within the CUDA_VISIBLE_DEVICES the command was started with, like
    every CUDA program's: with CUDA_VISIBLE_DEVICES=2,3, ``--devices 0`` is physical GPU 2.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise FleetError("--devices needs GPU numbers (0,1), 'all', or virtual slots (cpu0,cpu1)")
    virtual = [s for s in items if _VIRTUAL.match(s)]
    if virtual:
        if needs_gpu:
            raise FleetError(f"{provider} times on a GPU: virtual slots ({', '.join(virtual)}) are only for "
                             "providers that need none (replay); give GPU numbers or 'all'")
        if len(virtual) != len(items):
            raise FleetError("--devices mixes GPUs and virtual cpu slots")
        if len(set(items)) != len(items):
            raise FleetError(f"--devices lists a slot twice: {spec}")
        return [Slot(s, "", f"virtual-{s}") for s in items]

    if visible is not None and visible.strip() != "":
        entries = [e.strip() for e in visible.split(",") if e.strip()]
    else:
        n = cuda_device_count() if count is None else count
        entries = [] if visible is not None and visible.strip() == "" else [str(i) for i in range(n)]
    if count is not None:
        entries = entries[:count]
    if not entries:
        raise FleetError("--devices: no CUDA GPU is visible here")
    if items == ["all"]:
        ordinals = list(range(len(entries)))
    else:
        ordinals = []
        for s in items:
            if not s.isdigit():
                raise FleetError(f"--devices: {s!r} is not a GPU number, 'all' or a cpuN slot")
            i = int(s)
            if i >= len(entries):
                raise FleetError(f"--devices: no GPU {i} (this machine shows {len(entries)})")
            if i in ordinals:
                raise FleetError(f"--devices lists GPU {i} twice: one timing worker per GPU")
            ordinals.append(i)
    if uuids is None:  # each visible entry's UUID, by CUDA ordinal, from the driver
        uuids = dict(zip(entries, cuda_device_uuids()))
    slots = []
    for i in ordinals:
        phys = entries[i]
        slots.append(Slot(f"gpu{i}", phys, uuids.get(phys, phys)))
    if len({s.lock_key for s in slots}) != len(slots):
        raise FleetError("--devices names one physical GPU twice: one timing worker per GPU")
    return slots


def current_slot() -> Slot:
    """The GPU a plain (no --devices) run times on: CUDA ordinal 0 of the visible ones, locked
    by the UUID the driver gives it, the key ``--devices 0`` locks, so a plain run and a fleet
    on one host never time on the same GPU."""
    return parse_devices("0", needs_gpu=True, provider="fa4-tune")[0]


# ---- one timing process per GPU ---------------------------------------------------------


def lock_dir() -> Path:
    """$FA4_LOCK_DIR, else a host-wide directory under the temp dir (all users share GPUs)."""
    d = Path(os.environ.get("FA4_LOCK_DIR") or Path(tempfile.gettempdir()) / "fa4-tune-locks")
    d.mkdir(parents=True, exist_ok=True)
    try:
        d.chmod(0o1777)
    except OSError:
        pass  # made by another user: it is already shared
    return d


def acquire(slot: Slot) -> int:
    """An open file descriptor holding ``slot``'s exclusive lock; raises SlotBusy when taken.

    flock locks belong to the open file: they survive in children that inherit the
    descriptor and vanish when the last holder exits, however it exits (even SIGKILL).
    """
    import fcntl

    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", slot.lock_key)
    path = lock_dir() / f"{safe}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        what = "virtual slot" if slot.lock_key.startswith("virtual-") else "GPU"
        raise SlotBusy(f"{what} {slot.cuda_visible or slot.name} is in use for timing by {holder} "
                       f"(lock {path}); two timing workers on one GPU pick wrong winners") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"fa4-tune pid {os.getpid()}".encode(), 0)
    return fd


def acquire_all(slots: list[Slot]) -> list[int]:
    fds = []
    try:
        for s in slots:
            fds.append(acquire(s))
    except SlotBusy:
        for fd in fds:
            os.close(fd)
        raise
    return fds


# ---- which shapes a worker takes first --------------------------------------------------


def compile_class(problem: Problem) -> tuple:
    """What a kernel is compiled for: everything of a problem but batch, sequence lengths and head
    counts (runtime arguments of every provider here). Shapes of one class reuse each other's
    compiled kernels within a process, so a class is best tuned by one worker."""
    return (problem.pass_, problem.dtype, problem.head_dim, problem.head_dim_v, problem.causal,
            problem.deterministic, problem.heads_q != problem.heads_kv,
            *sorted(problem.kernel_flags().items()))  # the features switch kernels, not their sizes


def worker_order(shares: list[list[Problem]], k: int) -> list[Problem]:
    """The order in which worker ``k`` visits the shapes, given every worker's share
    (:func:`worker_shares`): its own share first, then the others' (it helps where studies are
    not full yet)."""
    n = len(shares)
    return shares[k] + [p for j in range(1, n) for p in shares[(k + j) % n]]


def worker_shares(problems: list[Problem], n: int) -> list[list[Problem]]:
    """The shapes each of ``n`` workers owns (tunes first).

    A trial's cost is mostly the compile of a config not seen before (1.2-1.8 s for the reference
    FA4 on the H200 host, 0.3-0.4 s when the kernel is already compiled in that process: measured
    in bench/logs/fleet_scaling_s3). Splitting the shapes by position made both workers compile
    every class, and 2 GPUs tuned only 1.10x faster than one. So whole compile classes are dealt
    to workers (largest first, to the least loaded worker); with fewer classes than workers the
    shapes of a class are split between the workers that share it.
    """
    classes: dict[tuple, list[Problem]] = {}
    for p in problems:
        classes.setdefault(compile_class(p), []).append(p)
    groups = sorted(classes.values(), key=len, reverse=True)
    shares: list[list[Problem]] = [[] for _ in range(n)]
    if len(groups) >= n:
        for g in groups:
            min(shares, key=len).extend(g)
    else:
        # Fewer classes than workers: give each class a set of workers in proportion to its size,
        # and split its shapes between them by position.
        workers = list(range(n))
        sizes = [len(g) for g in groups]
        counts = [1] * len(groups)
        for _ in range(n - len(groups)):
            i = max(range(len(groups)), key=lambda j: sizes[j] / counts[j])
            counts[i] += 1
        for g, c in zip(groups, counts):
            ws, workers = workers[:c], workers[c:]
            for j, w in enumerate(ws):
                shares[w].extend(g[j * len(g) // c:(j + 1) * len(g) // c])
    return shares


def sampler_seed(base: int, sampler: str, owner: bool, k: int) -> int:
    """The seed of worker ``k``'s sampler on a study. The worker that owns the study uses ``base``,
    the seed a plain single-GPU run uses for every study: the sampler's start-up proposals are then
    the same whatever the fleet size (the same kernels compiled, winners comparable across runs),
    and shapes of one compile class, owned by one worker, get the same ones (compiled once for all
    of them). A worker that helps on another's study takes its own seed, so the two do not
    propose the same configs in lockstep. The grid keeps one seed: it shuffles the grid's
    numbering of points."""
    if sampler == "grid" or owner:
        return base
    return base + 1 + k


# ---- the worker process -----------------------------------------------------------------


def _say(msg: str) -> None:
    """One log line on stderr in one write: the workers and the parent share that file, and
    print() writes the text and its newline separately (unbuffered stderr), so two workers'
    lines could interleave mid-line."""
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def worker_main(spec: dict) -> int:
    """Tune every shape of ``spec`` on this process's GPU, sharing the studies with the others."""
    from .study import Tuner, resolve_provider
    from .worker import InProcessRunner, IsolatedRunner

    slot, k, n = spec["slot"], spec["index"], spec["n_workers"]
    provider = resolve_provider(spec["provider"])
    # Virtual slots exist only for GPU-less providers; those cannot poison a CUDA context.
    runner = IsolatedRunner() if provider.needs_gpu else InProcessRunner()
    if provider.needs_gpu:
        # The measuring process imports torch / the CuTe DSL / the kernels and makes its CUDA
        # context (seconds: the path to the first trial) while this process imports the DB layer
        # and opens the results DB and the studies.
        runner.prestart(spec["provider"])
    from store import ResultsStore

    problems = [Problem.from_dict(d) for d in spec["problems"]]
    shares = worker_shares(problems, n)
    order = worker_order(shares, k)
    own = {p.key() for p in shares[k]}
    store = ResultsStore.open(spec["db"])
    t0 = spec.get("t0") or time.time()

    def stamp() -> str:
        return f"[{slot} +{time.time() - t0:.1f}s]"

    _say(f"{stamp()} worker ready ({len(problems)} shapes)")

    warm_logged = False

    def on_trial(t, study, trial):
        nonlocal warm_logged
        if not warm_logged and getattr(runner, "warm_s", None) is not None:
            warm_logged = True
            _say(f"{stamp()} measuring process had warmed up in {runner.warm_s:.1f} s ({runner.warm_result})")
        ua = trial.user_attrs
        row = t.trial_row(trial) or {}
        what = f"{trial.value:.1f} TFLOP/s" if trial.value is not None else (row.get("reason") or "")[:80]
        dup = f" (= trial {ua['duplicate_of']})" if "duplicate_of" in ua else ""
        # Where a measured trial's time went: a new kernel's compile shows in 'build'.
        took = ("  [" + " ".join(f"{k} {v:.2f}s" for k, v in ua["phases"].items()) + "]"
                if ua.get("phases") and "duplicate_of" not in ua else "")
        _say(f"{stamp()} {t.problem.key()} trial {trial.number}: {row.get('status', trial.state.name.lower())} "
             f"{what}{dup}{took}")

    try:
        # First round: take what is free, shape after shape. Second round: wait until
        # every study is full, taking over trials of workers that died.
        for final in (False, True):
            for problem in order:
                t = Tuner(provider, problem, store=store, storage=spec["storage"], sampler=spec["sampler"],
                          trials=spec["trials"], runner=runner,
                          seed=sampler_seed(spec["seed"], spec["sampler"], problem.key() in own, k),
                          provider_spec=spec["provider"], worker=slot, parallel=True,
                          heartbeat_s=spec.get("heartbeat_s"),
                          # The owner of a study judges its winners, once, when the study is full.
                          verify_rounds=spec.get("verify_rounds", 7) if final and problem.key() in own else 0,
                          deadline=spec.get("deadline"), timing=spec.get("timing"))
                res = t.run(on_trial=on_trial, wait=final)
                _emit({"event": "result", "slot": slot, "final": final, "key": problem.key(),
                       "stored": t.stored, "result": res.to_dict()})
            _say(f"{stamp()} {'every study full' if final else 'first round done'}")
    finally:
        runner.close()
        store.close()
        _say(f"{stamp()} worker done")
    return 0


# ---- the parent -------------------------------------------------------------------------


@dataclass
class FleetOutcome:
    results: list[dict]  # one TuneResult dict per problem, in the order given
    workers: list[dict]  # slot, pid, exit description
    complete: bool  # every study holds its budget

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), so a fleet log shows the parent's own start-up."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _exit_words(code: int) -> str:
    import signal

    if code == 0:
        return "ok"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code == EXIT_SLOT_BUSY:
        return "slot busy"
    return f"exit code {code}"


def run_fleet(slots: list[Slot], problems: list[Problem], *, provider_spec: str, db: str, storage: str,
              sampler: str, trials: int, seed: int = 0, heartbeat_s: int | None = None,
              log=None, on_spawn=None, preflight=None, verify_rounds: int = 7,
              deadline: float | None = None, timing: str | None = None) -> FleetOutcome:
    """Start one worker per slot, wait for all, and gather each problem's final result.

    ``preflight`` (returns a reason or None) runs once the workers are started, so its cost (a
    provider's imports) overlaps theirs; a reason stops the workers and raises Unavailable."""
    from .storage import open_storage

    log = log or _say
    fds = acquire_all(slots)
    try:
        open_storage(storage, heartbeat_s)  # make the schema / journal once, not in a race of workers
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    root = str(Path(__file__).resolve().parents[1])
    # Log lines carry seconds since this point, so a run's log shows where its time went
    # (process start, imports, compiles, trials) without a profiler.
    t0 = time.time()
    age = _process_age_s()
    if age is not None:
        log(f"[fleet +0.0s] starting {len(slots)} worker(s), {age:.1f} s after fa4-tune started")
    procs, threads = [], []
    finals: dict[str, dict] = {}
    stored: dict[str, int] = {}
    resumed: dict[str, int] = {}  # finished trials when the first worker opened the study
    lock = threading.Lock()

    def reader(proc):
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                sys.stderr.write(line)
                continue
            with lock:
                stored[ev["key"]] = stored.get(ev["key"], 0) + ev["stored"]
                resumed[ev["key"]] = min(resumed.get(ev["key"], 1 << 30), ev["result"]["resumed_with"])
                prev = finals.get(ev["key"])
                # The fullest view of a study wins (a later one never has fewer trials); of two
                # full ones, the owner's, which carries the re-measurement's verdict.
                res = ev["result"]
                if (prev is None or res["trials"] > prev["trials"]
                        or (res["trials"] == prev["trials"] and (res.get("served") or not prev.get("served")))):
                    finals[ev["key"]] = res

    try:
        for k, (slot, fd) in enumerate(zip(slots, fds)):
            spec = {"slot": slot.name, "index": k, "n_workers": len(slots), "provider": provider_spec,
                    "problems": [p.to_dict() for p in problems], "db": db, "storage": storage,
                    "sampler": sampler, "trials": trials, "seed": seed, "heartbeat_s": heartbeat_s,
                    "verify_rounds": verify_rounds, "deadline": deadline, "timing": timing,
                    "parent_pid": os.getpid(), "t0": t0}
            env = dict(os.environ)
            env["CUDA_VISIBLE_DEVICES"] = slot.cuda_visible
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
            # The spec travels on stdin: it holds the DB URL, which may hold a password.
            proc = subprocess.Popen([sys.executable, "-m", "tuner.fleet"], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, pass_fds=(fd,))
            proc.stdin.write(json.dumps(spec))
            proc.stdin.close()
            procs.append((slot, proc))
            log(f"[{slot.name} +{time.time() - t0:.1f}s] worker pid {proc.pid} on "
                f"CUDA_VISIBLE_DEVICES={slot.cuda_visible!r}")
            th = threading.Thread(target=reader, args=(proc,), daemon=True)
            th.start()
            threads.append(th)
            if on_spawn:
                on_spawn(slot, proc)
        if preflight is not None:
            why = preflight()
            if why:
                raise Unavailable(why)  # the finally below kills the workers
            log(f"[fleet +{time.time() - t0:.1f}s] preflight done")
        workers = []
        for slot, proc in procs:
            code = proc.wait()
            words = _exit_words(code)
            if code != 0:
                log(f"[{slot.name} +{time.time() - t0:.1f}s] worker {proc.pid} {words}; "
                    "the other workers take over its trials")
            else:
                log(f"[{slot.name} +{time.time() - t0:.1f}s] worker {proc.pid} exited")
            workers.append({"slot": slot.name, "pid": proc.pid, "exit": words, "returncode": code})
    finally:
        for _slot, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for fd in fds:
            os.close(fd)
    for th in threads:
        th.join(timeout=10)
    results = []
    complete = True
    for p in problems:
        r = finals.get(p.key())
        if r is None:
            complete = False
            continue
        r = dict(r, stored_measurements=stored.get(p.key(), 0), resumed_with=resumed[p.key()])
        complete &= r["trials"] - r["failed"] >= r["budget"]
        results.append(r)
    return FleetOutcome(results=results, workers=workers, complete=complete)


if __name__ == "__main__":
    from .worker import die_with_parent

    spec = json.loads(sys.stdin.read())
    die_with_parent(spec.get("parent_pid"))
    try:
        code = worker_main(spec)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent says what to do
        code = 130
    except Exception as e:  # one line in the fleet's log, not a traceback per worker
        _say(f"[{spec.get('slot')}] worker failed: {type(e).__name__}: {e}".splitlines()[0])
        code = 1
    # Every result is on stdout and in the DBs (closed above): skip the interpreter's teardown
    # (CUDA context, compiler libraries), seconds at the end of every fleet run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
