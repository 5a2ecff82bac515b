"""The REST API over the results database.

    from service.app import create_app
    app = create_app("sqlite:///results.db", token="...")   # or: fa4-serve --db URL

Nothing connects at import time: the store is opened on the first request that
needs it. Every error is a JSON object ``{"error": "...", "detail": [...]}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import hmac
import json
import sys
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Any, Literal, Optional

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

import dashboards
from fa4.arch import ARCHES
from fa4.decode_problem import DecodeProblem
from fa4.knobs import config_from_dict, knob_specs
from fa4.problem import Problem
from fa4.timing import ALL as ALL_TIMINGS, DEFAULT_TIMING
from service import schemas as sch
from service.docs import mount_docs
from service import listing
from service.cache import Invalidations, SingleFlight, TaggedLRU
from service.listing import Listings
from store.best import best_config, index_rows
from store import ResultsStore, canonical_json
from store.store import KINDS, SORT_KEYS, family_key, problem_fields
from service.settings import Settings

API_VERSION = "v1"
MAX_PAGE = 1000
SORTS = tuple(sorted(SORT_KEYS)) + tuple("-" + k for k in sorted(SORT_KEYS))

# Free-text query parameters: bounded, and no NUL (PostgreSQL cannot compare against it).
_TEXT = dict(max_length=255, pattern=r"^[^\x00]*$")
_SIZE = dict(gt=0, le=sch.INT32_MAX)


class ApiError(HTTPException):
    """An expected failure with a message meant for the client."""


def _error(status: int, message: str, detail: list | None = None, headers: dict | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": message}
    if detail is not None:
        body["detail"] = detail
    return JSONResponse(status_code=status, content=body, headers=headers)


def _validation_detail(errors) -> tuple[str, list[dict]]:
    detail, parts = [], []
    for e in errors:
        loc = [str(x) for x in e.get("loc", ())]
        # A posted problem's kind tag (schemas.AnyProblemIn) is not a key of the JSON sent.
        loc = [x for i, x in enumerate(loc) if not (i and loc[i - 1] == "problem" and x in sch.PROBLEM_KINDS)]
        msg = str(e.get("msg", "invalid"))
        # The offending input is left out: it may be huge or not JSON-serialisable.
        detail.append({"loc": loc, "msg": msg, "type": str(e.get("type", ""))})
        parts.append(f"{'.'.join(loc) or 'request'}: {msg}")
    return "invalid request: " + "; ".join(parts[:5]) + (" ..." if len(parts) > 5 else ""), detail


class _State:
    """Per-app state: the store, provider fingerprints, the known devices and the answer caches.

    Cached answers are tagged with their problem family and device (see ``service.cache``): a
    write drops those two tags only, and a rebuild is made once however many requests want it.
    Everything that can block (opening the store, fingerprints, provider imports, queries) runs
    in the thread pool or in ``warm()`` before the server accepts connections; the event loop
    only looks things up.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self._store: ResultsStore | None = None
        self._lock = threading.Lock()
        # Keyed by registered provider names only (_provider refuses any other).
        self._fingerprints: dict[str, str | None] = {}
        self.inv = Invalidations()
        # Answers of /v1/configs/best and /v1/configs/best-decode as JSON bytes, by validated key
        # and by (path, raw query string) (for _BestFastPath: repeat queries skip validation).
        # Both are bounded: a client can vary a query string without end.
        self._best = TaggedLRU(settings.best_cache_size, self.inv)
        self._by_query = TaggedLRU(settings.best_cache_size, self.inv)
        # The rows behind the answers, per (device, provider, *FAMILY_FIELDS): one query serves
        # every shape of a family until a write to that family.
        self._family = TaggedLRU(settings.family_cache_size, self.inv)
        self._flights = SingleFlight(self.inv)
        # Every device row, by id and (newest row) by name: as many as the database holds, so a
        # lookup for a name nobody measured costs no query and no memory.
        self._devices_by_id: dict[int, dict] = {}
        self._devices_by_name: dict[str, dict] = {}
        self._generation: tuple[int, int, int] | None = None
        self._checked_at = float("-inf")
        self._writes = 0  # writes through this app; a refresh records how many it has seen
        self._refresh_task: asyncio.Task | None = None
        self._refresh_task_seen = 0
        self._refresh_seen = 0
        self.schema_revision: str | None = None
        # Pages of up to MAX_PAGE rows, one at a time, off the event loop's GIL when served.
        self.listings = Listings(settings.db_url, lambda: self.store, process=settings.tune_process)

    @property
    def store(self) -> ResultsStore:
        s = self._store
        if s is None:
            with self._lock:
                if self._store is None:
                    self._store = ResultsStore.open(self.settings.db_url)
                    from store.migrate import current_revision

                    with self._store.engine.connect() as conn:
                        self.schema_revision = current_revision(conn)
                s = self._store
        return s

    def close(self) -> None:
        self.listings.close()
        if self._store is not None:
            self._store.close()
            self._store = None

    def warm(self) -> None:
        """Blocking start-up work, done before the server accepts requests (see lifespan).

        Fingerprinting flash-attn-4 imports the reference package (seconds); done on the first
        lookup, it blocked the event loop and made every client's 0.5 s lookup time out.
        """
        from providers import list_providers

        _ = self.store
        for name in list_providers():
            try:
                prov = _provider(name)
                _knob_classes(prov)
            except Exception:  # reported by /v1/providers; lookups for it answer 404/422
                continue
            self._fingerprint_now(prov)

    def _fingerprint_now(self, provider) -> str | None:
        try:
            fp = provider.source_fingerprint()
        except Exception:  # no source to read (e.g. a replay without recording)
            fp = None
        self._fingerprints[provider.name] = fp
        return fp

    def fingerprint(self, provider) -> str | None:
        """For threads (listings): computes a missing one in place."""
        if provider.name in self._fingerprints:
            return self._fingerprints[provider.name]
        return self._fingerprint_now(provider)

    async def fingerprint_async(self, provider) -> str | None:
        if provider.name in self._fingerprints:
            return self._fingerprints[provider.name]

        async def build(_since):
            return await run_in_threadpool(self._fingerprint_now, provider)

        return await self._flights.run(("fingerprint", provider.name), (), build)

    # -- freshness ------------------------------------------------------------------------

    def refresh_due(self) -> bool:
        return time.monotonic() >= self._checked_at + self.settings.best_cache_ttl_s

    def _read_changes(self, generation):
        store = self.store
        if generation is None:
            gen, families, names = store.generation(), set(), set()
        else:
            gen, families, names = store.changes_since(generation)
        devices = store.devices() if generation is None or names else None
        return gen, families, names, devices

    async def _refresh_once(self) -> None:
        seen = self._writes
        gen, families, names, devices = await run_in_threadpool(self._read_changes, self._generation)
        if devices is not None:
            self._devices_by_id = {d["id"]: d for d in devices}
            # Ids ascend: the last row of a name is its newest software stack.
            self._devices_by_name = {d["name"]: d for d in devices}
        for f in families:
            self.inv.drop(("family", f))
        for n in names:
            self.inv.drop(("device", n))
        self._generation = gen
        self._checked_at = time.monotonic()
        self._refresh_seen = max(self._refresh_seen, seen)

    async def refresh(self, after_write: int | None = None) -> None:
        """Bring the caches up to the database: drop what changed since the last check.

        One check runs at a time and concurrent callers share it. ``after_write``: the check must
        have started after this write through the service (its own answer must show it).
        """
        while True:
            task = self._refresh_task
            if task is not None and not task.done():
                if after_write is None or self._refresh_task_seen >= after_write:
                    return await asyncio.shield(task)
                await asyncio.wait([task])  # it started before our write: wait, then check again
                continue
            if after_write is None and not self.refresh_due() and self._generation is not None:
                return
            if after_write is not None and self._refresh_seen >= after_write:
                return
            task = asyncio.ensure_future(self._refresh_once())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._refresh_task, self._refresh_task_seen = task, self._writes
            return await asyncio.shield(task)

    async def after_write(self) -> None:
        self._writes += 1
        await self.refresh(after_write=self._writes)

    # -- answers --------------------------------------------------------------------------

    @staticmethod
    def family_of(device: str, provider: str, problem: Problem | DecodeProblem) -> tuple:
        """The cache tag of ``problem``'s family: as ``ResultsStore.changes_since`` names a written one."""
        return (device, provider, *family_key(problem))

    def _read_family(self, device: str, provider: str, problem: Problem | DecodeProblem,
                     known: dict) -> tuple[dict, list[dict]]:
        """(rows by problem, device rows they name that ``known`` lacks); in the thread pool."""
        # Samples are dropped: answers report n_samples only, and a family may hold thousands of rows.
        rows = [{**r, "samples_ms": None} for r in self.store.family_rows(device, provider, problem)]
        # Device rows never change; one added after the last refresh is read here, with the rows.
        missing = {r["device_id"] for r in rows} - set(known)
        return index_rows(rows), [d for d in map(self.store.get_device, sorted(missing)) if d is not None]

    async def _family_rows(self, fam: tuple, device: str, prov, problem: Problem | DecodeProblem) -> dict:
        rows = self._family.get(fam)
        if rows is not None:
            return rows
        if device not in self._devices_by_name:
            return {}  # nothing was measured on a device the database does not know
        tags = (("family", fam), ("device", device))

        async def build(since):
            rows, devices = await run_in_threadpool(self._read_family, device, prov.name, problem,
                                                    self._devices_by_id)
            for d in devices:
                self._devices_by_id[d["id"]] = d
            self._family.put(fam, rows, tags, since)
            return rows

        return await self._flights.run(("family", fam), tags, build)

    async def answer(self, key: tuple, prov, device: str, problem: Problem | DecodeProblem, running: str | None,
                     arch: str | None, timing: str = DEFAULT_TIMING) -> tuple[bytes, tuple, int]:
        """(JSON answer, its tags, the generation it was built at), built once for concurrent askers:
        the one answer path of both config endpoints (attention and decode problems)."""
        cached = self._best.get(key)
        if cached is not None:
            return cached
        fam = self.family_of(device, prov.name, problem)
        tags = (("family", fam), ("device", device))

        async def build(since):
            rows = await self._family_rows(fam, device, prov, problem)
            # In memory only, ~0.1-0.2 ms: cheaper here than the GIL hand-offs of a thread hop.
            answer = best_config(self.store, prov, device, problem, running_fp=running,
                                 arch=ARCHES[arch] if arch else None, rows=rows,
                                 device_row=self._devices_by_name.get(device), get_device=self._devices_by_id.get,
                                 timing=timing)
            entry = (json.dumps(answer, allow_nan=False).encode(), tags, since)
            # Kept only if no write touched its family or device meanwhile (else: served this once).
            self._best.put(key, entry, tags, since)
            return entry

        return await self._flights.run(("answer", key), tags, build)

    async def listing(self, fn, *args) -> Response:
        """A listing (see service.listing) as a JSON response."""
        return Response(content=await self.listings.run(fn, *args), media_type="application/json")


def _route_path(scope) -> str:
    """The path the router matches: without the prefix of a mount or proxy (root_path)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class _BestFastPath:
    """Answers a repeated GET /v1/configs/best (or /best-decode) from the cache before routing and validation.

    Only query strings that the route itself answered with 200 since the last change of their
    family or device are in the cache, so this serves exactly what the route would; when a
    database check is due, the request goes to the route, which makes it.
    """

    PATHS = (f"/{API_VERSION}/configs/best", f"/{API_VERSION}/configs/best-decode")

    def __init__(self, app, state: _State):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        path = _route_path(scope) if scope["type"] == "http" and scope["method"] == "GET" else None
        if path in self.PATHS:
            body = self.state._by_query.get((path, scope["query_string"]))
            if body is not None and not self.state.refresh_due():
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class _BodyGuard:
    """Refuses a request body before anyone reads it: writes without a valid token, oversized bodies.

    FastAPI reads and parses the whole body before it runs a route's dependencies, so the token
    check of ``require_writer`` alone came after parsing 60 MB of JSON from anyone. Here the
    writer check runs on the headers (the same rule as the dependency), a declared length over
    the limit is a 413 at once, and an undeclared (chunked) body is counted as it arrives.
    """

    def __init__(self, app, limit: int, writer_error, writer_routes):
        self.app = app
        self.limit = limit
        self.writer_error = writer_error
        self.writer_routes = writer_routes  # [(path regex, methods)] of the routes needing the token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope["headers"]}
        path = _route_path(scope)
        if any(methods and scope["method"] in methods and rx.match(path)
               for rx, methods in self.writer_routes()):
            auth = headers.get(b"authorization")
            err = self.writer_error(None if auth is None else auth.decode("latin-1"))
            if err is not None:
                return await _error(err.status_code, str(err.detail), headers=err.headers)(scope, receive, send)
        too_large = ApiError(413, f"request body too large: the limit is {self.limit} bytes")
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                return await _error(400, "invalid Content-Length header")(scope, receive, send)
            if n > self.limit:
                return await _error(413, str(too_large.detail))(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Raised inside the route's body read: FastAPI passes an HTTPException on.
                    raise too_large
            return message

        await self.app(scope, counted, send)


def _provider(name: str, status: int = 404):
    from providers import ProviderError, get_provider, list_providers

    # Only registered names: the "module:attr" form of the registry would import
    # arbitrary code on behalf of a remote client.
    if name not in list_providers():
        raise ApiError(status, f"unknown provider {name!r} (known: {', '.join(list_providers())})")
    try:
        return get_provider(name)
    except (ProviderError, ImportError) as e:
        raise ApiError(status, f"provider {name!r} cannot be loaded here: {e}") from None


@contextmanager
def _invalid_problem():
    try:
        yield
    except (ValueError, TypeError) as e:
        raise ApiError(422, f"invalid problem: {e}") from None


def _check_problem(prov, problem: Problem | DecodeProblem) -> None:
    """422 when ``prov`` cannot run ``problem`` (a decode problem needs a provider of the decode pass)."""
    if isinstance(problem, DecodeProblem) and "decode" not in prov.passes:
        raise ApiError(422, f"{prov.name} cannot run this problem: it does not tune decode problems "
                            "(the decode provider is fa4-decode)")
    errs = prov.problem_errors(problem)
    if errs:
        raise ApiError(422, f"{prov.name} cannot run this problem: {'; '.join(errs)}")


def _problem(**fields) -> Problem:
    with _invalid_problem():
        return Problem.from_dict(fields)


# A problem of each pass that no attention Problem has: the decode provider's ("decode").
_PASS_SAMPLES = {"decode": DecodeProblem(batch=1, seqlen_q=1, seqlen_k=4096, heads_q=32, heads_kv=8, head_dim=128)}


def _knob_classes(provider) -> dict[str, type | None]:
    """pass -> knob class; a provider may declare different knobs per pass."""
    out = {}
    for p in provider.passes:
        try:
            out[p] = provider.knob_cls_for(_PASS_SAMPLES.get(p) or Problem.standard(1024, 128, pass_=p))
        except Exception:
            out[p] = None
    return out


def create_app(db_url: str | None = None, token: str | None = None, *, settings: Settings | None = None) -> FastAPI:
    """The service app. ``token`` (else ``$FA4_API_TOKEN``) guards writes; none configured: writes get 403."""
    settings = settings or Settings.from_env(db_url=db_url, token=token)
    state = _State(settings)

    @asynccontextmanager
    async def lifespan(_app):
        # uvicorn binds its socket after this returns: no request waits behind the warm-up.
        await run_in_threadpool(state.warm)
        await state.refresh()
        if settings.tune_process:
            gc.collect()
            gc.freeze()
            sys.setswitchinterval(0.0005)
        yield
        state.close()

    app = FastAPI(
        lifespan=lifespan,
        title="fa4-tune results service",
        version="1",
        description="Tuned attention-kernel configs and their measurements. Knob schemas are derived from the "
        "providers' knob dataclasses (GET /v1/providers/{name}/knobs).",
        responses={422: {"model": sch.Error}},
        docs_url=None,  # served from vendored assets below (service.docs): no CDN
        redoc_url=None,
    )
    mount_docs(app)
    app.state.fa4 = state
    app.add_middleware(_BestFastPath, state=state)
    writer_routes: list[tuple] = []
    app.add_middleware(_BodyGuard, limit=sch.MAX_BODY_BYTES, writer_error=lambda auth: writer_error(auth),
                       writer_routes=lambda: writer_routes)
    bearer = HTTPBearer(auto_error=False, description="The service's API token (FA4_API_TOKEN)")

    @app.exception_handler(ApiError)
    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        return _error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, detail = _validation_detail(exc.errors())
        return _error(422, message, detail)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        # A bug, or the database went away: still JSON, and without a traceback for the client.
        return _error(500, f"internal error ({type(exc).__name__}); see the service log")

    def writer_error(authorization: str | None) -> ApiError | None:
        """Why a request with this Authorization header may not write, or None.

        The one rule for writes, applied to the headers by _BodyGuard before any body is read
        and by ``require_writer`` (which also gives the OpenAPI security scheme).
        """
        if settings.token is None:
            return ApiError(403, "writes are disabled: the service has no API token configured (set FA4_API_TOKEN)")
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:
            return ApiError(401, "missing bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(credentials.encode(), settings.token.encode()):
            return ApiError(401, "wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        return None

    def require_writer(request: Request, _creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        err = writer_error(request.headers.get("authorization"))
        if err is not None:
            raise err

    # -- health -------------------------------------------------------------------------

    @app.get("/healthz", response_model=sch.Health, tags=["meta"],
             responses={503: {"model": sch.Error}})
    async def healthz():
        # On the loop but for the ping: milliseconds even while lookups or listings are busy.
        try:
            store = await run_in_threadpool(lambda: state.store)
            await run_in_threadpool(store.ping)
        except Exception as e:
            return _error(503, f"database unavailable: {type(e).__name__}")
        return {"status": "ok", "database": store.url, "schema_revision": state.schema_revision}

    # -- configs ------------------------------------------------------------------------

    @app.get(f"/{API_VERSION}/configs/best", response_model=sch.BestConfig, tags=["configs"],
             responses={404: {"model": sch.Error}})
    async def get_best(
        request: Request,
        device: str = Query(..., min_length=1, description="GPU name, e.g. 'NVIDIA H200'", examples=["NVIDIA H200"],
                            **_TEXT),
        provider: str = Query("fa4", min_length=1, max_length=64, pattern=r"^[^\x00]*$", examples=["fa4"]),
        pass_: sch.Pass = Query("fwd", alias="pass"),
        dtype: sch.Dtype = Query("bf16"),
        head_dim: int = Query(..., examples=[128], **_SIZE),
        seqlen_q: int = Query(..., examples=[4096], **_SIZE),
        seqlen_k: Optional[int] = Query(None, description="default: seqlen_q", **_SIZE),
        batch: Optional[int] = Query(None, description="default: 16384 // seqlen_q (at least 1), as fa4-tune",
                                     **_SIZE),
        heads_q: Optional[int] = Query(None, description="default: 2048 // head_dim (at least 1)", **_SIZE),
        heads_kv: Optional[int] = Query(None, description="default: heads_q", **_SIZE),
        head_dim_v: Optional[int] = Query(None, description="default: head_dim", **_SIZE),
        causal: bool = False,
        deterministic: bool = False,
        window_left: int = Query(-1, ge=-1, le=sch.INT32_MAX, description="sliding window, keys left; -1: unbounded"),
        window_right: int = Query(-1, ge=-1, le=sch.INT32_MAX, description="sliding window, keys right; -1: unbounded"),
        softcap: float = Query(0.0, ge=0, allow_inf_nan=False, description="score softcap; 0: off"),
        sink: bool = Query(False, description="learnable attention sinks"),
        source_fingerprint: Optional[str] = Query(
            None, max_length=128, pattern=r"^[^\x00]*$",
            description="Judge staleness against this kernel source (the caller's) instead of the service's own",
        ),
        arch: Optional[Literal[tuple(ARCHES)]] = Query(  # type: ignore[valid-type]
            None, description="Arch for feasibility checks; default: the device's, from the database"
        ),
        timing: sch.TimingName = Query(
            DEFAULT_TIMING, description="The timing mode the caller runs in; answered from measurements of this "
            "mode only (a caller under CUDA graphs asks graph-cold or graph-warm). " + sch.TIMING_DOC),
    ):
        # Omitted sizes follow the benchmark convention fa4-tune uses (Problem.standard).
        with _invalid_problem():
            problem = Problem.standard(
                seqlen_q, head_dim, batch=batch, seqlen_k=seqlen_k, heads_q=heads_q, heads_kv=heads_kv,
                head_dim_v=head_dim_v, dtype=dtype, causal=causal, deterministic=deterministic, pass_=pass_,
                window_left=window_left, window_right=window_right, softcap=softcap, sink=sink,
            )
        return await serve_best(request, device, provider, problem, source_fingerprint, arch, timing)

    @app.get(f"/{API_VERSION}/configs/best-decode", response_model=sch.BestConfig, tags=["configs"],
             responses={404: {"model": sch.Error}})
    async def get_best_decode(request: Request, query: Annotated[sch.DecodeConfigQuery, Query()]):
        """The config to use for a decode step (fa4.flash_attn_with_kvcache; provider fa4-decode), as
        GET /v1/configs/best answers for attention: its exact shape measured from the running kernel
        source (provenance exact), else the provider's heuristic (default). Its parameters are the
        fields of fa4.decode_problem.DecodeProblem."""
        with _invalid_problem():
            problem = query.to_problem()
        return await serve_best(request, query.device, query.provider, problem, query.source_fingerprint,
                                query.arch, query.timing)

    async def serve_best(request: Request, device: str, provider: str, problem: Problem | DecodeProblem,
                         source_fingerprint: str | None, arch: str | None, timing: str) -> Response:
        """The answer of both config endpoints: one cache, one rule (store.best.best_config)."""
        prov = _provider(provider)
        _check_problem(prov, problem)
        running = source_fingerprint if source_fingerprint is not None else await state.fingerprint_async(prov)
        key = (device, provider, problem, running, arch, timing)
        if state.refresh_due():
            await state.refresh()
        body, tags, since = await state.answer(key, prov, device, problem, running, arch, timing)
        state._by_query.put((_route_path(request.scope), request.scope["query_string"]), body, tags, since)
        # Served as cached bytes: the hot path skips re-validating an answer built from the schema.
        return Response(content=body, media_type="application/json")

    # -- catalogue ----------------------------------------------------------------------

    @app.get(f"/{API_VERSION}/timings", response_model=list[sch.TimingMode], tags=["catalogue"])
    async def get_timings():
        """The timing modes a measurement can be taken in (fa4.timing), the default first."""
        return [t.to_dict() for t in ALL_TIMINGS]

    @app.get(f"/{API_VERSION}/problem-fields", response_model=list[sch.ProblemField], tags=["catalogue"])
    async def get_problem_fields():
        """The problem fields a study family is made of (the results store's), with their defaults:
        the dashboard's problem filters."""
        return problem_fields()

    @app.get(f"/{API_VERSION}/devices", response_model=list[sch.Device], tags=["catalogue"])
    async def get_devices():
        return await state.listing(listing.devices)

    @app.get(f"/{API_VERSION}/providers", response_model=list[sch.Provider], tags=["catalogue"])
    async def get_providers():
        body = await run_in_threadpool(lambda: listing.encode(providers_listing()))
        return Response(content=body, media_type="application/json")

    def providers_listing():
        from providers import list_providers

        counts = state.store.provider_counts()
        out = []
        for name in list_providers():
            try:
                prov = _provider(name)
                why = prov.available()
            except ApiError as e:
                out.append({"name": name, "available": False, "unavailable_reason": str(e.detail), "passes": [],
                            "source_fingerprint": None, "knob_classes": {}, "n_results": counts.get(name, 0)})
                continue
            out.append({
                "name": name,
                "available": why is None,
                "unavailable_reason": why,
                "passes": list(prov.passes),
                "source_fingerprint": state.fingerprint(prov),
                "knob_classes": {p: (c.__name__ if c else None) for p, c in _knob_classes(prov).items()},
                "n_results": counts.get(name, 0),
            })
        return out

    @app.get(f"/{API_VERSION}/providers/{{name}}/knobs", response_model=sch.ProviderKnobs, tags=["catalogue"],
             responses={404: {"model": sch.Error}})
    def get_knobs(name: str = Path(..., max_length=64, pattern=r"^[^\x00]*$")):
        prov = _provider(name)
        passes = {}
        for p, cls in _knob_classes(prov).items():
            if cls is None:
                passes[p] = {"knob_class": None, "knobs": [], "json_schema": None}
                continue
            passes[p] = {
                "knob_class": cls.__name__,
                "knobs": [s.to_json() for s in knob_specs(cls)],
                "json_schema": sch.knob_model(cls).model_json_schema(),
            }
        return {"provider": name, "passes": passes}

    # -- results ------------------------------------------------------------------------

    @app.get(f"/{API_VERSION}/results", response_model=sch.ResultsPage, tags=["results"])
    async def get_results(
        device: Optional[str] = Query(None, **_TEXT),
        provider: Optional[str] = Query(None, max_length=64, pattern=r"^[^\x00]*$"),
        status: Optional[sch.Status] = None,
        study_name: Optional[str] = Query(None, **_TEXT),
        source_fingerprint: Optional[str] = Query(None, max_length=128, pattern=r"^[^\x00]*$"),
        is_default: Optional[bool] = None,
        pass_: Optional[sch.Pass] = Query(None, alias="pass"),
        dtype: Optional[sch.Dtype] = None,
        head_dim: Optional[int] = Query(None, **_SIZE),
        head_dim_v: Optional[int] = Query(None, **_SIZE),
        seqlen_q: Optional[int] = Query(None, **_SIZE),
        seqlen_k: Optional[int] = Query(None, **_SIZE),
        batch: Optional[int] = Query(None, **_SIZE),
        heads_q: Optional[int] = Query(None, **_SIZE),
        heads_kv: Optional[int] = Query(None, **_SIZE),
        causal: Optional[bool] = None,
        deterministic: Optional[bool] = None,
        window_left: Optional[int] = Query(None, ge=-1, le=sch.INT32_MAX),
        window_right: Optional[int] = Query(None, ge=-1, le=sch.INT32_MAX),
        softcap: Optional[float] = Query(None, ge=0, allow_inf_nan=False),
        sink: Optional[bool] = None,
        kind: Optional[Literal[KINDS]] = Query(  # type: ignore[valid-type]
            None, description="attention or decode problems only (default: both); a decode row keeps the "
            "attention-only columns at their defaults, so the other filters alone do not tell them apart"),
        timing: Optional[sch.TimingName] = Query(None, description="only rows timed in this mode (default: any). "
                                                 + sch.TIMING_DOC),
        limit: int = Query(100, ge=1, le=MAX_PAGE),
        offset: int = Query(0, ge=0, le=sch.INT32_MAX),
        sort: Literal[SORTS] = Query("id", description="column; '-' prefix = descending; NULLs last"),  # type: ignore[valid-type]
    ):
        filters = dict(
            device=device, provider=provider, status=status, study_name=study_name,
            source_fingerprint=source_fingerprint, is_default=is_default, pass_=pass_, dtype=dtype,
            head_dim=head_dim, head_dim_v=head_dim_v, seqlen_q=seqlen_q, seqlen_k=seqlen_k, batch=batch,
            heads_q=heads_q, heads_kv=heads_kv, causal=causal, deterministic=deterministic, timing=timing,
            window_left=window_left, window_right=window_right, softcap=softcap, sink=sink, kind=kind,
        )
        return await state.listing(listing.results_page, limit, offset, sort, filters)

    @app.get(f"/{API_VERSION}/verdicts", response_model=list[sch.VerdictListed], tags=["results"])
    async def get_verdicts(
        device: Optional[str] = Query(None, description="GPU name (default: any)", **_TEXT),
        provider: Optional[str] = Query(None, max_length=64, pattern=r"^[^\x00]*$", description="default: any"),
        timing: Optional[sch.TimingName] = Query(None, description="only verdicts of this mode (default: any). "
                                                 + sch.TIMING_DOC),
        study_name: Optional[str] = Query(None, description="only verdicts of this study", **_TEXT),
    ):
        """The confidence behind served configs: for each (device, problem, provider, timing mode), its
        newest verdict (a study's top configs re-measured against the default, interleaved over rounds).

        A significant verdict serves its challenger (gain over the default beyond the spread of the
        rounds); otherwise the default stays, whatever the study's best trial measured.
        """
        filters = dict(device=device, provider=provider, timing=timing, study_name=study_name)
        return await state.listing(listing.verdicts, filters)

    @app.get(f"/{API_VERSION}/studies/{{study_name:path}}", response_model=sch.Study, tags=["results"],
             responses={404: {"model": sch.Error}})
    async def get_study(study_name: str = Path(..., max_length=255, pattern=r"^[^\x00]*$")):
        body = await state.listings.run(listing.study, study_name)
        if body is None:
            raise ApiError(404, f"no measurements recorded for study {study_name!r}")
        return Response(content=body, media_type="application/json")

    @app.post(f"/{API_VERSION}/results", response_model=sch.ResultCreated, status_code=201, tags=["results"],
              responses={200: {"model": sch.ResultCreated, "description": "a retry: already stored"},
                         401: {"model": sch.Error}, 403: {"model": sch.Error}},
              dependencies=[Depends(require_writer)])
    async def post_result(
        body: sch.ResultIn,
        idempotency_key: Optional[str] = Header(None, min_length=1, max_length=64, pattern=r"^[^\x00]*$"),
    ):
        mid, created, key = await run_in_threadpool(store_result, body, idempotency_key)
        if created:
            # The writer's next lookup must see its row: only its family (and device) are rebuilt.
            await state.after_write()
        return JSONResponse(status_code=201 if created else 200,
                            content={"id": mid, "created": created, "idempotency_key": key})

    def store_result(body: sch.ResultIn, idempotency_key: str | None) -> tuple[int, bool, str]:
        prov = _provider(body.provider, status=422)
        if isinstance(body.problem, sch.DecodeProblemIn):
            with _invalid_problem():
                problem = body.problem.to_problem()
        else:
            problem = _problem(**body.problem.to_problem_dict())
        _check_problem(prov, problem)
        knob_cls = prov.knob_cls_for(problem)
        pass_ = "decode" if isinstance(problem, DecodeProblem) else problem.pass_
        if knob_cls is None and body.config:
            raise ApiError(422, f"{body.provider} has no knobs for the {pass_} pass; config must be empty")
        if knob_cls is not None:
            try:
                config_from_dict(knob_cls, body.config or {})
            except (ValueError, TypeError) as e:
                raise ApiError(422, f"invalid config for {body.provider} ({pass_}): {e}") from None
        if body.status == "ok" and (body.median_ms is None or body.tflops is None):
            raise ApiError(422, "an 'ok' measurement needs median_ms and tflops")

        # The default mode is left out of the hash: a payload from before timing modes keeps its key.
        payload = body.model_dump(mode="json", by_alias=True, exclude={"idempotency_key"}
                                  | ({"timing"} if body.timing == DEFAULT_TIMING else set()))
        key = idempotency_key or body.idempotency_key or hashlib.sha256(canonical_json(payload).encode()).hexdigest()
        store = state.store
        fields = body.model_dump(exclude={"device", "provider", "problem", "config", "idempotency_key"})
        try:
            dev = store.upsert_device(body.device.model_dump())
            pid = store.upsert_problem(problem)
            cid = store.upsert_config(body.provider, body.config if knob_cls or body.config else None, knob_cls)
            mid, created = store.add_measurement_once(key, dev, pid, cid, **fields)
        except (ValueError, TypeError) as e:
            raise ApiError(422, f"invalid result: {e}") from None
        return mid, created, key

    # The routes whose token _BodyGuard checks before their body is read: those requiring a writer.
    writer_routes.extend(
        (r.path_regex, r.methods) for r in app.routes
        if isinstance(r, APIRoute) and any(d.call is require_writer for d in r.dependant.dependencies)
    )
    dashboards.mount(app)  # the web dashboard at / (reads only the routes above)
    return app


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory service.app:app_from_env``: database from $FA4_DB, token from $FA4_API_TOKEN."""
    return create_app(settings=dataclasses.replace(Settings.from_env(), tune_process=True))
