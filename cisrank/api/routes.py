"""The HTTP routes. Thin on purpose: validate (pydantic, through FastAPI), call the serving engine
through the converter of the request's wire shape (`cisrank.api.shapes`: `cohere`, `tei`,
`openai`, and `native` for cisrank's own search, context and generation), and map the engine's
errors (`cisrank.serving.errors`) to status codes, which only this module knows.

Status codes: 400 a body that is not UTF-8 JSON (the body says why), 401 missing/wrong API key,
415 a body sent as something else than JSON, 422 a field out of its limits, unknown, or holding a
lone surrogate (the body names it), 499 (counted, never read) a client that hung up while its
context or generation was worked on, 500 a server fault such as a damaged index or prior store
(the body names the component, details in the log), 503 + Retry-After while loading, when the
queue is full or a request timed out.

The shapes clients bring: `POST /v1/rerank` (also `/v2/rerank`, `/rerank`) is Cohere's and Jina's
rerank; `POST /rerank` with `texts` instead of `documents` is Hugging Face TEI's, answered as
TEI's list of `{index, score, text?}`; `POST /v1/embeddings` is OpenAI's (infinity and TEI serve
it too), for a served dense reranker's bi-encoder; `GET /health` and `GET /info` are TEI's probe
and endpoint info. A request's `model` is a reranker's name or its model's id
(`Serving.resolve_reranker`). Every route is in `/openapi.json`; `/docs` and `/redoc` render it
from installed files (`cisrank.api.docs`).

Every route's JSON body is read by `cisrank.api.body.read_json_body` (through `JsonBodyRoute`)
before FastAPI validates it against the schema, so parse errors and invalid text are answered the
same way on every route and FastAPI version.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from fastapi import APIRouter, Body, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError

from cisrank.api.auth import UNAUTHORIZED, KeyChecker
from cisrank.api.body import BodyError, read_json_body
from cisrank.api.errors import ApiError
from cisrank.api.schemas import (
    ContextRequest,
    ContextResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    GenerateRequest,
    GenerateResponse,
    Health,
    ModelList,
    RerankRequest,
    RerankResponse,
    SearchRequest,
    SearchResponse,
    TeiError,
    TeiInfo,
    TeiRank,
    TeiRerankRequest,
)
from cisrank.api.shapes import cohere, native, openai, tei
from cisrank.serving.assembly import ContextService
from cisrank.serving.engine import Serving
from cisrank.serving.errors import (
    BackendFailed,
    ClientGone,
    InvalidField,
    LoadFailed,
    NotReady,
    Overloaded,
    ServiceError,
    TimedOut,
)
from cisrank.serving.metrics import CLIENT_CLOSED_REQUEST
from cisrank.serving.ranking import RankingService

M = TypeVar("M", bound=BaseModel)

_bearer = HTTPBearer(auto_error=False, description="API key, when CISRANK_API_KEYS is set.")


async def require_key(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> None:
    checker: KeyChecker = request.app.state.keys
    if checker.enabled and not checker.allows(request.headers.get("authorization")):
        raise ApiError(
            401,
            "unauthorized",
            UNAUTHORIZED,
            field="authorization",
            headers={"WWW-Authenticate": "Bearer"},
        )


def api_error(exc: ServiceError, retry_after_s: int) -> ApiError:
    """The status code and body of a service error: 422 names the field, 503s say when to retry."""
    if isinstance(exc, InvalidField):
        return ApiError(
            422, "invalid_request", exc.message, field=exc.field, field_message=exc.detail
        )
    if isinstance(exc, BackendFailed):
        return ApiError(500, "internal_error", exc.message)
    if isinstance(exc, ClientGone):
        return ApiError(CLIENT_CLOSED_REQUEST, "client_closed_request", exc.message)
    if isinstance(exc, LoadFailed):
        # Permanent until an operator fixes the configuration: 503 (a balancer tries another
        # replica) without Retry-After (a client retrying here in 1 s only adds load).
        return ApiError(503, "load_failed", exc.message)
    code = {NotReady: "not_ready", Overloaded: "overloaded", TimedOut: "timeout"}[type(exc)]
    return ApiError(503, code, exc.message, headers={"Retry-After": str(retry_after_s)})


def _serving(request: Request) -> Serving:
    return request.app.state.serving


def _ranking(request: Request) -> RankingService:
    return request.app.state.ranking


def _context(request: Request) -> ContextService:
    return request.app.state.context


@contextmanager
def _answering(request: Request) -> Iterator[None]:
    try:
        yield
    except ServiceError as exc:
        raise api_error(exc, _serving(request).config.batching.retry_after_s) from None


@asynccontextmanager
async def _hang_up_watch(request: Request) -> AsyncIterator[threading.Event]:
    """A flag set as soon as the client closes its connection while the block runs (the model
    thread reads it at each step). The body has been read: the next ASGI message is the
    disconnect (or none, once the answer is sent and the watch is over)."""
    gone = threading.Event()

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone.set()
                return

    task = asyncio.create_task(watch())
    try:
        yield gone
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _validated(model: type[M], value: Any) -> M:
    """`value` as `model`, or the 422 FastAPI gives a body that does not fit it."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        ) from None


class _ParsedRequest(Request):
    """The request as FastAPI sees it once `read_json_body` has read it: the parsed value, and a
    Content-Type of JSON (a body without one is JSON here, whatever FastAPI's version assumes)."""

    def __init__(self, request: Request, raw: bytes, value: Any) -> None:
        scope = dict(request.scope)
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-type"]
        scope["headers"] = [*headers, (b"content-type", b"application/json")]
        super().__init__(scope, request.receive)
        self._raw_body = raw
        self._value = value

    async def body(self) -> bytes:
        return self._raw_body

    async def json(self) -> Any:
        return self._value


OFF_LOOP_BYTES = 256 * 1024
"""Bodies larger than this are read (decoded, parsed, checked) in the body thread: about 10 ms
of work per MB, which on the event loop would stall every other request and `/healthz` for as
long (a 16 MB body, a quarter of a second)."""

_BODY_THREAD = ThreadPoolExecutor(1, thread_name_prefix="cisrank-body")
"""One thread reads the large bodies, one at a time: parsing holds the GIL, so more threads would
not read faster, only hold more bodies' transient copies (text, parse, checks: several times a
body) at once, in more allocator arenas."""


class JsonBodyRoute(APIRoute):
    """A route whose JSON body is read by `read_json_body`: the body's faults (Content-Type, not
    UTF-8, malformed, too deep, lone surrogates) are answered before the schema sees it; a large
    body is read off the event loop."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def read_then_handle(request: Request) -> Response:
            raw = await request.body()
            if not raw:  # FastAPI answers "body: Field required"
                return await handler(request)
            content_type = request.headers.get("content-type")
            try:
                if len(raw) > OFF_LOOP_BYTES:
                    loop = asyncio.get_running_loop()
                    value = await loop.run_in_executor(
                        _BODY_THREAD, read_json_body, raw, content_type
                    )
                else:
                    value = read_json_body(raw, content_type)
            except BodyError as exc:
                raise ApiError(
                    exc.status,
                    exc.code,
                    exc.message,
                    field=exc.field,
                    field_message=exc.detail,
                    field_type=exc.kind,
                ) from None
            return await handler(_ParsedRequest(request, raw, value))

        return read_then_handle


router = APIRouter(route_class=JsonBodyRoute)
protected = [Depends(require_key)]

# ---- probes and metadata


@router.get("/healthz", response_model=Health, tags=["ops"])
async def healthz() -> Health:
    """Liveness: the process serves HTTP (models may still be loading)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, tags=["ops"], responses={503: {"model": Health}})
async def readyz(request: Request) -> Response:
    """Readiness: every configured model and index is loaded."""
    serving = _serving(request)
    if serving.ready:
        return JSONResponse(Health(status="ready").model_dump())
    if serving.error:
        return JSONResponse(
            Health(status="failed", detail={"error": serving.error}).model_dump(), status_code=503
        )
    return JSONResponse(
        Health(status="loading").model_dump(),
        status_code=503,
        headers={"Retry-After": str(serving.config.batching.retry_after_s)},
    )


@router.get(
    "/health",
    tags=["ops"],
    response_class=Response,
    responses={
        200: {"description": "Every configured model and index is loaded (empty body)."},
        503: {"model": TeiError, "description": "Loading, or loading failed."},
    },
)
async def health(request: Request) -> Response:
    """Hugging Face TEI's health check: 200 with an empty body once the models are loaded, 503
    with TEI's `{error, error_type}` while they load (with Retry-After) or when loading failed."""
    serving = _serving(request)
    if serving.ready:
        return Response(status_code=200)
    if serving.error:
        return JSONResponse(TeiError(error=serving.error).model_dump(), status_code=503)
    return JSONResponse(
        TeiError(error="models are still loading: retry shortly").model_dump(),
        status_code=503,
        headers={"Retry-After": str(serving.config.batching.retry_after_s)},
    )


@router.get("/info", response_model=TeiInfo, dependencies=protected, tags=["meta"])
async def info(request: Request) -> TeiInfo:
    """Hugging Face TEI's endpoint info, for the default reranker (every reranker served is in
    `GET /v1/models`)."""
    with _answering(request):
        return tei.info(_ranking(request))


@router.get("/v1/models", response_model=ModelList, dependencies=protected, tags=["meta"])
async def models(request: Request) -> ModelList:
    """The rerankers (by the name a request's `model` takes) and indexes served here."""
    return native.models(_ranking(request))


@router.get("/metrics", dependencies=protected, tags=["ops"], response_class=Response)
async def prometheus(request: Request) -> Response:
    """Prometheus exposition: requests, latency, batch sizes, queue depth, prior-store hits."""
    data, content_type = request.app.state.metrics.render()
    return Response(content=data, media_type=content_type)


# ---- rerank


async def rerank(body: RerankRequest, request: Request) -> RerankResponse:
    """Rank `documents` for `query`, most relevant first (Cohere v1/v2, Jina, vLLM shape)."""
    with _answering(request):
        return await cohere.rerank(_ranking(request), body)


_rerank_kwargs: dict[str, Any] = {
    "response_model": RerankResponse,
    "response_model_exclude_none": True,
    "dependencies": protected,
    "tags": ["rerank"],
}
router.post("/v1/rerank", **_rerank_kwargs)(rerank)
router.post("/v2/rerank", **_rerank_kwargs)(rerank)

# `/rerank` reads its body itself (its shape decides which model validates it), so its schema
# is declared here: Cohere's request or TEI's, Cohere's answer or TEI's list.
_ANY_SHAPE_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        {"$ref": "#/components/schemas/RerankRequest"},
                        TeiRerankRequest.model_json_schema(),
                    ]
                }
            }
        },
    }
}


@router.post(
    "/rerank",
    dependencies=protected,
    tags=["rerank"],
    response_class=JSONResponse,
    openapi_extra=_ANY_SHAPE_OPENAPI,
    responses={
        200: {
            "description": "Cohere's answer (RerankResponse), or TEI's list for a TEI body.",
            "content": {
                "application/json": {
                    "schema": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/RerankResponse"},
                            {"type": "array", "items": TeiRank.model_json_schema()},
                        ]
                    }
                }
            },
        }
    },
)
async def rerank_any_shape(
    request: Request,
    body: dict[str, Any] = Body(...),
) -> Response:
    """Cohere's rerank (as /v1/rerank), or Hugging Face TEI's when the body has `texts`
    instead of `documents` (`TeiRerankRequest`): TEI's JSON list of `{index, score, text?}`."""
    with _answering(request):
        if tei.claims(body):
            ranks = await tei.rerank(_ranking(request), _validated(TeiRerankRequest, body))
            return JSONResponse([r.model_dump(mode="json", exclude_none=True) for r in ranks])
        answer = await cohere.rerank(_ranking(request), _validated(RerankRequest, body))
        return JSONResponse(answer.model_dump(mode="json", exclude_none=True))


# ---- embeddings


@router.post(
    "/v1/embeddings", response_model=EmbeddingsResponse, dependencies=protected, tags=["embed"]
)
async def embeddings(body: EmbeddingsRequest, request: Request) -> EmbeddingsResponse:
    """OpenAI's embeddings (as infinity and TEI serve them) with a served dense reranker's
    bi-encoder (the config's `embeddings` one unless `model` names another): unit-length
    vectors, bounded like a rerank request; `/info` says its runtime and number format."""
    with _answering(request):
        return await openai.embeddings(_ranking(request), body)


# ---- search


@router.post("/v1/search", response_model=SearchResponse, dependencies=protected, tags=["search"])
async def search(body: SearchRequest, request: Request) -> SearchResponse:
    """First-stage search over a configured index, optionally reranked."""
    with _answering(request):
        return await native.search(_ranking(request), body)


# ---- RAG context assembly


@router.post(
    "/v1/context", response_model=ContextResponse, dependencies=protected, tags=["context"]
)
async def context(body: ContextRequest, request: Request) -> ContextResponse:
    """Arrange passages into a RAG prompt with a CIS reranker's causal LM: the order, the
    per-passage scores (curvature), the question-likelihood gauge and the prompt."""
    with _answering(request):
        async with _hang_up_watch(request) as gone:
            return await native.context(_context(request), body, gone)


@router.post(
    "/v1/generate", response_model=GenerateResponse, dependencies=protected, tags=["context"]
)
async def generate(body: GenerateRequest, request: Request) -> GenerateResponse:
    """Answer a question over passages, greedy, with naive or entropy-based decoding (seed
    004), bounded in passages, new tokens and time."""
    with _answering(request):
        async with _hang_up_watch(request) as gone:
            return await native.generate(_context(request), body, gone)
