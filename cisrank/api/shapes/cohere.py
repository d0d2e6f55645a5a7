"""Cohere's and Jina's rerank shape (`POST /v1/rerank`, `/v2/rerank`, and `/rerank` for a body
that is not TEI's), the one vLLM, LiteLLM, infinity and the Cohere SDKs speak.

A document is a string or an object `{text, id?, ...}`: its text is ranked; its id, and with
`return_documents` its other fields, come back with its result. A document's text over the limit
is blamed as the client sent it: `documents.3` for a string, `documents.3.text` for an object.
With `rank_fields`, each document is ranked by those fields' `field: value` lines, rendered by
the library's own function (`cisrank.rerank.fields.render_all`); an object then needs no
`text`, and one without a field named is a 422 naming `documents.N.FIELD`.
"""

from __future__ import annotations

import uuid

from cisrank.api.schemas import (
    BestChunkOut,
    DocumentIn,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
)
from cisrank.api.shapes.renaming import fields_renamed, item_texts, query_of
from cisrank.rerank.fields import MissingField, render_all
from cisrank.serving.errors import InvalidField
from cisrank.serving.ranking import RankingService
from cisrank.serving.types import Ranking, RerankQuery


def text_of(document: str | DocumentIn) -> str | None:
    return document.text if isinstance(document, DocumentIn) else document


def ranked_texts(body: RerankRequest) -> list[str]:
    """What is ranked of each document: its text, or with `rank_fields` its fields' lines."""
    if body.rank_fields is None:
        texts = []
        for i, doc in enumerate(body.documents):
            text = text_of(doc)
            if text is None:
                raise InvalidField(
                    f"documents.{i}.text", "give the text to rank, or rank_fields to rank by"
                )
            texts.append(text)
        return texts
    records = [
        {**(d.model_extra or {}), **d.model_dump(exclude_none=True)}
        if isinstance(d, DocumentIn)
        else d
        for d in body.documents
    ]
    try:
        return render_all(records, body.rank_fields)
    except MissingField as exc:
        raise InvalidField(f"documents.{exc.index}.{exc.field}", str(exc)) from None


def response_of(ranking: Ranking, body: RerankRequest, texts: list[str]) -> RerankResponse:
    """The answer: each result with its document's id, and the document itself (its text and
    every field it was sent with) when `return_documents` asks."""
    results = []
    for ranked in ranking.results:
        doc = body.documents[ranked.index]
        doc_id = doc.id if isinstance(doc, DocumentIn) else None
        document = None
        if body.return_documents:
            fields = dict(doc.model_extra or {}) if isinstance(doc, DocumentIn) else {}
            if doc_id is not None:
                fields["id"] = doc_id
            document = RerankDocument(text=text_of(doc), **fields)
        best = None
        if (chunk := ranked.best_chunk) is not None:
            ranked_text = texts[ranked.index]
            # a document read whole has its text in `document` already: not sent twice
            part = (chunk.start, chunk.end) != (0, len(ranked_text))
            text = ranked_text[chunk.start : chunk.end] if body.return_documents and part else None
            best = BestChunkOut(start=chunk.start, end=chunk.end, score=chunk.score, text=text)
        results.append(
            RerankResult(
                index=ranked.index,
                relevance_score=ranked.score,
                id=doc_id,
                document=document,
                best_chunk=best,
            )
        )
    chunks = ranking.chunks
    return RerankResponse(
        id=str(uuid.uuid4()),
        model=ranking.reranker,
        results=results,
        usage=RerankUsage.counted(ranking.documents, chunks, ranking.truncated),
    )


async def rerank(service: RankingService, body: RerankRequest) -> RerankResponse:
    texts = ranked_texts(body)
    with fields_renamed(item_texts({"documents": body.documents}, objects=False)):
        query = query_of(RerankQuery, body, documents=texts)
        ranking = await service.rerank(query)
    return response_of(ranking, body, texts)
