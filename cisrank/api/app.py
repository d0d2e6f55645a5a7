"""The FastAPI app factory. Routes are thin: validate, call the engine, map errors to status codes.

`create_app(config)` loads the configured rerankers (and indexes) in a background thread once the
server has started, so `/healthz` answers at once and `/readyz` turns ready when the models are
in. Tests and embedders can pass ready-made `rerankers=` and `retrievers=` instead.

Status codes: 400 malformed body, 401 missing/wrong API key, 404 unknown path, 413 body over
`max_body_bytes`, 422 a field out of its limits (the body names it), 503 + Retry-After while
loading, when the queue is full or a request timed out. Bugs are 500 and logged, never raised
into the server.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cisrank import env
from cisrank.api.auth import KeyChecker, keys_from_env
from cisrank.api.batching import BatchScorer, QueueFullError, ScoringTimeout
from cisrank.api.config import RerankerSpec, ServerConfig
from cisrank.api.metrics import Metrics
from cisrank.api.schemas import (
    DocumentIn,
    ErrorBody,
    FieldError,
    Health,
    IndexCard,
    ModelCard,
    ModelList,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    SearchRequest,
    SearchResponse,
    SearchResult,
    Usage,
)
from cisrank.api.truncate import find_tokenizer, truncate_texts
from cisrank.data.types import rank_order
from cisrank.errors import CisrankError
from cisrank.rerank.base import Reranker
from cisrank.retrieval.base import Retriever

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered with `status` and an `ErrorBody`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        field_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = (
            [FieldError(field=field, message=field_message or message, type=code)] if field else []
        )
        self.headers = headers or {}


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(
        422, "invalid_request", f"{field}: {message}", field=field, field_message=message
    )


def _error_response(
    status: int,
    code: str,
    message: str,
    fields: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(error=code, message=message, fields=fields or [])
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


# --------------------------------------------------------------------------- model loading


def build_reranker(spec: RerankerSpec) -> Reranker:
    """A reranker from its spec: a registry kind, or a `module:factory` import path."""
    if ":" in spec.kind:
        module_name, _, attr = spec.kind.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise CisrankError(f"reranker kind '{spec.kind}' cannot be imported: {exc}") from exc
        return factory(spec.model, **spec.options)
    from cisrank.rerank.registry import load_reranker

    reranker = load_reranker(spec.kind, spec.model, **spec.options)
    if reranker is None:
        raise CisrankError("reranker kind 'none' cannot be served: pick dense, cis, ...")
    return reranker


def open_retriever(path: os.PathLike[str] | str) -> Retriever:
    """Open an index with `cisrank.retrieval.open_index`, imported only when indexes are used."""
    try:
        from cisrank.indexes.kinds import open_index
    except ImportError as exc:
        raise CisrankError(
            "this cisrank build cannot open indexes (cisrank.retrieval.open_index is missing)"
        ) from exc
    return open_index(os.fspath(path))


class ServingState:
    """The engine side of the app: rerankers, their batchers, indexes and readiness."""

    def __init__(
        self,
        config: ServerConfig,
        metrics: Metrics,
        rerankers: Mapping[str, Reranker] | None = None,
        retrievers: Mapping[str, Retriever] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.rerankers: dict[str, Reranker] = {}
        self.scorers: dict[str, BatchScorer] = {}
        self.retrievers: dict[str, Retriever] = dict(retrievers or {})
        self.tokenizers: dict[str, Any] = {}
        self.error: str | None = None
        self._ready = threading.Event()
        self._loader: threading.Thread | None = None
        if rerankers is not None:
            self._install(dict(rerankers))
            if retrievers is None and config.indexes:
                self.retrievers = {n: open_retriever(s.path) for n, s in config.indexes.items()}
            self._ready.set()

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.error is None

    def _install(self, rerankers: dict[str, Reranker]) -> None:
        for name, reranker in rerankers.items():
            self.tokenizers[name] = find_tokenizer(reranker)
            self.scorers[name] = BatchScorer(reranker, name, self.config.batching, self.metrics)
        self.rerankers = rerankers

    def start_loading(self) -> None:
        """Load models in a thread so that /healthz answers while they load."""
        if self._ready.is_set() or self._loader is not None:
            return
        self._loader = threading.Thread(target=self._load, name="cisrank-loader", daemon=True)
        self._loader.start()

    def _load(self) -> None:
        try:
            loaded: dict[str, Reranker] = {}
            for name, spec in self.config.rerankers.items():
                started = time.perf_counter()
                loaded[name] = build_reranker(spec)
                log.info(
                    "loaded reranker %s (%s, %s) in %.1f s",
                    name,
                    spec.kind,
                    spec.model,
                    time.perf_counter() - started,
                )
            retrievers = {n: open_retriever(s.path) for n, s in self.config.indexes.items()}
            for name in retrievers:
                log.info("opened index %s", name)
            self._install(loaded)
            self.retrievers = retrievers
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.error("loading models failed: %s", self.error)
        finally:
            self._ready.set()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout) and self.error is None

    def scorer(self, name: str) -> BatchScorer:
        if not self.ready:
            raise ApiError(
                503,
                "not_ready",
                self.error or "models are still loading: retry shortly",
                headers={"Retry-After": str(self.config.batching.retry_after_s)},
            )
        return self.scorers[name]

    def resolve_reranker(self, requested: str | None, field: str = "model") -> str:
        """A configured reranker name from a request's `model` (its name or its model id)."""
        if requested is None:
            return self.config.default_reranker_name
        if requested in self.config.rerankers:
            return requested
        for name, spec in self.config.rerankers.items():
            if spec.model is not None and requested == spec.model:
                return name
        choices = ", ".join(self.config.rerankers)
        raise _invalid(field, f"'{requested[:100]}' is not served here: choose one of {choices}")

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in self.scorers.values()))


# ------------------------------------------------------------------------------ middleware


class BodyLimitMiddleware:
    """413 for bodies over the byte limit, declared (Content-Length) or streamed (chunked)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send: Send, status: int, message: str) -> None:
        body = ErrorBody(
            error="payload_too_large" if status == 413 else "invalid_request",
            message=message,
            fields=[FieldError(field="body", message=message, type="size")],
        ).model_dump_json()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await self._reject(send, 400, "Content-Length is not an integer")
                return
            if size > self.max_bytes:
                await self._reject(
                    send, 413, f"request body of {size} bytes is over the limit of {self.max_bytes}"
                )
                return
        # Read the body here, bounded, and replay it: a chunked upload cannot exceed the limit.
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._reject(
                    send, 413, f"request body is over the limit of {self.max_bytes} bytes"
                )
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class MetricsMiddleware:
    """Counts requests and latency per route template (bounded label cardinality)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe_request(route, status, time.perf_counter() - started)


# ---------------------------------------------------------------------------------- helpers


def _field_name(loc: Sequence[Any]) -> str:
    """`('body', 'documents', 3, 'DocumentIn', 'text')` -> `documents.3.text`."""
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    # Union members show up as their type names; they are not fields the user can name.
    parts = [
        p
        for p in parts
        if p not in {"str", "DocumentIn", "int", "function-after[_non_blank(), str]"}
    ]
    return ".".join(parts) or "body"


def _validation_fields(exc: RequestValidationError) -> tuple[int, list[FieldError]]:
    merged: dict[str, FieldError] = {}
    status = 422
    for err in exc.errors():
        kind = str(err.get("type", "invalid"))
        if kind == "json_invalid":
            status = 400
            detail = (err.get("ctx") or {}).get("error", "")
            merged["body"] = FieldError(
                field="body", message=f"malformed JSON: {detail}".rstrip(": "), type=kind
            )
            continue
        name = _field_name(err.get("loc", ()))
        msg = str(err.get("msg", "invalid value"))
        if name in merged and msg not in merged[name].message:
            merged[name] = FieldError(
                field=name, message=f"{merged[name].message}; or {msg}", type=merged[name].type
            )
        else:
            merged.setdefault(name, FieldError(field=name, message=msg, type=kind))
    return status, list(merged.values())


def normalize_scores(scores: Sequence[float], how: str) -> list[float]:
    """Opt-in normalization; `none` keeps raw scores (CIS is a log-ratio, not a probability)."""
    if how == "sigmoid":
        return [
            1.0 / (1.0 + math.exp(-s)) if s >= 0 else math.exp(s) / (1.0 + math.exp(s))
            for s in scores
        ]
    if how == "minmax":
        lo, hi = min(scores), max(scores)
        return [1.0 if hi == lo else (s - lo) / (hi - lo) for s in scores]
    return list(scores)


def _finite(scores: Sequence[float]) -> list[float]:
    """JSON has no NaN or infinity: clamp them to the float range (NaN ranks last anyway)."""
    big = 1.7976931348623157e308
    out = []
    for s in scores:
        if math.isnan(s):
            out.append(-big)
        elif math.isinf(s):
            out.append(big if s > 0 else -big)
        else:
            out.append(s)
    return out


async def _score(state: ServingState, name: str, query: str, texts: list[str]) -> list[float]:
    scorer = state.scorer(name)
    retry = {"Retry-After": str(state.config.batching.retry_after_s)}
    try:
        return await scorer.score(query, texts)
    except QueueFullError as exc:
        raise ApiError(503, "overloaded", f"{exc}: retry later", headers=retry) from None
    except ScoringTimeout as exc:
        raise ApiError(503, "timeout", str(exc), headers=retry) from None


def _state(request: Request) -> ServingState:
    return request.app.state.serving


_bearer = HTTPBearer(auto_error=False, description="API key, when CISRANK_API_KEYS is set.")


async def require_key(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> None:
    checker: KeyChecker = request.app.state.keys
    if checker.enabled and not checker.allows(request.headers.get("authorization")):
        raise ApiError(
            401,
            "unauthorized",
            "missing or invalid API key: send 'Authorization: Bearer <key>'",
            field="authorization",
            headers={"WWW-Authenticate": "Bearer"},
        )


# -------------------------------------------------------------------------------- factory


def create_app(
    config: ServerConfig | None = None,
    *,
    rerankers: Mapping[str, Reranker] | None = None,
    retrievers: Mapping[str, Retriever] | None = None,
    api_keys: Sequence[str] | None = None,
) -> FastAPI:
    """The app. Without `rerankers`, the configured ones load in the background at startup."""
    config = config or ServerConfig()
    serving: ServingState | None = None
    metrics = Metrics(lambda: serving.rerankers if serving is not None else {})
    serving = ServingState(config, metrics, rerankers, retrievers)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for scorer in serving.scorers.values():
            scorer.open()
        serving.start_loading()
        yield
        await serving.aclose()

    app = FastAPI(
        title="cisrank",
        summary="Rerank and search passages by causal relevance (CIS), in the Cohere rerank shape.",
        version=_version(),
        lifespan=lifespan,
        responses={
            422: {"model": ErrorBody, "description": "A field is out of its limits."},
            400: {"model": ErrorBody, "description": "Malformed body."},
        },
    )
    app.state.serving = serving
    app.state.metrics = metrics
    app.state.keys = KeyChecker(tuple(api_keys) if api_keys is not None else keys_from_env())
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.limits.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc.status, exc.code, exc.message, exc.fields, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, fields = _validation_fields(exc)
        message = "; ".join(f"{f.field}: {f.message}" for f in fields)
        return _error_response(status, "invalid_request", message, fields)

    @app.exception_handler(CisrankError)
    async def _cisrank_error(request: Request, exc: CisrankError) -> JSONResponse:
        return _error_response(400, "invalid_request", str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        fields = [FieldError(field="body", message=str(exc.detail), type=code)]
        return _error_response(
            exc.status_code,
            code,
            str(exc.detail),
            fields if exc.status_code == 400 else [],
            getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error_response(500, "internal_error", "internal error; see the server log")

    protected = [Depends(require_key)]

    # ---- probes and metadata

    @app.get("/healthz", response_model=Health, tags=["ops"])
    async def healthz() -> Health:
        """Liveness: the process serves HTTP (models may still be loading)."""
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, tags=["ops"], responses={503: {"model": Health}})
    async def readyz(request: Request) -> Response:
        """Readiness: every configured model and index is loaded."""
        state = _state(request)
        if state.ready:
            return JSONResponse(Health(status="ready").model_dump())
        status = "failed" if state.error else "loading"
        detail = {"error": state.error} if state.error else {}
        return JSONResponse(
            Health(status=status, detail=detail).model_dump(),
            status_code=503,
            headers={"Retry-After": str(config.batching.retry_after_s)},
        )

    @app.get("/v1/models", response_model=ModelList, dependencies=protected, tags=["meta"])
    async def models(request: Request) -> ModelList:
        """The rerankers (by the name a request's `model` takes) and indexes served here."""
        state = _state(request)
        cards = []
        for name, spec in config.rerankers.items():
            loaded = state.rerankers.get(name)
            model_id = spec.model or getattr(loaded, "model_name", "") or ""
            cards.append(ModelCard(id=name, kind=spec.kind, model=model_id, ready=state.ready))
        indexes = [IndexCard(id=n, path=str(s.path)) for n, s in config.indexes.items()]
        if not config.indexes:
            indexes = [IndexCard(id=n, path="") for n in state.retrievers]
        return ModelList(data=cards, indexes=indexes, default=config.default_reranker_name)

    @app.get("/metrics", dependencies=protected, tags=["ops"], response_class=Response)
    async def prometheus(request: Request) -> Response:
        """Prometheus exposition: requests, latency, batch sizes, queue depth, prior-store hits."""
        data, content_type = request.app.state.metrics.render()
        return Response(content=data, media_type=content_type)

    # ---- rerank

    async def rerank(body: RerankRequest, request: Request) -> RerankResponse:
        """Rank `documents` for `query`, most relevant first (Cohere v1/v2, Jina, vLLM shape)."""
        state = _state(request)
        limits = config.limits
        name = state.resolve_reranker(body.model)
        if len(body.query) > limits.max_query_chars:
            raise _invalid(
                "query", f"{len(body.query)} characters, over the limit of {limits.max_query_chars}"
            )
        if len(body.documents) > limits.max_documents:
            raise _invalid(
                "documents",
                f"{len(body.documents)} documents, over the limit of {limits.max_documents}: "
                "send them in several requests",
            )
        texts: list[str] = []
        for i, doc in enumerate(body.documents):
            text = doc.text if isinstance(doc, DocumentIn) else doc
            if len(text) > limits.max_document_chars:
                where = f"documents.{i}.text" if isinstance(doc, DocumentIn) else f"documents.{i}"
                raise _invalid(
                    where,
                    f"{len(text)} characters, over the limit of {limits.max_document_chars}: "
                    "split the document",
                )
            texts.append(text)
        truncated = 0
        scored = texts
        if body.max_tokens_per_doc is not None:
            scorer = state.scorer(name)
            scored, truncated = await scorer.call(
                truncate_texts, state.tokenizers.get(name), texts, body.max_tokens_per_doc
            )
        raw = _finite(await _score(state, name, body.query, scored))
        shown = normalize_scores(raw, body.normalize or config.normalize)
        results = []
        for i in rank_order(raw)[: body.top_n]:
            doc = body.documents[i]
            doc_id = doc.id if isinstance(doc, DocumentIn) else None
            document = None
            if body.return_documents:
                fields = dict(doc.model_extra or {}) if isinstance(doc, DocumentIn) else {}
                if doc_id is not None:
                    fields["id"] = doc_id
                document = RerankDocument(text=texts[i], **fields)
            results.append(
                RerankResult(index=i, relevance_score=shown[i], id=doc_id, document=document)
            )
        return RerankResponse(
            id=str(uuid.uuid4()),
            model=name,
            results=results,
            usage=Usage(documents=len(texts), truncated_documents=truncated),
        )

    rerank_kwargs: dict[str, Any] = {
        "response_model": RerankResponse,
        "response_model_exclude_none": True,
        "dependencies": protected,
        "tags": ["rerank"],
    }
    app.post("/v1/rerank", **rerank_kwargs)(rerank)
    app.post("/v2/rerank", include_in_schema=False, **rerank_kwargs)(rerank)
    app.post("/rerank", include_in_schema=False, **rerank_kwargs)(rerank)

    # ---- search

    @app.post(
        "/v1/search",
        response_model=SearchResponse,
        dependencies=protected,
        tags=["search"],
    )
    async def search(body: SearchRequest, request: Request) -> SearchResponse:
        """First-stage search over a configured index, optionally reranked."""
        state = _state(request)
        limits = config.limits
        if not state.ready:
            state.scorer(config.default_reranker_name)  # raises 503 not_ready
        if not state.retrievers:
            raise _invalid("index", "no index is configured on this server")
        index = body.index or config.default_index_name or next(iter(state.retrievers))
        if index not in state.retrievers:
            raise _invalid(
                "index",
                f"'{index[:100]}' is not served here: choose one of {', '.join(state.retrievers)}",
            )
        reranker = state.resolve_reranker(body.rerank, "rerank") if body.rerank else None
        if len(body.query) > limits.max_query_chars:
            raise _invalid(
                "query", f"{len(body.query)} characters, over the limit of {limits.max_query_chars}"
            )
        if body.top_n > limits.max_search_top_n:
            raise _invalid("top_n", f"{body.top_n} is over the limit of {limits.max_search_top_n}")
        depth = body.depth or (max(body.top_n, 100) if reranker else body.top_n)
        depth = min(depth, limits.max_search_top_n) if body.depth is None else depth
        if depth > limits.max_search_top_n:
            raise _invalid("depth", f"{depth} is over the limit of {limits.max_search_top_n}")
        if depth < body.top_n:
            raise _invalid("depth", f"{depth} is smaller than top_n={body.top_n}")
        hits = await run_in_threadpool(state.retrievers[index].search, body.query, depth)
        if reranker is not None and hits:
            raw = _finite(await _score(state, reranker, body.query, [h.text for h in hits]))
            order = rank_order(raw)[: body.top_n]
            shown = normalize_scores(raw, body.normalize or config.normalize)
        else:
            raw = shown = []
            order = list(range(min(body.top_n, len(hits))))
        results = []
        for rank, i in enumerate(order, 1):
            hit = hits[i]
            first = _finite([float(hit.score)])[0]
            results.append(
                SearchResult(
                    rank=rank,
                    docid=str(hit.docid),
                    text=hit.text,
                    score=shown[i] if reranker else first,
                    retrieval_score=first,
                    rerank_score=raw[i] if reranker else None,
                )
            )
        return SearchResponse(
            id=str(uuid.uuid4()),
            index=index,
            model=reranker,
            results=results,
            usage=Usage(documents=len(hits)),
        )

    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cisrank")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


def create_app_from_env() -> FastAPI:
    """The uvicorn factory used by `cisrank serve` (also under --workers N, one app per worker)."""
    from cisrank.log import setup_logging

    setup_logging()
    raw = env.server_config_json()
    config = ServerConfig.model_validate_json(raw) if raw else ServerConfig()
    return create_app(config)
