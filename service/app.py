"""The REST API over the results database.

    from service.app import create_app
    app = create_app("sqlite:///results.db", token="...")   # or: fa4-serve --db URL

Nothing connects at import time: the store is opened on the first request that
needs it. Every error is a JSON object ``{"error": "...", "detail": [...]}``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Literal, Optional

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

import dashboards
from fa4.arch import ARCHES
from fa4.knobs import config_from_dict, knob_specs
from fa4.problem import Problem
from service import schemas as sch
from service.docs import mount_docs
from store.best import best_config, index_rows
from store import ResultsStore, canonical_json
from store.store import SORT_KEYS
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
        msg = str(e.get("msg", "invalid"))
        # The offending input is left out: it may be huge or not JSON-serialisable.
        detail.append({"loc": loc, "msg": msg, "type": str(e.get("type", ""))})
        parts.append(f"{'.'.join(loc) or 'request'}: {msg}")
    return "invalid request: " + "; ".join(parts[:5]) + (" ..." if len(parts) > 5 else ""), detail


class _State:
    """Per-app state: the lazily opened store, provider fingerprints and the answer cache."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._store: ResultsStore | None = None
        self._lock = threading.Lock()
        self._fingerprints: dict[str, str | None] = {}
        # Answers of /v1/configs/best as JSON bytes, valid for the database generation below.
        self._best: dict[tuple, bytes] = {}
        # The same answers by raw query string, for _BestFastPath (repeat queries skip validation).
        self._by_query: dict[bytes, bytes] = {}
        # Rows behind the answers, per (device, provider, family) and per device name: one
        # query serves every shape of a family until the database changes.
        self._family: dict[tuple, dict[Problem, list[dict]]] = {}
        self._devices: dict[str, dict | None] = {}
        self._generation: tuple | None = None
        self._epoch = 0
        self._checked_at = float("-inf")

    @property
    def store(self) -> ResultsStore:
        s = self._store
        if s is None:
            with self._lock:
                if self._store is None:
                    self._store = ResultsStore.open(self.settings.db_url)
                s = self._store
        return s

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def fingerprint(self, provider) -> str | None:
        name = provider.name
        if name not in self._fingerprints:
            try:
                self._fingerprints[name] = provider.source_fingerprint()
            except Exception:  # no source to read (e.g. a replay without recording)
                self._fingerprints[name] = None
        return self._fingerprints[name]

    def refresh_due(self) -> bool:
        return time.monotonic() >= self._checked_at + self.settings.best_cache_ttl_s

    def refresh(self) -> None:
        """Drop cached answers when the database gained rows since the last check."""
        gen = self.store.generation()
        if gen != self._generation:
            self._clear()
            self._generation = gen
        self._checked_at = time.monotonic()

    def invalidate(self) -> None:
        self._clear()
        self._checked_at = float("-inf")

    def _clear(self) -> None:
        self._epoch += 1
        self._best.clear()
        self._by_query.clear()
        self._family.clear()
        self._devices.clear()

    def answer(self, key: tuple, prov, device: str, problem: Problem, running: str | None,
               arch: str | None) -> bytes:
        """The JSON answer for ``key``, cached unless the database changed while it was built."""
        epoch = self._epoch
        fam = (device, prov.name, problem.pass_, problem.dtype, problem.head_dim, problem.head_dim_v,
               problem.causal, problem.deterministic)
        rows = self._family.get(fam)
        if rows is None:
            rows = index_rows(self.store.family_rows(device, prov.name, problem))
        device_row = self._devices[device] if device in self._devices else self.store.device_by_name(device)
        answer = best_config(self.store, prov, device, problem, running_fp=running,
                             arch=ARCHES[arch] if arch else None, rows=rows, device_row=device_row)
        body = json.dumps(answer, allow_nan=False).encode()
        # A change noticed meanwhile (a refresh or a write cleared the caches) makes these
        # rows possibly old: serve them this once, keep nothing.
        if epoch == self._epoch:
            self._family[fam] = rows
            self._devices[device] = device_row
            if len(self._best) >= self.settings.best_cache_size:
                self._best.clear()
            self._best[key] = body
        return body


class _BestFastPath:
    """Answers a repeated GET /v1/configs/best from the cache before routing and validation.

    Only query strings that the route itself answered with 200 since the last database
    change are in the cache, so this serves exactly what the route would; when a database
    check is due, the request goes to the route, which makes it.
    """

    PATH = f"/{API_VERSION}/configs/best"

    def __init__(self, app, state: _State):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == self.PATH and scope["method"] == "GET":
            body = self.state._by_query.get(scope["query_string"])
            if body is not None and not self.state.refresh_due():
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


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


def _problem(**fields) -> Problem:
    try:
        return Problem.from_dict(fields)
    except (ValueError, TypeError) as e:
        raise ApiError(422, f"invalid problem: {e}") from None


def _knob_classes(provider) -> dict[str, type | None]:
    """pass -> knob class; a provider may declare different knobs per pass."""
    out = {}
    for p in provider.passes:
        try:
            out[p] = provider.knob_cls_for(Problem.standard(1024, 128, pass_=p))
        except Exception:
            out[p] = None
    return out


def create_app(db_url: str | None = None, token: str | None = None, *, settings: Settings | None = None) -> FastAPI:
    """The service app. ``token`` (else ``$FA4_API_TOKEN``) guards writes; none configured: writes get 403."""
    settings = settings or Settings.from_env(db_url=db_url, token=token)
    state = _State(settings)

    @asynccontextmanager
    async def lifespan(_app):
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

    def require_writer(creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        if settings.token is None:
            raise ApiError(403, "writes are disabled: the service has no API token configured (set FA4_API_TOKEN)")
        if creds is None or creds.scheme.lower() != "bearer":
            raise ApiError(401, "missing bearer token (Authorization: Bearer <token>)",
                           headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(creds.credentials.encode(), settings.token.encode()):
            raise ApiError(401, "wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    # -- health -------------------------------------------------------------------------

    @app.get("/healthz", response_model=sch.Health, tags=["meta"],
             responses={503: {"model": sch.Error}})
    def healthz():
        from store.migrate import current_revision

        try:
            store = state.store
            store.ping()
            with store.engine.connect() as conn:
                rev = current_revision(conn)
        except Exception as e:
            return _error(503, f"database unavailable: {type(e).__name__}")
        return {"status": "ok", "database": store.url, "schema_revision": rev}

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
        batch: int = Query(1, **_SIZE),
        heads_q: Optional[int] = Query(None, description="default: 2048 // head_dim (at least 1)", **_SIZE),
        heads_kv: Optional[int] = Query(None, description="default: heads_q", **_SIZE),
        head_dim_v: Optional[int] = Query(None, description="default: head_dim", **_SIZE),
        causal: bool = False,
        deterministic: bool = False,
        source_fingerprint: Optional[str] = Query(
            None, max_length=128, pattern=r"^[^\x00]*$",
            description="Judge staleness against this kernel source (the caller's) instead of the service's own",
        ),
        arch: Optional[Literal[tuple(ARCHES)]] = Query(  # type: ignore[valid-type]
            None, description="Arch for feasibility checks; default: the device's, from the database"
        ),
    ):
        hq = heads_q or max(1, 2048 // head_dim)
        problem = _problem(
            batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k or seqlen_q, heads_q=hq, heads_kv=heads_kv or hq,
            head_dim=head_dim, head_dim_v=head_dim_v or head_dim, dtype=dtype, causal=causal,
            deterministic=deterministic, pass_=pass_,
        )
        prov = _provider(provider)
        errs = prov.problem_errors(problem)
        if errs:
            raise ApiError(422, f"{provider} cannot run this problem: {'; '.join(errs)}")
        running = source_fingerprint if source_fingerprint is not None else state.fingerprint(prov)
        key = (device, provider, problem, running, arch)
        if state.refresh_due():
            await run_in_threadpool(state.refresh)
        epoch = state._epoch
        body = state._best.get(key)
        if body is None:
            body = await run_in_threadpool(state.answer, key, prov, device, problem, running, arch)
        if epoch == state._epoch and len(state._by_query) < settings.best_cache_size:
            state._by_query[request.scope["query_string"]] = body
        # Served as cached bytes: the hot path skips re-validating an answer built from the schema.
        return Response(content=body, media_type="application/json")

    # -- catalogue ----------------------------------------------------------------------

    @app.get(f"/{API_VERSION}/devices", response_model=list[sch.Device], tags=["catalogue"])
    def get_devices():
        counts = state.store.device_counts()
        return [{**d, "n_results": counts.get(d["id"], 0)} for d in state.store.devices()]

    @app.get(f"/{API_VERSION}/providers", response_model=list[sch.Provider], tags=["catalogue"])
    def get_providers():
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
    def get_results(
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
        limit: int = Query(100, ge=1, le=MAX_PAGE),
        offset: int = Query(0, ge=0, le=sch.INT32_MAX),
        sort: Literal[SORTS] = Query("id", description="column; '-' prefix = descending; NULLs last"),  # type: ignore[valid-type]
    ):
        filters = dict(
            device=device, provider=provider, status=status, study_name=study_name,
            source_fingerprint=source_fingerprint, is_default=is_default, pass_=pass_, dtype=dtype,
            head_dim=head_dim, head_dim_v=head_dim_v, seqlen_q=seqlen_q, seqlen_k=seqlen_k, batch=batch,
            heads_q=heads_q, heads_kv=heads_kv, causal=causal, deterministic=deterministic,
        )
        store = state.store
        items = store.measurements(limit=limit, offset=offset, sort=sort, **filters)
        return {"total": store.count(**filters), "limit": limit, "offset": offset, "sort": sort, "items": items}

    @app.get(f"/{API_VERSION}/studies/{{study_name:path}}", response_model=sch.Study, tags=["results"],
             responses={404: {"model": sch.Error}})
    def get_study(study_name: str = Path(..., max_length=255, pattern=r"^[^\x00]*$")):
        rows = state.store.measurements(study_name=study_name, sort="trial_number")
        if not rows:
            raise ApiError(404, f"no measurements recorded for study {study_name!r}")
        trials = [{
            "trial_number": r["trial_number"], "measurement_id": r["id"], "status": r["status"],
            "reason": r["reason"], "config": r["config"], "tflops": r["tflops"], "median_ms": r["median_ms"],
            "error": r["error"], "is_default": r["is_default"], "created_at": r["created_at"],
        } for r in rows]
        ok = [t for t in trials if t["status"] == "ok" and t["tflops"] is not None]
        best = max(ok, key=lambda t: (t["tflops"], -t["measurement_id"])) if ok else None
        first = rows[0]
        return {
            "study_name": study_name, "device": first["device"], "provider": first["provider"],
            "problem": first["problem"], "n_trials": len(trials), "n_ok": len(ok), "best": best, "trials": trials,
        }

    @app.post(f"/{API_VERSION}/results", response_model=sch.ResultCreated, status_code=201, tags=["results"],
              responses={200: {"model": sch.ResultCreated, "description": "a retry: already stored"},
                         401: {"model": sch.Error}, 403: {"model": sch.Error}},
              dependencies=[Depends(require_writer)])
    def post_result(
        body: sch.ResultIn,
        idempotency_key: Optional[str] = Header(None, min_length=1, max_length=64, pattern=r"^[^\x00]*$"),
    ):
        prov = _provider(body.provider, status=422)
        problem = _problem(**body.problem.to_problem_dict())
        errs = prov.problem_errors(problem)
        if errs:
            raise ApiError(422, f"{body.provider} cannot run this problem: {'; '.join(errs)}")
        knob_cls = prov.knob_cls_for(problem)
        if knob_cls is None and body.config:
            raise ApiError(422, f"{body.provider} has no knobs for the {problem.pass_} pass; config must be empty")
        if knob_cls is not None:
            try:
                config_from_dict(knob_cls, body.config or {})
            except (ValueError, TypeError) as e:
                raise ApiError(422, f"invalid config for {body.provider} ({problem.pass_}): {e}") from None
        if body.status == "ok" and (body.median_ms is None or body.tflops is None):
            raise ApiError(422, "an 'ok' measurement needs median_ms and tflops")

        payload = body.model_dump(mode="json", by_alias=True, exclude={"idempotency_key"})
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
        state.invalidate()
        return JSONResponse(status_code=201 if created else 200,
                            content={"id": mid, "created": created, "idempotency_key": key})

    dashboards.mount(app)  # the web dashboard at / (reads only the routes above)
    return app


def app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory service.app:app_from_env``: database from $FA4_DB, token from $FA4_API_TOKEN."""
    return create_app()
