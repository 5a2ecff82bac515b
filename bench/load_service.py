"""Load test of GET /v1/configs/best on loopback: a fixed request rate, latency percentiles, errors.

    python3 bench/load_service.py                      # starts fa4-serve on a seeded temp DB, 500 req/s for 30 s
    python3 bench/load_service.py --url http://127.0.0.1:8000 --rate 200 --duration 10
    python3 bench/load_service.py --append bench/RESULTS.md
    python3 bench/load_service.py --rate 800 --writes 10      # lookups and authenticated writes together
    python3 bench/load_service.py --cold-start --rate 500     # load from the moment the port accepts
    python3 bench/load_service.py --big-posts 8               # 8 x 60 MB unauthenticated POSTs, RSS, /healthz
    python3 bench/load_service.py --devices 100000            # lookups with that many distinct device strings

Open loop: request i is due at start + i/rate whatever happened before, and its latency is
counted from that due time, so a server that falls behind shows it in the tail instead of
slowing the generator down (no coordinated omission). The shape population mixes exact
hits, near misses (nearest-shape answers) and families with no data (heuristic default).
Only loopback targets are accepted: this is a bench, not a tool to load other machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEVICE = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 62914560,
          "memory_bytes": 150754820096}
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MAX_RATE, MAX_DURATION = 2000, 120


def _sample_feasible(rng: random.Random, problem, n: int) -> list:
    """``n`` distinct feasible forward configs of ``problem``, drawn uniformly from the space (about
    one in twenty is feasible at hd128: about eighty draws, where enumerating the space took seconds)."""
    from fa4.arch import SM90
    from fa4.knobs import knob_specs
    from fa4.sm90.fwd_config import FwdConfigSm90, violations

    specs = knob_specs(FwdConfigSm90)
    out: list = []
    while len(out) < n:
        cfg = FwdConfigSm90(**{s.name: rng.choice(s.choices) for s in specs})
        if cfg not in out and not violations(cfg, problem, SM90):
            out.append(cfg)
    return out


def seed(db_url: str, extra: int = 0) -> int:
    """Measured rows for hd 64/128 x causal/not x six seqlens, a few configs each; returns the row count.

    ``extra`` rows more, on another device (answers for DEVICE do not change), to make listings
    of /v1/results heavy: 50 samples each, as a tuner's trial stores them.
    """
    from fa4.knobs import config_to_dict
    from fa4.problem import Problem
    from fa4.sm90.fwd_config import FwdConfigSm90
    from store import ResultsStore
    from providers import get_provider

    fp = get_provider("fa4").source_fingerprint()
    rng = random.Random(0)
    n = 0
    with ResultsStore.open(db_url) as store:
        dev = store.upsert_device(DEVICE)
        for hd in (64, 128):
            for causal in (False, True):
                for s in SEQLENS:
                    p = Problem.standard(s, hd, causal=causal)
                    pid = store.upsert_problem(p)
                    for cfg in _sample_feasible(rng, p, 4):
                        cid = store.upsert_config("fa4", config_to_dict(cfg), FwdConfigSm90)
                        ms = rng.uniform(0.5, 2.0)
                        store.add_measurement(dev, pid, cid, status="ok", samples_ms=[ms] * 5, median_ms=ms,
                                              tflops=p.flops / (ms * 1e9), source_fingerprint=fp)
                        n += 1
        other = store.upsert_device({**DEVICE, "name": "bench-listing-gpu"})
        p = Problem.standard(4096, 128)
        pid = store.upsert_problem(p)
        cid = store.upsert_config("fa4", config_to_dict(FwdConfigSm90()), FwdConfigSm90)
        for i in range(extra):
            ms = rng.uniform(0.5, 2.0)
            store.add_measurement(other, pid, cid, status="ok", samples_ms=[ms] * 50, median_ms=ms,
                                  tflops=p.flops / (ms * 1e9), source_fingerprint=fp, study_name="bench-listing",
                                  trial_number=i)
            n += 1
    return n


def population(rng: random.Random, n: int, other_provider: str | None = None) -> list[dict]:
    """Query parameters: 50% exact measured shapes, 35% other seqlens (nearest), 15% unmeasured family.

    With ``other_provider``, a tenth of the queries ask for it instead of fa4 (cold starts: its
    fingerprint, e.g. flash-attn-4's, may cost seconds to compute).
    """
    out = []
    for _ in range(n):
        u = rng.random()
        hd = rng.choice((64, 128))
        causal = rng.choice((False, True))
        s = rng.choice(SEQLENS) if u < 0.5 or u >= 0.85 else rng.randrange(256, 32768, 64)
        q = {"device": DEVICE["name"], "head_dim": hd, "seqlen_q": s, "batch": max(1, 16384 // s),
             "heads_q": 2048 // hd, "causal": str(causal).lower()}
        if u >= 0.85:
            q["dtype"] = "fp16"  # only bf16 was measured: heuristic default
        if other_provider and rng.random() < 0.1:
            q["provider"] = other_provider
        out.append(q)
    return out


def percentile(sorted_xs: list[float], q: float) -> float:
    if not sorted_xs:
        return float("nan")
    i = min(len(sorted_xs) - 1, max(0, int(round(q * (len(sorted_xs) - 1)))))
    return sorted_xs[i]


class Connection:
    """One keep-alive HTTP/1.1 connection. A minimal client, because a general-purpose async
    client costs more CPU per request than the service does, and both share this machine."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def get(self, target: str) -> tuple[int, bytes]:
        return await self.request("GET", target)

    async def request(self, method: str, target: str, body: bytes = b"", headers: dict | None = None
                      ) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"{method} {target} HTTP/1.1\r\nHost: {self.host}\r\n"
        for k, v in (headers or {}).items():
            head += f"{k}: {v}\r\n"
        if body or method == "POST":
            head += f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            length = next(int(ln.split(":", 1)[1]) for ln in lines[1:] if ln.lower().startswith("content-length:"))
            body = await self.reader.readexactly(length)
        except BaseException:
            self.close()
            raise
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def run_load(url: str, rate: float, duration: float, seed_: int = 1, connections: int = 32,
                   cold: bool = False, writes: float = 0.0, token: str | None = None,
                   other_provider: str | None = None, devices: int = 0, warmup: bool = True,
                   listers: int = 0) -> dict:
    from urllib.parse import urlencode

    u = urlparse(url)
    rng = random.Random(seed_)
    total = int(rate * duration)
    pop = population(rng, 997, other_provider)
    if devices:
        # Each request its own device string: what a cache keyed by the client's string would keep.
        pop = [{**pop[i % len(pop)], "device": f"bench-gpu-{seed_}-{i}"} for i in range(devices)]
    targets = ["/v1/configs/best?" + urlencode(p) for p in pop]
    lat: list[float] = []
    errors: dict[str, int] = {}
    provenance: dict[str, int] = {}
    conns = [Connection(u.hostname, u.port or 80) for _ in range(connections)]
    queue: asyncio.Queue = asyncio.Queue()
    if writes:
        study = f"bench-writes-{seed_}-{int(time.time())}"
        bodies = write_bodies(random.Random(seed_ + 1000), study, int(writes * duration))

    # Warm-up, not measured: connections opened and, unless cold, every shape of the population
    # asked once, so the run measures the steady state of a service whose answer cache is warm
    # (each first answer costs a few DB queries; --cold shows that start-up phase instead).
    # (A cold start measures from the very first request: no warm-up at all.)
    n_warm = 0 if not warmup else connections if cold else len(targets)
    for i in range(0, n_warm, connections):
        await asyncio.gather(*(c.get(targets[(i + j) % len(targets)]) for j, c in enumerate(conns)))

    async def worker(conn: Connection):
        while True:
            item = await queue.get()
            if item is None:
                return
            i, due = item
            try:
                status, body = await conn.get(targets[i % len(targets)])
                if status != 200:
                    errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
                else:
                    p = json.loads(body)["provenance"]
                    provenance[p] = provenance.get(p, 0) + 1
            except Exception as e:  # noqa: BLE001 - every failure is a counted error
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            lat.append(time.perf_counter() - due)
            slowest.append((lat[-1], due))

    slowest: list[tuple[float, float]] = []
    workers = [asyncio.create_task(worker(c)) for c in conns]
    writer = asyncio.create_task(write_load(u, writes, bodies, study, token)) if writes else None
    done = asyncio.Event()
    listing = [asyncio.create_task(list_loop(u, done)) for _ in range(listers)]
    start = time.perf_counter() + 0.05
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        queue.put_nowait((i, due))
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    elapsed = time.perf_counter() - start
    done.set()
    pages = await asyncio.gather(*listing)
    for c in conns:
        c.close()
    lat.sort()
    wrote = await writer if writer is not None else None
    if wrote is not None:
        wrote.update(await check_writes(u, wrote.pop("ids"), wrote["study"]))
    return {
        "requests": total,
        "target_rate": rate,
        "achieved_rate": round(total / elapsed, 1),
        "duration_s": round(elapsed, 2),
        "p50_ms": round(percentile(lat, 0.50) * 1e3, 3),
        "p90_ms": round(percentile(lat, 0.90) * 1e3, 3),
        "p99_ms": round(percentile(lat, 0.99) * 1e3, 3),
        "max_ms": round(lat[-1] * 1e3, 3) if lat else None,
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "provenance": provenance,
        "cache": "cold" if cold else "warm",
        **({"listers": listers, "pages_listed": sum(p[0] for p in pages),
            "page_p50_ms": round(percentile(sorted(x for p in pages for x in p[1]), 0.5) * 1e3, 1)}
           if listers else {}),
        # When the tail happened: (seconds into the run, latency ms) of the five slowest requests.
        "slowest": [(round(d - start, 3), round(x * 1e3, 1)) for x, d in sorted(slowest, reverse=True)[:5]],
        **({"writes": wrote} if wrote is not None else {}),
    }


def write_bodies(rng: random.Random, study: str, n: int) -> list[bytes]:
    """``n`` tuner trials in the measured families (so they change answers lookups ask for), encoded
    up front, so that nothing stalls the load generator. Configs are drawn uniformly from the space
    (enumerating its 1.8M points took seconds)."""
    from fa4.knobs import knob_specs
    from fa4.problem import Problem
    from fa4.sm90.fwd_config import FwdConfigSm90
    from providers import get_provider

    fp = get_provider("fa4").source_fingerprint()
    specs = knob_specs(FwdConfigSm90)
    out = []
    for i in range(n):
        hd, causal, s = rng.choice((64, 128)), rng.choice((False, True)), rng.choice(SEQLENS)
        p = Problem.standard(s, hd, causal=causal)
        ms = rng.uniform(0.5, 2.0)
        out.append(json.dumps({
            "device": DEVICE, "provider": "fa4", "problem": p.to_dict(), "config": {k.name: rng.choice(k.choices) for k in specs},
            "status": "ok", "samples_ms": [ms] * 20, "median_ms": ms, "tflops": p.flops / (ms * 1e9),
            "study_name": study, "trial_number": i, "source_fingerprint": fp}).encode())
    return out


async def write_load(u, rate: float, bodies: list[bytes], study: str, token: str | None) -> dict:
    """POST ``bodies`` at ``rate`` per second (open loop, one connection per write in flight)."""
    lat, ids, errors = [], [], {}
    headers = {"Authorization": f"Bearer {token}"}

    async def one(i: int, due: float):
        c = Connection(u.hostname, u.port or 80)
        try:
            status, body = await c.request("POST", "/v1/results", bodies[i], headers)
            if status == 201:
                ids.append(json.loads(body)["id"])
            else:
                errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
        except Exception as e:  # noqa: BLE001 - every failure is a counted error
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
        finally:
            c.close()
        lat.append(time.perf_counter() - due)

    tasks = []
    start = time.perf_counter() + 0.05
    for i in range(len(bodies)):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    lat.sort()
    return {"sent": len(tasks), "acknowledged": len(ids), "errors": sum(errors.values()), "error_kinds": errors,
            "p50_ms": round(percentile(lat, 0.5) * 1e3, 2), "p99_ms": round(percentile(lat, 0.99) * 1e3, 2),
            "ids": ids, "study": study}


async def check_writes(u, ids: list[int], study: str) -> dict:
    """Every acknowledged write is in the database afterwards (read back through the API)."""
    from urllib.parse import urlencode

    c = Connection(u.hostname, u.port or 80)
    found, offset = set(), 0
    while True:
        status, body = await c.get("/v1/results?" + urlencode({"study_name": study, "limit": 1000, "offset": offset}))
        page = json.loads(body)
        found |= {r["id"] for r in page["items"]}
        offset += len(page["items"])
        if not page["items"] or offset >= page["total"]:
            break
    c.close()
    return {"present_afterwards": len(found & set(ids)), "missing": sorted(set(ids) - found)[:10]}


async def list_loop(u, done: asyncio.Event) -> tuple[int, list[float]]:
    """A client paging GET /v1/results?limit=1000 back to back until ``done`` (what a dashboard,
    or a scraper, does); returns (pages, their latencies)."""
    c = Connection(u.hostname, u.port or 80)
    n, lat = 0, []
    while not done.is_set():
        t = time.perf_counter()
        status, _ = await c.get("/v1/results?limit=1000")
        if status != 200:
            raise RuntimeError(f"GET /v1/results: HTTP {status}")
        lat.append(time.perf_counter() - t)
        n += 1
    c.close()
    return n, lat


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def probe_healthz(u, stop: asyncio.Event, every_s: float = 0.01) -> list[float]:
    """/healthz latencies, one request every ``every_s`` on one keep-alive connection, until ``stop``."""
    c = Connection(u.hostname, u.port or 80)
    lat = []
    while not stop.is_set():
        t = time.perf_counter()
        try:
            status, _ = await c.get("/healthz")
            lat.append(time.perf_counter() - t if status == 200 else float("inf"))
        except Exception:  # noqa: BLE001 - not up yet, or dropped: counted as a failure
            lat.append(float("inf"))
            c.close()
        await asyncio.sleep(every_s)
    c.close()
    return sorted(lat)


async def big_posts(u, n: int, megabytes: int, pid: int | None, token: str | None = None) -> dict:
    """``n`` concurrent POSTs of ``megabytes`` each (unauthenticated unless ``token``); server RSS and
    /healthz meanwhile."""
    chunk = b"[" + b"1.0," * (1 << 18)  # ~1 MiB of a JSON array that never ends: valid-looking, huge
    body_len = megabytes << 20
    rss0 = rss_kb(pid) if pid else None
    peak = [rss0 or 0]
    stop = asyncio.Event()

    async def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kb(pid))
            await asyncio.sleep(0.02)

    async def one() -> tuple[str, float, int]:
        t = time.perf_counter()
        reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        writer.write(f"POST /v1/results HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
                     f"Content-Length: {body_len}\r\n\r\n".encode())
        sent = 0
        answer = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
        try:
            while sent < body_len and not answer.done():
                writer.write(chunk[: body_len - sent])
                sent += min(len(chunk), body_len - sent)
                await writer.drain()
            head = await asyncio.wait_for(answer, 30)
            status = head.split(b" ", 2)[1].decode()
        except (ConnectionError, asyncio.IncompleteReadError) as e:
            status = type(e).__name__
            answer.cancel()
        writer.close()
        return status, time.perf_counter() - t, sent

    health = asyncio.ensure_future(probe_healthz(u, stop))
    sampler = asyncio.ensure_future(sample()) if pid else None
    await asyncio.sleep(0.3)
    results = await asyncio.gather(*(one() for _ in range(n)))
    await asyncio.sleep(0.3)
    stop.set()
    lat = await health
    if sampler:
        await sampler
    return {
        "posts": n, "megabytes_each": megabytes, "statuses": [r[0] for r in results],
        "max_s": round(max(r[1] for r in results), 3), "body_mb_sent_max": round(max(r[2] for r in results) / 2**20, 2),
        "rss_growth_mb": round((peak[0] - rss0) / 1024, 1) if pid else None,
        "healthz_n": len(lat), "healthz_p99_ms": round(percentile(lat, 0.99) * 1e3, 2),
        "healthz_max_ms": round(lat[-1] * 1e3, 2),
    }


async def cold_start(db_url: str, port: int, rate: float, duration: float, token: str) -> dict:
    """Start fa4-serve and put ``rate`` lookups/s on it from the moment its port accepts a connection."""
    u = urlparse(f"http://127.0.0.1:{port}")
    t0 = time.perf_counter()
    proc = spawn_server(db_url, port, 1, token)
    try:
        while True:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                if proc.poll() is not None or time.perf_counter() - t0 > 120:
                    raise SystemExit("load_service: fa4-serve did not start")
                await asyncio.sleep(0.005)
        accepted_after = time.perf_counter() - t0
        stop = asyncio.Event()
        health = asyncio.ensure_future(probe_healthz(u, stop, 0.02))
        res = await run_load(u.geturl(), rate, duration, cold=True, other_provider="flash-attn-4", warmup=False)
        stop.set()
        lat = await health
    finally:
        proc.terminate()
        proc.wait(30)
    res["accepting_after_s"] = round(accepted_after, 2)
    res["healthz_p99_ms"] = round(percentile(lat, 0.99) * 1e3, 2)
    res["healthz_max_ms"] = round(lat[-1] * 1e3, 2)
    return res


def spawn_server(db_url: str, port: int, workers: int, token: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("FA4_API_TOKEN", None)
    if token:
        env["FA4_API_TOKEN"] = token
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "--db", db_url, "--host", "127.0.0.1", "--port", str(port),
         "--workers", str(workers), "--no-access-log", "--log-level", "warning"],
        env=env,
    )


def start_server(db_url: str, port: int, workers: int, token: str | None = None) -> subprocess.Popen:
    import httpx

    proc = spawn_server(db_url, port, workers, token)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("load_service: fa4-serve did not start")
        time.sleep(0.2)


def _run_loop(coro):
    # The generator's own full collections (it imported the seed's packages) would pause every
    # request in flight at once and show up as the service's tail: keep them off what is loaded.
    import gc

    gc.collect()
    gc.freeze()
    # The generator shares the cores with the service; uvloop keeps its own cost down.
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def insert_entry(path: Path, entry: str) -> None:
    """Newest entries go at the top of the log's "## Entries" section (else at the end)."""
    text = path.read_text() if path.exists() else ""
    marker = "## Entries\n"
    if marker in text:
        head, _, tail = text.partition(marker)
        text = head + marker + entry + tail
    else:
        text += entry
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running service on loopback (default: start one on a seeded temp DB)")
    ap.add_argument("--rate", type=float, default=500.0, help="requests per second (open loop)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn workers of the started service")
    ap.add_argument("--cold", action="store_true", help="do not pre-ask the shapes (measure the cache filling up)")
    ap.add_argument("--writes", type=float, default=0.0,
                    help="also POST this many results per second (the started service gets a token)")
    ap.add_argument("--token", default=os.environ.get("FA4_API_TOKEN"), help="writer token for --url")
    ap.add_argument("--cold-start", action="store_true",
                    help="start the service and load it from the moment its port accepts (a tenth flash-attn-4)")
    ap.add_argument("--big-posts", type=int, default=0, help="instead: this many concurrent unauthenticated POSTs")
    ap.add_argument("--big-mb", type=int, default=60, help="size of each --big-posts body in MB")
    ap.add_argument("--big-with-token", action="store_true", help="send the writer token with --big-posts")
    ap.add_argument("--devices", type=int, default=0, help="lookups with this many distinct device strings")
    ap.add_argument("--listers", type=int, default=0, help="clients paging /v1/results?limit=1000 meanwhile")
    ap.add_argument("--seed-extra", type=int, default=0, help="more rows (another device) for heavy listings")
    ap.add_argument("--append", type=Path, help="add a measurements-log entry to this markdown file (bench/RESULTS.md)")
    a = ap.parse_args(argv)
    if not (0 < a.rate <= MAX_RATE and 0 < a.duration <= MAX_DURATION):
        ap.error(f"rate must be in (0, {MAX_RATE}] and duration in (0, {MAX_DURATION}]")
    if not 0 <= a.writes <= 100 or not 0 <= a.big_posts <= 16 or not 0 < a.big_mb <= 100:
        ap.error("writes must be in [0, 100], big posts in [0, 16] of (0, 100] MB")
    if (a.cold_start or a.big_posts) and a.url:
        ap.error("--cold-start and --big-posts start their own service (they watch its process)")

    proc = None
    tmp = None
    url = a.url
    if url:
        host = urlparse(url).hostname
        if host not in LOOPBACK:
            ap.error(f"only loopback targets are allowed, not {host!r}")
        rows = None
    else:
        from tests.service.live import free_port

        import secrets

        a.token = a.token or secrets.token_hex(16)
        tmp = tempfile.TemporaryDirectory(prefix="fa4-load-")
        db_url = f"sqlite:///{Path(tmp.name) / 'load.db'}"
        rows = seed(db_url, a.seed_extra)
        port = free_port()
        if not a.cold_start:
            proc = start_server(db_url, port, a.workers, a.token)
        url = f"http://127.0.0.1:{port}"
    load_before = os.getloadavg()[0]
    try:
        if a.cold_start:
            res = _run_loop(cold_start(db_url, port, a.rate, a.duration, a.token))
        elif a.big_posts:
            res = _run_loop(big_posts(urlparse(url), a.big_posts, a.big_mb, proc.pid,
                                      a.token if a.big_with_token else None))
        else:
            rss0 = rss_kb(proc.pid) if proc is not None else None
            res = _run_loop(run_load(url, a.rate, a.duration, cold=a.cold, writes=a.writes, token=a.token,
                                     devices=a.devices, listers=a.listers))
            if rss0 is not None:
                res["server_rss_growth_mb"] = round((rss_kb(proc.pid) - rss0) / 1024, 1)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        if tmp is not None:
            tmp.cleanup()
    # Other work on the machine shows in the tail; the log entry says how busy it was.
    res["loadavg_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    res["seeded_rows"] = rows
    res["server_workers"] = a.workers if proc is not None else None
    print(json.dumps(res, indent=2))
    if a.append and not (a.cold_start or a.big_posts or a.writes or a.devices or a.listers):
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        import fastapi
        import uvicorn

        when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        entry = (
            f"\n### {when}, CPU ({platform.machine()}, {os.cpu_count()} cores, loopback), commit {commit}: "
            f"service load, GET /v1/configs/best\n"
            f"versions: Python {platform.python_version()}, fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__}, "
            f"SQLite (WAL)\n"
            f"command: python3 bench/load_service.py --rate {a.rate:g} --duration {a.duration:g}"
            f"{' --workers ' + str(a.workers) if a.workers != 1 else ''}{' --cold' if a.cold else ''}\n\n"
            f"| requests | target req/s | achieved req/s | p50 ms | p90 ms | p99 ms | max ms | errors |\n"
            f"|---:|---:|---:|---:|---:|---:|---:|---:|\n"
            f"| {res['requests']} | {a.rate:g} | {res['achieved_rate']} | {res['p50_ms']} | {res['p90_ms']} | "
            f"{res['p99_ms']} | {res['max_ms']} | {res['errors']} |\n\n"
            f"notes: open loop (latency from each request's due time), 32 keep-alive connections; "
            f"{res['cache']} answer cache; {rows} seeded measurements; 997 distinct shapes, answers "
            f"{res['provenance']}; client and server share the machine's cores; 1-min load average before/after "
            f"{res['loadavg_1min'][0]}/{res['loadavg_1min'][1]}.\n"
        )
        insert_entry(a.append, entry)
    ok = res.get("errors", 0) == 0 and res.get("writes", {}).get("errors", 0) == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
