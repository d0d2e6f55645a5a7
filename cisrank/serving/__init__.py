"""The serving engine: what `cisrank serve` serves, without the web.

`Serving` holds the loaded rerankers with their batchers (`BatchScorer`) and model threads, the
indexes, the configuration (`ServerConfig`), metrics and readiness; `RankingService` (rerank,
embed, search) and `ContextService` (RAG context, generation) answer plain queries with plain
results (`cisrank.serving.types`: a query carries its limits, refused as an `InvalidField` where
it is made) and raise `ServiceError`s that say what went wrong, never which status code it is.
`preflight(config)` is the check of every index, prior store and recorded model before anything
is served.

`cisrank.api` reaches this engine over HTTP, one converter per wire shape; an application can
embed it without a web framework (an import-linter contract keeps FastAPI and Starlette out)::

    from cisrank.serving import RankingService, RerankQuery, ServerConfig, Serving

    serving = Serving(ServerConfig.load("server.yaml"))
    serving.start_loading()  # the pre-start checks, then every model and index, in a thread
    ...  # serving.wait_ready(timeout)
    ranking = await RankingService(serving).rerank(RerankQuery(query="q", documents=["a", "b"]))
    ranking.results[0].index, ranking.results[0].score

`cisrank.api.app.create_app(serving=serving)` serves such an engine over HTTP.
"""

from __future__ import annotations

from cisrank.serving.assembly import ContextService
from cisrank.serving.checks import PreflightError, preflight
from cisrank.serving.config import BatchingConfig, IndexSpec, Limits, RerankerSpec, ServerConfig
from cisrank.serving.engine import Serving
from cisrank.serving.errors import ServiceError
from cisrank.serving.metrics import Metrics
from cisrank.serving.ranking import RankingService
from cisrank.serving.types import (
    ContextQuery,
    EmbedQuery,
    GenerateQuery,
    RerankQuery,
    SearchQuery,
)

__all__ = [
    "BatchingConfig",
    "ContextQuery",
    "ContextService",
    "EmbedQuery",
    "GenerateQuery",
    "IndexSpec",
    "Limits",
    "Metrics",
    "PreflightError",
    "RankingService",
    "RerankQuery",
    "RerankerSpec",
    "SearchQuery",
    "ServerConfig",
    "ServiceError",
    "Serving",
    "preflight",
]
