"""`cisrank serve`: the REST API under uvicorn.

Two ways to say what to serve: `--reranker KIND --model M [--index PATH ...]` for one model
without a config file (the quick start of infinity or TEI), or `--config FILE` for several models,
limits and batching. Giving both is an error: which one wins would be a guess.

The config is checked here (one-line error, exit 2) before uvicorn starts: its reranker kinds, and
the server's pre-start checks (`cisrank.serving.preflight`: every configured index completely,
every existing prior store row by row, every pulled model's files against the sha256 its pull
recorded); a server that cannot serve what it is configured to never starts. Every worker's app
is then built from that config itself (`cisrank.api.app.served_app`, with the config bound: under
`--workers N` uvicorn pickles it into each worker process), so `--workers N` builds N identical
apps, which do not run the checks again.

Then the port is bound here, before uvicorn runs (a port in use is one line and exit 2, not
uvicorn's log and exit 3), and the workers load their models. Each worker reports how loading
ended to a status folder: once every worker has loaded, one line says `ready on
http://HOST:PORT`; if any worker's model cannot load, the server stops and the command exits 2
with one line saying why (an app embedded without `cisrank serve` keeps answering 503
`load_failed` instead, for its host to decide).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cisrank import env
from cisrank.cli.options import CHUNK_FLAGS, ChunkChanges, ModelOpt, takes
from cisrank.cli.reranker_flags import reranker_flags
from cisrank.config import flag_name
from cisrank.errors import CisrankError, require
from cisrank.rerank.registry import factory_path, servable

if TYPE_CHECKING:
    from cisrank.serving.config import ServerConfig

log = logging.getLogger(__name__)

SERVED_KINDS = ", ".join(k.name for k in servable())
"""The registry's kinds that can be served (every one but `none`), for the help."""


def _reranker_name(kind: str, model: str | None) -> str:
    """A registry kind names itself (`dense`); a `module:factory` kind is named after its model
    (folder or hub id, last part), else after its factory."""
    if not factory_path(kind):
        return kind
    if model:
        return Path(model.rstrip("/")).name or kind.rpartition(":")[2]
    return kind.rpartition(":")[2]


def server_config(
    config: Path | None,
    reranker: str | None = None,
    model: str | None = None,
    indexes: Sequence[Path] = (),
    options: Mapping[str, Any] | None = None,
) -> ServerConfig:
    """The config `cisrank serve` runs: from --config; from the quick-start options (one
    reranker named after its kind, with the reranker flags given, `--estimator`, `--fuse`,
    `--backend`..., as its options, each index named after its folder); or the default of a bare
    `cisrank serve`. Each reranker spec is checked as the config is made (its kind looked up in
    the registry once, there), then everything the config names, every reranker's kind servable
    first (`cisrank.serving.preflight`)."""
    from pydantic import ValidationError

    from cisrank.serving import preflight
    from cisrank.serving.config import IndexSpec, RerankerSpec, ServerConfig

    given = {k: v for k, v in (options or {}).items() if v is not None}
    quick = [flag for flag, v in (("--reranker", reranker), ("--model", model)) if v is not None]
    quick += ["--index"] if indexes else []
    quick += [flag_name(k) for k in given]
    if config is not None and quick:
        raise CisrankError(
            f"give either --config or {'/'.join(quick)}, not both: the config file names every "
            "reranker, its options and every index"
        )
    if (model is not None or given) and reranker is None:
        what = "--model" if model is not None else ", ".join(map(flag_name, given))
        raise CisrankError(f"{what} needs --reranker KIND ({SERVED_KINDS})")
    specs: dict[str, IndexSpec] = {}
    for path in indexes:
        name = path.resolve().name
        if name in specs:
            raise CisrankError(
                f"two indexes are named '{name}' (an index is named after its folder): "
                f"'{specs[name].path}' and '{path}'; use --config to name them"
            )
        specs[name] = IndexSpec(path=path)
    try:
        if config is not None:
            cfg = ServerConfig.load(config)
        elif reranker is None:
            cfg = ServerConfig(indexes=specs)
        else:
            name = _reranker_name(reranker, model)
            try:
                spec = RerankerSpec(kind=reranker, model=model, options=given)
            except ValidationError as exc:  # the kind, or its options (checked as it is made)
                raise CisrankError(f"reranker '{name}': {exc.errors()[0]['msg']}") from None
            cfg = ServerConfig(rerankers={name: spec}, indexes=specs)
    except ValidationError as exc:
        raise CisrankError(f"cannot serve that: {exc.errors()[0]['msg']}") from None
    preflight(cfg)
    return cfg


def _stopped_by_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM is the way to stop the server: once uvicorn has stopped gracefully it raises the
    signal again for the handler it found, this one, and the process exits 0. A SIGTERM that
    arrives before uvicorn has started exits 0 at once."""
    raise SystemExit(0)


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything starts (uvicorn listens on it): a port in use
    or an address this machine does not have is one line and exit 2."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = "the port is in use (another server?): stop it or pick another --port"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = "this machine has no such address: pick another --host (0.0.0.0 for all)"
        else:
            why = exc.strerror or str(exc)
        raise CisrankError(f"cannot listen on {host}:{port}: {why}") from None
    except (socket.gaierror, OverflowError) as exc:
        sock.close()
        raise CisrankError(f"cannot listen on {host}:{port}: {exc}") from None
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class LoadWatch(threading.Thread):
    """Watches the workers' reports (`cisrank.api.app.report_loading_to`): says `ready on URL`
    once all `workers` have loaded, and calls `stop` at the first worker whose loading failed
    (its reason is then `failure`). A look that fails for want of descriptors is tried again at
    the next tick (the thread died of EMFILE under a flood of connections, docs/reliability.md)."""

    def __init__(self, folder: Path, workers: int, url: str, stop: Callable[[], None]) -> None:
        super().__init__(name="cisrank-load-watch", daemon=True)
        self.folder = folder
        self.workers = workers
        self.url = url
        self.stop_server = stop
        self.failure: str | None = None
        self.done = threading.Event()
        self.processes: Any = None  # uvicorn's Multiprocess under --workers N
        self._seen: list[Any] = []

    def _deaths(self) -> None:
        """A WARNING for each worker uvicorn's supervisor replaced since the last look (it logs
        "Child process [PID] died" at INFO, which a server at CISRANK_LOG_LEVEL=WARNING, or
        any log that keeps warnings only, never shows)."""
        if self.processes is None:
            return
        now = list(self.processes.processes)
        if self.processes.should_exit.is_set():  # stopping: workers end on purpose
            self._seen = now
            return
        for old, new in zip(self._seen, now, strict=False):
            if old is not new:
                code = old.process.exitcode
                how = (
                    f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
                )
                log.warning(
                    "worker %s died (%s): worker %s replaces it, and takes requests once its "
                    "models are loaded",
                    old.pid,
                    how,
                    new.pid,
                )
        self._seen = now

    def run(self) -> None:
        announced = False
        while not self.done.wait(0.1):
            self._deaths()
            try:
                names = os.listdir(self.folder)
                failed = sorted(n for n in names if n.startswith("failed-"))
                text = (self.folder / failed[0]).read_text(encoding="utf-8") if failed else ""
            except FileNotFoundError:  # the server is past its end and cleaned up
                return
            except OSError:  # out of descriptors (EMFILE) for a moment: look again next tick
                continue
            if failed:
                self.failure = " ".join(text.split()) or "a model failed to load"
                self.stop_server()
                return
            if not announced and sum(n.startswith("ready-") for n in names) >= self.workers:
                announced = True
                print(f"ready on {self.url}", file=sys.stderr, flush=True)


@reranker_flags(every_field=True, omit=("model",))
@takes(chunking=CHUNK_FLAGS)
def serve(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Server config (JSON or YAML): rerankers {name: {kind, model, options}}, "
            "indexes, limits, batching. Default (deploy/server.json): the all-MiniLM-L6-v2 "
            "bi-encoder on --backend auto, ONNX Runtime int8 ('dense', /v1/rerank, DL21 nDCG@10 "
            "0.5801), the shipped student ('student', DL21 0.5505) and the bi-encoder in "
            "float32 ('dense-float32', /v1/embeddings).",
        ),
    ] = None,
    reranker: Annotated[
        str | None,
        typer.Option(
            "--reranker",
            "-r",
            help=f"Quick start without --config: serve one reranker of this kind ({SERVED_KINDS}, "
            "or package.module:factory for your own), named after the kind, with that kind's "
            "flags (--help-kind KIND lists them) as its options.",
        ),
    ] = None,
    model: ModelOpt = None,
    index: Annotated[
        list[Path] | None,
        typer.Option(
            "--index",
            help="Quick start: an index folder to serve on /v1/search, named after the folder "
            "(repeatable).",
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Interface to bind; 0.0.0.0 for all (containers).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port.")] = 8000,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="Worker processes; each loads its own copy of every model.",
        ),
    ] = 1,
    *,
    chunking: ChunkChanges,
    **options: Any,
) -> None:
    """Serve the REST API: /v1/rerank (Cohere and Jina shape; also /v2/rerank, and /rerank,
    which takes TEI's shape too), /v1/search, /v1/context and /v1/generate (RAG context and
    answers with a cis reranker's language model), /v1/embeddings (OpenAI shape, a dense
    reranker's encoder), /v1/models, /healthz, /readyz, /metrics; the OpenAPI docs at /docs.

    No flags: the all-MiniLM-L6-v2 bi-encoder on ONNX Runtime int8 ('dense': /v1/rerank's
    default, the best on DL21 among the fastest, bench/RESULTS.md), the student shipped with
    cisrank ('student', by name) and the bi-encoder in float32 ('dense-float32': /v1/embeddings);
    without the onnx extra, torch as --backend auto chooses (said in the log and in /info).

    Quick start: cisrank serve --reranker dense --model all-MiniLM-L6-v2 --index indexes/bm25
    (a folder of `cisrank index build bm25`);
    cisrank serve --reranker cis --estimator forward --template qa (every option of a kind is a
    flag: cisrank serve --help-kind cis lists the cis kind's).

    Several models: cisrank serve --config deploy/server.json (the no-flag server's config, to
    copy and edit; JSON or YAML).

    Start: the config, every index, prior store and pulled model are checked and the port is
    bound first (any fault: one line, exit 2); "ready on http://HOST:PORT" once every model has
    loaded; a model that cannot load stops the server (one line, exit 2).

    API keys: set CISRANK_API_KEYS=key1,key2 to require 'Authorization: Bearer <key>' (each key
    at least 16 characters; a variable set but holding no usable key refuses to start).

    Long documents: a document longer than its model's window is cut into overlapping windows,
    each scored, the document scored by its best (--chunk-pooling max; mean and first, the
    truncation, for comparison); a request's max_chunks_per_doc caps the windows, and usage says
    what was cut.

    Stopping: SIGTERM (or Ctrl-C) stops taking connections and waits up to graceful_timeout_s
    (config, default 60) for the requests in flight; any still running then are answered 503 with
    Retry-After. Exit code 0 after a SIGTERM.
    """
    env.api_keys()  # before the checks of the config, which can take minutes
    cfg = server_config(config, reranker, model, index or (), options)
    cfg = cfg.model_copy(update={"chunking": chunking.over(cfg.chunking)})
    run_server(cfg, host, port, workers)


def run_server(cfg: ServerConfig, host: str, port: int, workers: int) -> None:
    """Bind the port, then serve the apps of `cfg` under uvicorn until stopped (SIGTERM exits
    0): `cisrank.api.app.served_app`, one per worker, with the config and a status folder bound
    (pickled into each process under --workers N, not passed through the environment). A model
    that cannot load stops the server and is one line, exit 2."""
    require("uvicorn", "serve", "cisrank serve")
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from cisrank.api.app import served_app
    from cisrank.api.http_protocol import uvicorn_options

    env.api_keys()  # a key variable that holds no usable key: one line, exit 2, nothing bound
    sock = listen(host, port)
    signal.signal(signal.SIGTERM, _stopped_by_sigterm)
    folder = Path(tempfile.mkdtemp(prefix="cisrank-serve-"))
    factory = functools.partial(served_app, cfg, folder, os.getpid() if workers > 1 else None)
    config = uvicorn.Config(
        factory,
        factory=True,
        host=host,
        port=sock.getsockname()[1],
        workers=workers,
        timeout_graceful_shutdown=cfg.graceful_timeout_s,  # type: ignore[arg-type]  # a float works: uvicorn waits on it with asyncio
        log_config=None,
        **uvicorn_options(cfg),
    )
    url = _url(config.host, config.port)
    watch: LoadWatch | None = None
    failure: str | None = None
    try:
        if workers > 1:
            processes = Multiprocess(config, sockets=[sock])
            watch = LoadWatch(folder, workers, url, processes.should_exit.set)
            watch.processes = processes
            watch.start()
            processes.run()
        else:
            server = uvicorn.Server(config)

            def stop() -> None:
                server.should_exit = True

            watch = LoadWatch(folder, 1, url, stop)
            watch.start()
            server.run(sockets=[sock])
            if not server.started and watch.failure is None:
                raise SystemExit(3)  # uvicorn's startup failure, logged by uvicorn
        failure = watch.failure
    finally:
        if watch is not None:  # stopped before its folder goes, so it never reads a missing one
            watch.done.set()
            watch.join(5)
        shutil.rmtree(folder, ignore_errors=True)
        sock.close()
    if failure is not None:
        raise CisrankError(f"{failure}; the server stopped")
