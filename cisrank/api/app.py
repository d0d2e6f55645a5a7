"""The FastAPI app factory: the services behind the routes, middleware and error handlers.

`create_app(config)` builds the serving engine (`cisrank.serving.Serving`) of a config; it loads
the configured rerankers (and indexes) in a background thread once the server has started, so
`/healthz` answers at once and `/readyz` turns ready when the models are in. Tests and embedders
can pass ready-made `rerankers=` and `retrievers=` instead, or an engine built outside the app
(`create_app(serving=...)`: one program's engine behind its own HTTP app).

An app runs the pre-start checks (`cisrank.serving.preflight`: every index, prior store and
recorded model in full) before it loads what its config names, in the same background thread: an
app whose checks fail answers 503 `load_failed` like one whose loading fails. `cisrank serve` runs
them before it binds its port and builds its workers' apps with `preflight=False`.

Where things live: the engine, without the web, in `cisrank.serving` (the parts every service
shares, ranking, RAG context and generation, model work and its errors); the converter of each
wire shape in `cisrank.api.shapes`; routes in `cisrank.api.routes`, error bodies in
`cisrank.api.errors`, body limit and metrics in `cisrank.api.middleware`, reading bodies in
`cisrank.api.body`. Status codes: 400 a body that is
not UTF-8 JSON (it says why), 401 missing/wrong API key (from the request head, before the body
is read or any budget reserved; an unknown path too), 404 unknown path, 408 body not received
within `body_read_timeout_s`, 413 body over `max_body_bytes`, 415 a body that is not JSON, 422 a
field out of its limits or holding a lone surrogate (the body names it), 503 + Retry-After while
loading, when the queue, the reranker's cost budget or the in-flight body bytes
(`max_inflight_body_bytes`) are full, a request timed out, or the server stopped before answering
it (SIGTERM past `graceful_timeout_s`). Bugs and server faults are 500, logged, never raised into
the server, and never carry a server path. Before a request reaches the app, `cisrank serve`'s
connection protocol (`cisrank.api.http_protocol`) answers a head over its limits 431, a head not
complete by its deadline 408, a connection over the cap 503 + Retry-After, and an answer that
the response budget cannot take 503 + Retry-After instead of it.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from cisrank.api.auth import KeyChecker, keys_from_env
from cisrank.api.docs import install_docs
from cisrank.api.errors import install_error_handlers
from cisrank.api.lifecycle import BodyReadTimeoutMiddleware, ShutdownAnswerMiddleware
from cisrank.api.middleware import (
    BodyBudgetMiddleware,
    BodyLimitMiddleware,
    KeyGateMiddleware,
    MetricsMiddleware,
    TrailingSlashMiddleware,
)
from cisrank.api.routes import router
from cisrank.api.schemas import ErrorBody
from cisrank.errors import CisrankError
from cisrank.rerank.base import Reranker
from cisrank.retrieval.base import Retriever
from cisrank.serving.assembly import ContextService
from cisrank.serving.config import ServerConfig
from cisrank.serving.engine import Serving
from cisrank.serving.ranking import RankingService

log = logging.getLogger(__name__)


def create_app(
    config: ServerConfig | None = None,
    *,
    serving: Serving | None = None,
    rerankers: Mapping[str, Reranker] | None = None,
    retrievers: Mapping[str, Retriever] | None = None,
    api_keys: Sequence[str] | None = None,
    on_loaded: Callable[[str | None], None] | None = None,
    preflight: bool = True,
    hold_until_loaded: Callable[[], bool] | None = None,
) -> FastAPI:
    """The app over `serving`, an engine built outside it, or over the one it builds from the
    engine's own arguments (`config`, `rerankers`, `retrievers`, `on_loaded`, `preflight`: refused
    beside one handed in); its startup and shutdown open, load and close the engine. Without
    `rerankers`, the configured ones load in the background at startup, after the pre-start
    checks (`preflight`: unless they have run already), then `on_loaded` is called. An app whose
    checks or loading fail answers 503 `load_failed` on every route until it is stopped.

    `hold_until_loaded`, asked once at startup: when it says True, the app's startup waits for
    the loading to end, so the server takes no connection before its models are in (a worker
    restarted beside ready ones, which would answer 503 `not_ready` to the requests it takes
    from their shared socket)."""
    engine = _engine(serving, config, rerankers, retrievers, on_loaded, preflight)
    config = engine.config
    metrics = engine.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.open()
        engine.start_loading()
        if hold_until_loaded is not None and hold_until_loaded():
            log.info("waiting for the models to load before taking connections")
            loop = asyncio.get_running_loop()
            while not await loop.run_in_executor(None, engine.wait_loaded, 1.0):
                pass
        yield
        await engine.aclose()

    app = FastAPI(
        title="cisrank",
        summary="Rerank and search passages by causal relevance (CIS), in the Cohere rerank shape.",
        version=_version(),
        lifespan=lifespan,
        redirect_slashes=False,  # no redirect built from the Host header: TrailingSlash serves
        docs_url=None,  # served from installed assets by install_docs, never from a CDN
        redoc_url=None,
        responses={
            422: {"model": ErrorBody, "description": "A field is out of its limits."},
            400: {"model": ErrorBody, "description": "Malformed body."},
        },
    )
    app.state.serving = engine
    app.state.ranking = RankingService(engine)
    app.state.context = ContextService(engine)
    app.state.metrics = metrics
    app.state.keys = KeyChecker(tuple(api_keys) if api_keys is not None else keys_from_env())
    # Added last = outermost. Metrics see every final status (the 503 of a stopped request and
    # the 408 of a stalled body included); the read deadline covers the whole body; the bytes
    # budget counts the reads of the body limit, so it can refuse a body before it is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.limits.max_body_bytes)
    app.add_middleware(
        BodyBudgetMiddleware,
        max_inflight_bytes=config.limits.max_inflight_body_bytes,
        max_body_bytes=config.limits.max_body_bytes,
        retry_after_s=config.batching.retry_after_s,
    )
    # The key is checked from the head, before a byte of the body budget is reserved.
    app.add_middleware(
        KeyGateMiddleware, keys=app.state.keys, max_body_bytes=config.limits.max_body_bytes
    )
    app.add_middleware(BodyReadTimeoutMiddleware, timeout_s=config.limits.body_read_timeout_s)
    app.add_middleware(ShutdownAnswerMiddleware, retry_after_s=config.batching.retry_after_s)
    paths = [path for r in router.routes if isinstance(path := getattr(r, "path", None), str)]
    app.add_middleware(MetricsMiddleware, metrics=metrics, paths=paths)
    app.add_middleware(TrailingSlashMiddleware, paths=paths)
    install_error_handlers(app)
    app.include_router(router)
    install_docs(app)
    return app


def _engine(
    serving: Serving | None,
    config: ServerConfig | None,
    rerankers: Mapping[str, Reranker] | None,
    retrievers: Mapping[str, Retriever] | None,
    on_loaded: Callable[[str | None], None] | None,
    preflight: bool,
) -> Serving:
    """`serving`, or the engine of the other arguments where none is handed in: given beside
    one, they would be a second say in what it serves."""
    if serving is None:
        return Serving(config or ServerConfig(), None, rerankers, retrievers, on_loaded, preflight)
    engine_args = {"config": config, "rerankers": rerankers, "retrievers": retrievers}
    given = [k for k, v in engine_args.items() if v is not None]
    given += [k for k, v in (("on_loaded", on_loaded), ("preflight", not preflight)) if v]
    if given:
        raise CisrankError(
            f"create_app: {', '.join(given)} are the engine's own: give them to the Serving "
            "handed in as serving=, not beside it"
        )
    return serving


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cisrank")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


def report_loading_to(folder: Path) -> Callable[[str | None], None]:
    """An `on_loaded` that tells `cisrank serve` how this worker's loading ended: a file
    `ready-PID`, or `failed-PID` holding the one-line reason (written whole, then renamed)."""

    def report(failure: str | None) -> None:
        name = f"{'failed' if failure else 'ready'}-{os.getpid()}"
        part = folder / f".{name}.part"
        try:
            part.write_text(failure or "", encoding="utf-8")
            os.replace(part, folder / name)
        except OSError:  # the CLI is gone: nobody to tell
            pass

    return report


def _any_worker_ready(folder: Path) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            return any(name.startswith("ready-") for name in os.listdir(folder))
        except OSError:
            return False

    return ready


PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when the thread that created it ends."""

ORPHAN_POLL_S = 0.5


def die_with_parent(parent: int, grace_s: float) -> None:
    """Make this worker of `cisrank serve --workers N` stop when `parent`, its supervisor, dies.

    Why: a SIGKILLed supervisor runs no cleanup, and its workers, re-parented to PID 1, kept
    serving on the shared port (`/readyz` 200 after 116 s) and a new `cisrank serve` on that
    port failed "the port is in use". On Linux the kernel sends SIGTERM at the parent's death
    (PR_SET_PDEATHSIG; uvicorn's supervisor starts its workers from its main thread, whose end
    is the process's); a thread polls the parent pid as well (other systems, and a parent gone
    before the signal was asked for). SIGTERM is the graceful stop: the requests in flight are
    answered, then the worker exits; `grace_s` after it, the worker exits whatever is left."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the poll remains
            pass

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(ORPHAN_POLL_S)
        log.warning("the server's supervisor (pid %d) is gone: this worker stops", parent)
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="cisrank-parent-watch", daemon=True).start()


def served_app(config: ServerConfig, status: Path, supervisor: int | None = None) -> FastAPI:
    """The app of one `cisrank serve` worker (the uvicorn factory, with `config` and `status`
    bound; under --workers N each worker process unpickles them and builds its own): the config
    checked already (no pre-start checks again), the end of loading reported to the folder
    `status` (`cisrank serve` stops when a worker's loading fails).

    `supervisor`: the pid of `cisrank serve` under --workers N. A worker (a process other than
    it) dies with it (`die_with_parent`), and one started while another worker is ready (a
    restart) takes no connection before its models are loaded."""
    from cisrank.log import setup_logging

    setup_logging()
    hold = None
    if supervisor is not None and os.getpid() != supervisor:
        grace = config.graceful_timeout_s if config.graceful_timeout_s is not None else 60.0
        die_with_parent(supervisor, grace + 5)
        hold = _any_worker_ready(status)
    return create_app(
        config, on_loaded=report_loading_to(status), preflight=False, hold_until_loaded=hold
    )
