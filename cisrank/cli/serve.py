"""`cisrank serve`: the REST API under uvicorn.

The config is checked here (one-line error, exit 2) before uvicorn starts, then handed to every
worker through an environment variable, so `--workers N` builds N identical apps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cisrank import env
from cisrank.errors import CisrankError, require


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

    API keys: set CISRANK_API_KEYS=key1,key2 to require 'Authorization: Bearer <key>'.
    """
    from cisrank.api.config import ServerConfig
    from cisrank.rerank.registry import check_name

    cfg = ServerConfig.load(config) if config is not None else ServerConfig()
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
    uvicorn = require("uvicorn", "serve", "cisrank serve")
    env.set_server_config_json(cfg.model_dump_json())
    uvicorn.run(
        "cisrank.api.app:create_app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        timeout_graceful_shutdown=cfg.graceful_timeout_s,
        log_config=None,
    )
