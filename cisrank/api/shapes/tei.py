"""Hugging Face text-embeddings-inference's shapes: its rerank (`POST /rerank` with `texts`) and
its endpoint info (`GET /info`); its health check is a route (`GET /health`).

TEI's rerank is the same ranking as Cohere's (same limits, cost and batching), answered as TEI's
list of `{index, score, text?}`, most relevant first; errors name `texts` where the engine names
`documents`.

`raw_scores: false` is TEI's activation of a classifier's logit: a sigmoid for one label
(`predict` in TEI's core/src/infer.rs; its /rerank serves classifiers only). A dense reranker's
score is a cosine, not a logit: a sigmoid would put every positive cosine above 0.5, so it is
answered as is, in [-1, 1], its order and scale those of `/v1/rerank` (TEI itself has no rule
for it; any map to [0, 1] would be invented).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cisrank.api.schemas import ServedRuntime, TeiInfo, TeiLabels, TeiRank, TeiRerankRequest
from cisrank.api.shapes.renaming import fields_renamed, query_of, renamed_list
from cisrank.serving.errors import InvalidField
from cisrank.serving.ranking import RankingService
from cisrank.serving.types import RerankerInfo, RerankQuery
from cisrank.version import __version__


def claims(body: Mapping[str, Any]) -> bool:
    """Whether a `POST /rerank` body is TEI's: `texts` where Cohere's has `documents`."""
    return "texts" in body and "documents" not in body


async def rerank(service: RankingService, body: TeiRerankRequest) -> list[TeiRank]:
    if body.truncation_direction in ("left", "Left"):
        raise InvalidField(
            "truncation_direction",
            "only 'right' is served: a pair is cut at the end of the text, at the model's length",
        )
    name = service.resolve(body.model)
    cosine = service.embeds(name)
    normalize = "none" if body.raw_scores or cosine else "sigmoid"
    with fields_renamed(renamed_list("documents", "texts")):
        query = query_of(
            RerankQuery,
            body,
            documents=body.texts,
            normalize=normalize,
            truncation=body.truncate is not False,
        )
        ranking = await service.rerank(query)
    return [
        TeiRank(
            index=r.index,
            score=r.score,
            text=body.texts[r.index] if body.return_text else None,
        )
        for r in ranking.results
    ]


def _runtime(described: RerankerInfo) -> ServedRuntime:
    return ServedRuntime(
        served_model_name=described.name,
        model_id=described.model,
        model_dtype=described.compute_type,
        model_runtime=described.runtime,
    )


def info(service: RankingService) -> TeiInfo:
    """TEI's `GET /info` for the default reranker, from what is loaded and configured (no value
    cisrank does not know: `model_sha` and the build's `sha` are null); and, beyond TEI's
    fields, the runtime and number format of /v1/embeddings' encoder and of every reranker."""
    described = service.describe()
    config = service.serving.config
    try:
        embeddings: ServedRuntime | None = _runtime(service.describe(service.embedder_name()))
    except InvalidField:  # no served reranker embeds
        embeddings = None
    return TeiInfo(
        model_id=described.model,
        model_dtype=described.compute_type,
        model_runtime=described.runtime,
        passage_cache=described.passage_cache,
        served_model_name=described.name,
        embeddings=embeddings,
        rerankers=[
            _runtime(service.describe(name))
            for name in config.rerankers
            if name in service.serving.rerankers  # an app given some of its rerankers
        ],
        model_type={"reranker": TeiLabels()},
        max_concurrent_requests=config.batching.max_queue,
        max_input_length=described.pair_token_limit,
        max_batch_tokens=config.batching.max_batch_tokens,
        max_client_batch_size=config.limits.max_documents,
        tokenization_workers=described.processes,
        version=__version__,
    )
