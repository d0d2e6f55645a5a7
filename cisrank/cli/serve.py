"""`cisrank serve`: the REST API under uvicorn.

Two ways to say what to serve: `--reranker KIND --model M [--index PATH ...]` for one model
without a config file (the quick start of infinity or TEI), or `--config FILE` for several models,
limits and batching. Giving both is an error: which one wins would be a guess.

The config is checked here (one-line error, exit 2) before uvicorn starts, then handed to every
worker through an environment variable, so `--workers N` builds N identical apps. Checked means
every configured index completely (its manifest and the checksum of every file: a half-built or
damaged index refuses the start, since it would never become ready) and every existing prior
store opens; a server that cannot serve what it is configured to never starts.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from cisrank import env
from cisrank.cli.options import ModelOpt
from cisrank.errors import CisrankError, require

if TYPE_CHECKING:
    from cisrank.api.config import ServerConfig


def _reranker_name(kind: str, model: str | None) -> str:
    """A registry kind names itself (`dense`); a `module:factory` kind is named after its model
    (folder or hub id, last part), else after its factory."""
    if ":" not in kind:
        return kind
    if model:
        return Path(model.rstrip("/")).name or kind.rpartition(":")[2]
    return kind.rpartition(":")[2]


def quick_config(
    reranker: str | None, model: str | None, indexes: Sequence[Path] = ()
) -> ServerConfig:
    """The ServerConfig of the quick start: one reranker named after its kind, each index named
    after its folder. Without `--reranker`, the default reranker of a bare `cisrank serve`."""
    from pydantic import ValidationError

    from cisrank.api.config import IndexSpec, RerankerSpec, ServerConfig

    if model is not None and reranker is None:
        raise CisrankError("--model needs --reranker KIND (dense, cis, distilled, ...)")
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
        if reranker is None:
            return ServerConfig(indexes=specs)
        name = _reranker_name(reranker, model)
        return ServerConfig(
            rerankers={name: RerankerSpec(kind=reranker, model=model)}, indexes=specs
        )
    except ValidationError as exc:
        raise CisrankError(f"cannot serve that: {exc.errors()[0]['msg']}") from None


def server_config(
    config: Path | None,
    reranker: str | None = None,
    model: str | None = None,
    indexes: Sequence[Path] = (),
) -> ServerConfig:
    """The config `cisrank serve` runs: from --config, from the quick-start options, or the
    default; every reranker kind and index path checked."""
    from cisrank.api.config import ServerConfig
    from cisrank.rerank.registry import check_name

    quick = [flag for flag, v in (("--reranker", reranker), ("--model", model)) if v is not None]
    quick += ["--index"] if indexes else []
    if config is not None and quick:
        raise CisrankError(
            f"give either --config or {'/'.join(quick)}, not both: the config file names every "
            "reranker and index"
        )
    if config is not None:
        cfg = ServerConfig.load(config)
    elif quick:
        cfg = quick_config(reranker, model, indexes)
    else:
        cfg = ServerConfig()
    for name, spec in cfg.rerankers.items():
        if ":" not in spec.kind:
            try:
                check_name(spec.kind)
            except CisrankError as exc:
                raise CisrankError(f"reranker '{name}': {exc}") from None
            if spec.kind == "none":
                raise CisrankError(f"reranker '{name}': kind 'none' cannot be served")
    for name, index in cfg.indexes.items():
        if not index.path.exists():
            raise CisrankError(f"index '{name}': path '{index.path}' does not exist")
        check_index(name, index.path)
    for name, spec in cfg.rerankers.items():
        store = spec.options.get("prior_store")
        parts = [Path(p.strip()).expanduser() for p in str(store or "").split(",") if p.strip()]
        if any(p.exists() for p in parts):
            check_prior_store(name, str(store))
    return cfg


def _stopped_by_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM is the way to stop the server: once uvicorn has stopped gracefully it raises the
    signal again for the handler it found, this one, and the process exits 0. A SIGTERM that
    arrives before uvicorn has started exits 0 at once."""
    raise SystemExit(0)


def check_index(name: str, path: Path) -> None:
    """The whole index, before the server starts: a permanent fault is a one-line error now,
    not a server whose readiness never comes. Its files found intact are not hashed again when
    the server (in this process) opens them."""
    from cisrank.indexes.integrity import require_intact

    try:
        require_intact(path)
    except CisrankError as exc:
        raise CisrankError(f"index '{name}': {exc}") from None


def check_prior_store(name: str, spec: str | Path) -> None:
    """A prior store that SQLite cannot open (damaged header, not a database), a Parquet prior
    table that cannot be read, or a prior index folder whose files fail their manifest's
    checksums stops the start."""
    from cisrank.rerank.prior_table import open_prior_store

    try:
        open_prior_store(spec).close()
    except CisrankError as exc:
        raise CisrankError(f"reranker '{name}': {exc}") from None


def serve(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Server config (JSON or YAML): rerankers {name: {kind, model, options}}, "
            "indexes, limits, batching. Default: one 'dense' reranker on all-MiniLM-L6-v2.",
        ),
    ] = None,
    reranker: Annotated[
        str | None,
        typer.Option(
            "--reranker",
            "-r",
            help="Quick start without --config: serve one reranker of this kind (dense, cis, "
            "distilled, ... or package.module:factory), named after the kind.",
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
) -> None:
    """Serve /v1/rerank (Cohere-compatible), /v1/search, /v1/models, /healthz, /readyz, /metrics.

    Quick start: cisrank serve --reranker dense --model all-MiniLM-L6-v2 --index indexes/msmarco.
    Several models: cisrank serve --config server.yaml.

    API keys: set CISRANK_API_KEYS=key1,key2 to require 'Authorization: Bearer <key>'.

    Stopping: SIGTERM (or Ctrl-C) stops taking connections and waits up to graceful_timeout_s
    (config, default 60) for the requests in flight; any still running then are answered 503 with
    Retry-After. Exit code 0 after a SIGTERM.
    """
    cfg = server_config(config, reranker, model, index or ())
    uvicorn = require("uvicorn", "serve", "cisrank serve")
    env.set_server_config_json(cfg.model_dump_json())
    signal.signal(signal.SIGTERM, _stopped_by_sigterm)
    uvicorn.run(
        "cisrank.api.app:create_app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        timeout_graceful_shutdown=cfg.graceful_timeout_s,
        log_config=None,
    )
