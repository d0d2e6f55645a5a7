"""The rerank and search service, apart from HTTP: what a request means, not how it travels.

Why apart: the ranking rules (which reranker a `model` names, the limits, truncation, scoring
through the batcher, normalization, ranking, the response) are the product; FastAPI is one way
to reach them. Keeping this module free of any web framework (an import-linter contract checks
it) lets it be driven by other transports and tested without a server, and keeps the routes in
`cisrank.api.routes` thin: validate, call the service, map its errors to status codes.

The service is composed from the parts every service shares (`cisrank.api.serving.Serving`:
rerankers, batchers, indexes, limits, readiness) and does its model work through
`cisrank.api.model_thread.ModelThread`. Errors are raised as `ServiceError` subclasses
(`cisrank.api.service_errors`) that say what went wrong, never which status code it is;
`cisrank.api.routes` owns that mapping.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import uuid
from collections.abc import Callable, Sequence

import numpy as np

from cisrank.api.schemas import (
    DocumentIn,
    EmbeddingOut,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
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
    TeiInfo,
    TeiLabels,
    TeiRank,
    TeiRerankRequest,
    Usage,
)
from cisrank.api.service_errors import BackendFailed, InvalidField, TimedOut
from cisrank.api.serving import (
    Serving,
    embedding_dimensions,
    processes,
    public_model_id,
    text_embedder,
)
from cisrank.api.token_count import OverBudget
from cisrank.data.types import rank_order
from cisrank.rerank.base import Reranker
from cisrank.version import __version__

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------- scores


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


def _embed(embed: Callable[[Sequence[str]], np.ndarray], texts: Sequence[str]) -> np.ndarray:
    """In the model thread: unit-length float32 embeddings of `texts`."""
    return np.asarray(embed(texts), dtype=np.float32)


def _usage_tokens(reranker: Reranker, counts: Sequence[int], cap: int | None) -> int:
    """The tokens the model read of texts of `counts` tokens: with its special tokens, each
    capped at its length (what its tokenizer gives with truncation)."""
    tokenizer = reranker.fast_tokenizer
    special = tokenizer.num_special_tokens_to_add(pair=False) if tokenizer is not None else 0
    return sum(min(n + special, cap) if cap else n + special for n in counts)


def _batches(costs: Sequence[int], max_items: int, max_tokens: int) -> list[range]:
    """Consecutive ranges of at most `max_items` items and `max_tokens` tokens (an item over it
    alone): one model-thread call each."""
    out: list[range] = []
    start = used = 0
    for i, cost in enumerate(costs):
        if i > start and (i - start >= max_items or used + cost > max_tokens):
            out.append(range(start, i))
            start, used = i, 0
        used += cost
    if start < len(costs):
        out.append(range(start, len(costs)))
    return out


class RankingService:
    """Answers rerank, search, embeddings and model-list requests over the shared `Serving`
    parts."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    def models(self) -> ModelList:
        """The rerankers (by the name a request's `model` takes) and indexes served here."""
        serving = self.serving
        config = serving.config
        cards = []
        for name, spec in config.rerankers.items():
            model_id = serving.served_model(name)
            cards.append(
                ModelCard(
                    id=name,
                    kind=spec.kind,
                    model=public_model_id(model_id) or "",
                    ready=serving.ready,
                )
            )
        names = list(config.indexes) or list(serving.retrievers)
        indexes = []
        for n in names:
            retriever = serving.retrievers.get(n)
            indexes.append(IndexCard(id=n, kind=retriever.name if retriever is not None else None))
        return ModelList(data=cards, indexes=indexes, default=config.default_reranker_name)

    def info(self) -> TeiInfo:
        """TEI's `GET /info` for the default reranker, from what is loaded and configured (no
        value cisrank does not know: `model_sha` and the build's `sha` are null)."""
        serving = self.serving
        serving.check_ready()
        config = serving.config
        name = config.default_reranker_name
        reranker = serving.rerankers[name]
        return TeiInfo(
            model_id=public_model_id(serving.served_model(name)) or name,
            model_dtype=reranker.compute_type,
            served_model_name=name,
            model_type={"reranker": TeiLabels()},
            max_concurrent_requests=config.batching.max_queue,
            max_input_length=reranker.pair_token_limit,
            max_batch_tokens=config.batching.max_batch_tokens,
            max_client_batch_size=config.limits.max_documents,
            tokenization_workers=processes(reranker),
            version=__version__,
        )

    # ---- scoring

    async def _score(
        self,
        name: str,
        query: str,
        texts: list[str],
        field: str = "documents",
        tokens: Sequence[int] | None = None,
    ) -> list[float]:
        """Scores through the batcher (`ModelThread.score`), finite for JSON."""
        return _finite(await self.serving.model_thread(name).score(query, texts, field, tokens))

    async def rerank(self, body: RerankRequest) -> RerankResponse:
        """Rank `documents` for `query`, most relevant first."""
        serving = self.serving
        limits = serving.config.limits
        name = serving.resolve_reranker(body.model)
        serving.check_query(body.query)
        if len(body.documents) > limits.max_documents:
            raise InvalidField(
                "documents",
                f"{len(body.documents)} documents, over the limit of {limits.max_documents}: "
                "send them in several requests",
            )
        texts: list[str] = []
        for i, doc in enumerate(body.documents):
            text = doc.text if isinstance(doc, DocumentIn) else doc
            if len(text) > limits.max_document_chars:
                where = f"documents.{i}.text" if isinstance(doc, DocumentIn) else f"documents.{i}"
                raise InvalidField(
                    where,
                    f"{len(text)} characters, over the limit of {limits.max_document_chars}: "
                    "split the document",
                )
            texts.append(text)
        scored, tokens, truncated = await serving.pair_costs(
            name, body.query, texts, "documents", body.max_tokens_per_doc
        )
        raw = await self._score(name, body.query, scored, tokens=tokens)
        shown = normalize_scores(raw, body.normalize or serving.config.normalize)
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

    async def rerank_tei(self, body: TeiRerankRequest) -> list[TeiRank]:
        """Hugging Face TEI's `POST /rerank`: the same ranking as `rerank` (same limits, cost
        and batching), answered as TEI's list of `{index, score, text?}`, most relevant first;
        errors name `texts` where `rerank` names `documents`.

        `raw_scores: false` is TEI's activation of a classifier's logit: a sigmoid for one
        label (`predict` in TEI's core/src/infer.rs; its /rerank serves classifiers only). A
        dense reranker's score is a cosine, not a logit: a sigmoid would put every positive
        cosine above 0.5, so it is answered as is, in [-1, 1], its order and scale those of
        `/v1/rerank` (TEI itself has no rule for it; any map to [0, 1] would be invented)."""
        if body.truncation_direction in ("left", "Left"):
            raise InvalidField(
                "truncation_direction",
                "only 'right' is served: a pair is cut at the end of the text, at the model's "
                "length",
            )
        name = self.serving.resolve_reranker(body.model)
        self.serving.check_ready()
        cosine = text_embedder(self.serving.rerankers[name]) is not None
        request = RerankRequest(
            query=body.query,
            documents=list(body.texts),
            model=body.model,
            normalize="none" if body.raw_scores or cosine else "sigmoid",
        )
        try:
            answer = await self.rerank(request)
        except InvalidField as exc:
            if exc.field == "documents" or exc.field.startswith("documents."):
                raise InvalidField("texts" + exc.field[len("documents") :], exc.detail) from None
            raise
        return [
            TeiRank(
                index=r.index,
                score=r.relevance_score,
                text=body.texts[r.index] if body.return_text else None,
            )
            for r in answer.results
        ]

    def _embedder(self, requested: str | None) -> str:
        """The reranker whose bi-encoder embeds: the one named, else the default if it has one,
        else the first served that has one."""
        serving = self.serving
        serving.check_ready()
        able = [n for n in serving.config.rerankers if text_embedder(serving.rerankers[n])]
        if requested is None:
            default = serving.config.default_reranker_name
            name = default if default in able or not able else able[0]
        elif requested in serving.config.rerankers:
            name = requested
        else:  # a model id: the reranker that embeds with it, before any other that serves it
            try:
                name = serving.resolve_reranker(requested, among=able)
            except InvalidField:
                name = serving.resolve_reranker(requested)
        if name not in able:
            raise InvalidField(
                "model",
                f"reranker '{name}' has no bi-encoder to embed with: /v1/embeddings needs a "
                f"dense reranker (served here: {', '.join(able) or 'none'})",
            )
        return name

    async def embeddings(self, body: EmbeddingsRequest) -> EmbeddingsResponse:
        """OpenAI's embeddings of one or more texts with a served dense reranker's encoder
        (no query or passage prefix), bounded like a rerank request, every bound checked before
        anything is embedded: `dimensions` against the model's, `limits.max_documents` texts of
        `limits.max_document_chars`, their tokens (each capped at the model's length, counted
        with its tokenizer) against `limits.max_request_cost`; admitted and timed out in the
        reranker's model thread, embedded in slices (`BatchScorer.slice_tokens`)."""
        serving = self.serving
        config = serving.config
        limits = config.limits
        name = self._embedder(body.model)
        reranker = serving.rerankers[name]
        dimensions = embedding_dimensions(reranker)
        if body.dimensions is not None and dimensions is not None and body.dimensions != dimensions:
            raise InvalidField(
                "dimensions",
                f"{body.dimensions}: this model's embeddings have {dimensions} dimensions (they "
                "cannot be shortened here)",
            )
        single = isinstance(body.input, str)
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        if not texts:
            raise InvalidField("input", "give at least one text")
        if len(texts) > limits.max_documents:
            raise InvalidField(
                "input",
                f"{len(texts)} texts, over the limit of {limits.max_documents}: send them in "
                "several requests",
            )
        for i, text in enumerate(texts):
            where = "input" if single else f"input.{i}"
            if not text.strip():
                raise InvalidField(where, "must not be empty or whitespace only")
            if len(text) > limits.max_document_chars:
                raise InvalidField(
                    where,
                    f"{len(text)} characters, over the limit of {limits.max_document_chars}",
                )
        embed = text_embedder(reranker)
        assert embed is not None
        cap = reranker.pair_token_limit
        counter = serving.counter(name)
        timeout = config.batching.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                measured = await counter.measure(texts, limit=cap, budget=limits.max_request_cost)
        except OverBudget as exc:
            raise InvalidField(
                "input",
                f"cost {'at least ' if exc.at_least else ''}{exc.cost} {counter.unit} (each "
                f"text capped at the model's length) is over the limit of "
                f"{limits.max_request_cost}: send fewer or shorter texts",
            ) from None
        except TimeoutError:
            raise TimedOut(
                f"not counted within {timeout:g} s: the server is overloaded, retry later"
            ) from None
        costs = measured.counts
        model = serving.model_thread(name)
        late = f"not embedded within {timeout:g} s: the server is overloaded, retry later"
        parts: list[np.ndarray] = []
        batching = config.batching
        async with model.admitted(sum(costs), late):
            for part in _batches(costs, batching.max_batch_passages, model.slice_tokens()):
                chunk = texts[part.start : part.stop]
                tokens = sum(costs[part.start : part.stop])
                parts.append(await model.run_slice(tokens, _embed, embed, chunk))
        matrix = np.concatenate(parts)
        if body.dimensions is not None and body.dimensions != matrix.shape[1]:
            raise InvalidField(
                "dimensions",
                f"{body.dimensions}: this model's embeddings have {matrix.shape[1]} "
                "dimensions (they cannot be shortened here)",
            )
        tokens = _usage_tokens(reranker, costs, cap)
        if body.encoding_format == "base64":
            data = [
                EmbeddingOut(
                    index=i, embedding=base64.b64encode(row.astype("<f4").tobytes()).decode()
                )
                for i, row in enumerate(matrix)
            ]
        else:
            data = [EmbeddingOut(index=i, embedding=row.tolist()) for i, row in enumerate(matrix)]
        return EmbeddingsResponse(
            data=data,
            model=name,
            usage=EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens),
        )

    async def search(self, body: SearchRequest) -> SearchResponse:
        """First-stage search over a configured index, optionally reranked."""
        serving = self.serving
        config = serving.config
        limits = config.limits
        retrievers = serving.retrievers
        serving.check_ready()
        if not retrievers:
            raise InvalidField("index", "no index is configured on this server")
        index = body.index or config.default_index_name or next(iter(retrievers))
        if index not in retrievers:
            raise InvalidField(
                "index",
                f"'{index[:100]}' is not served here: choose one of {', '.join(retrievers)}",
            )
        reranker = serving.resolve_reranker(body.rerank, "rerank") if body.rerank else None
        serving.check_query(body.query)
        if body.top_n > limits.max_search_top_n:
            raise InvalidField(
                "top_n", f"{body.top_n} is over the limit of {limits.max_search_top_n}"
            )
        depth = body.depth or (max(body.top_n, 100) if reranker else body.top_n)
        depth = min(depth, limits.max_search_top_n) if body.depth is None else depth
        if depth > limits.max_search_top_n:
            raise InvalidField("depth", f"{depth} is over the limit of {limits.max_search_top_n}")
        if depth < body.top_n:
            raise InvalidField("depth", f"{depth} is smaller than top_n={body.top_n}")
        try:
            hits = await asyncio.to_thread(retrievers[index].search, body.query, depth)
        except Exception as exc:
            # A damaged index or document store: the server's fault, never the client's.
            log.error("index %s failed on a search: %s", index, exc, exc_info=True)
            raise BackendFailed(
                f"index '{index}' failed to answer; details are in the server log"
            ) from None
        if reranker is not None and hits:
            passages = [h.text for h in hits]
            _, tokens, _ = await serving.pair_costs(reranker, body.query, passages, "depth")
            raw = await self._score(reranker, body.query, passages, "query", tokens)
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
