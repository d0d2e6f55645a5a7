"""cisrank's own shapes: search (`POST /v1/search`), RAG context and generation (`POST
/v1/context`, `/v1/generate`) and the model list (`GET /v1/models`).

Their request bodies are the engine's queries (`cisrank.api.schemas` subclasses them) and go to
the engine as they are. A context's documents (and its noise pool's) are strings or objects
`{text, title?, id?}`; a document's text is blamed as the client sent it (`documents.3` for a
string, `documents.3.text` for an object).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence

from cisrank.api.schemas import (
    ContextCandidate,
    ContextGauge,
    ContextRequest,
    ContextResponse,
    ContextUsage,
    GenerateRequest,
    GenerateResponse,
    GenerateUsage,
    IndexCard,
    ModelCard,
    ModelList,
    NoiseOut,
    RerankChoice,
    RerankUsage,
    SearchRequest,
    SearchResponse,
    SearchResult,
)
from cisrank.api.shapes.renaming import Rename, fields_renamed, item_texts
from cisrank.serving import types
from cisrank.serving.assembly import ContextService
from cisrank.serving.ranking import RankingService


def models(service: RankingService) -> ModelList:
    catalog = service.catalog()
    return ModelList(
        data=[
            ModelCard(
                id=r.name,
                kind=r.kind,
                model=r.model,
                ready=r.ready,
                runtime=r.runtime,
                dtype=r.compute_type,
            )
            for r in catalog.rerankers
        ],
        indexes=[IndexCard(id=i.name, kind=i.kind) for i in catalog.indexes],
        default=catalog.default,
        embeddings=catalog.embeddings,
    )


async def search(service: RankingService, body: SearchRequest) -> SearchResponse:
    found = await service.search(body)
    return SearchResponse(
        id=str(uuid.uuid4()),
        index=found.index,
        model=found.reranker,
        results=[SearchResult.model_validate(r, from_attributes=True) for r in found.results],
        usage=RerankUsage.counted(found.documents, found.chunks),
    )


# ---- context and generation


def _choice(pick: types.RerankPick | None) -> RerankChoice | None:
    return RerankChoice.model_validate(pick, from_attributes=True) if pick is not None else None


def _texts_as_sent(body: ContextRequest | GenerateRequest) -> Rename:
    lists: dict[str, Sequence[object]] = {"documents": body.documents}
    if isinstance(body, ContextRequest) and body.noise and body.noise.documents is not None:
        lists["noise.documents"] = body.noise.documents
    return item_texts(lists, objects=True)


async def context(
    service: ContextService, body: ContextRequest, cancel: threading.Event | None = None
) -> ContextResponse:
    with fields_renamed(_texts_as_sent(body)):
        arranged = await service.context(body, cancel)
    return ContextResponse(
        id=str(uuid.uuid4()),
        model=arranged.reranker,
        arrange=arranged.arrange,
        template=arranged.template,
        order=arranged.order,
        ids=arranged.ids,
        scores=arranged.scores,
        candidates=[
            ContextCandidate(order=c.order, mean_logprob=c.mean_logprob)
            for c in arranged.candidates
        ],
        noise=[NoiseOut(id=p.docid, title=p.title, text=p.text) for p in arranged.noise],
        gauge=ContextGauge(**arranged.gauge.to_json()),
        prompt=arranged.prompt,
        rerank=_choice(arranged.rerank),
        usage=ContextUsage(
            documents=arranged.documents,
            noise=len(arranged.noise),
            prompts_scored=arranged.prompts_scored,
            prompt_tokens=arranged.prompt_tokens,
        ),
    )


async def generate(
    service: ContextService, body: GenerateRequest, cancel: threading.Event | None = None
) -> GenerateResponse:
    with fields_renamed(_texts_as_sent(body)):
        answer = await service.generate(body, cancel)
    return GenerateResponse(
        id=str(uuid.uuid4()),
        model=answer.reranker,
        decoding=answer.decoding,
        order=answer.order,
        answer=answer.answer,
        tokens=answer.tokens,
        attribution=answer.attribution,
        weights=answer.weights,
        layers=answer.layers,
        rerank=_choice(answer.rerank),
        usage=GenerateUsage(
            documents=answer.documents,
            prompt_tokens=answer.prompt_tokens,
            generated_tokens=answer.generated_tokens,
        ),
    )
