"""Rerank, embed and search, apart from HTTP: what a request means, not how it travels.

Why apart: the ranking rules (which reranker a `model` names, the limits, truncation, scoring
through the batcher, normalization, ranking) are the product; a REST shape is one way to reach
them. This module takes and returns the plain values of `cisrank.serving.types` (each wire shape
has its converter in `cisrank.api.shapes`), so it can be driven by any transport, or from Python,
and tested without a server.

The service is composed from the parts every service shares (`cisrank.serving.engine.Serving`:
rerankers, batchers, indexes, limits, readiness) and does its model work through
`cisrank.serving.model_thread.ModelThread`. Errors are raised as `ServiceError` subclasses
(`cisrank.serving.errors`) that say what went wrong, never which status code it is;
`cisrank.api.routes` owns that mapping.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence

import numpy as np

from cisrank.data.types import BestChunk, top_order
from cisrank.fusion import minmax, sigmoid
from cisrank.rerank.base import Reranker
from cisrank.rerank.chunking import ChunkPlan, ChunkUsage, Pooling, pool
from cisrank.serving.engine import (
    Serving,
    embedding_dimensions,
    processes,
    public_model_id,
    text_embedder,
)
from cisrank.serving.errors import BackendFailed, InvalidField, TimedOut
from cisrank.serving.token_count import OverBudget
from cisrank.serving.types import (
    BLANK,
    Catalog,
    Embeddings,
    EmbedQuery,
    FoundPassage,
    RankedDocument,
    Ranking,
    RerankerInfo,
    RerankQuery,
    SearchQuery,
    SearchResults,
    ServedIndex,
    ServedReranker,
    is_blank,
)

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------- scores


def normalize_scores(scores: Sequence[float], how: str) -> list[float]:
    """Opt-in normalization; `none` keeps raw scores (CIS is a log-ratio, not a probability).
    Min-max over one request's scores shows a list it cannot spread as all 1 (all as good as
    the best)."""
    if how == "sigmoid":
        return sigmoid(scores)
    if how == "minmax":
        return minmax(scores, constant=1.0)
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
    """Answers rerank, embed, search and what-is-served questions over the shared `Serving`
    parts."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    def catalog(self) -> Catalog:
        """The rerankers (by the name a query's `model` takes) and indexes served here, with
        the runtime and number format of each once loaded."""
        serving = self.serving
        config = serving.config
        rerankers = []
        for name, spec in config.rerankers.items():
            loaded = serving.rerankers.get(name)
            rerankers.append(
                ServedReranker(
                    name=name,
                    kind=spec.kind,
                    model=public_model_id(serving.served_model(name)) or "",
                    ready=serving.ready,
                    runtime=loaded.runtime if loaded is not None else None,
                    compute_type=loaded.compute_type if loaded is not None else None,
                )
            )
        names = list(config.indexes) or list(serving.retrievers)
        indexes = []
        for n in names:
            retriever = serving.retrievers.get(n)
            indexes.append(ServedIndex(name=n, kind=retriever.name if retriever else None))
        embeddings = None
        if serving.ready:
            try:
                embeddings = self.embedder_name()
            except InvalidField:  # nothing served embeds
                embeddings = None
        return Catalog(
            rerankers=rerankers,
            indexes=indexes,
            default=config.default_reranker_name,
            embeddings=embeddings,
        )

    def describe(self, name: str | None = None) -> RerankerInfo:
        """What is loaded and configured of reranker `name` (default: the default reranker)."""
        serving = self.serving
        serving.check_ready()
        name = name or serving.config.default_reranker_name
        reranker = serving.rerankers[name]
        return RerankerInfo(
            name=name,
            model=public_model_id(serving.served_model(name)) or name,
            compute_type=reranker.compute_type,
            runtime=reranker.runtime,
            pair_token_limit=reranker.pair_token_limit,
            processes=processes(reranker),
            passage_cache=cache.stats() if (cache := reranker.passage_cache) is not None else None,
        )

    def resolve(self, model: str | None) -> str:
        """The served reranker a query's `model` names (`Serving.resolve_reranker`)."""
        return self.serving.resolve_reranker(model)

    def embeds(self, name: str) -> bool:
        """Whether reranker `name` has a bi-encoder (its scores are cosines, not logits)."""
        self.serving.check_ready()
        return text_embedder(self.serving.rerankers[name]) is not None

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

    async def _pooled(
        self,
        name: str,
        query: str,
        texts: list[str],
        plan: ChunkPlan,
        tokens: Sequence[int],
        pooling: Pooling,
        field: str = "documents",
    ) -> list[tuple[float, BestChunk]]:
        """Every planned window of `texts` scored through the batcher, pooled per document
        (`cisrank.rerank.chunking.pool`): what `/v1/rerank` and a reranked `/v1/search` rank."""
        windows = await self._score(name, query, plan.texts(texts), field, tokens)
        return pool(plan, windows, pooling)

    async def rerank(self, q: RerankQuery) -> Ranking:
        """Rank `q.documents` for `q.query`, most relevant first."""
        serving = self.serving
        limits = serving.config.limits
        name = serving.resolve_reranker(q.model)
        serving.check_query(q.query)
        if len(q.documents) > limits.max_documents:
            raise InvalidField(
                "documents",
                f"{len(q.documents)} documents, over the limit of {limits.max_documents}: "
                "send them in several requests",
            )
        for i, text in enumerate(q.documents):
            if len(text) > limits.max_document_chars:
                raise InvalidField(
                    f"documents.{i}",
                    f"{len(text)} characters, over the limit of {limits.max_document_chars}: "
                    "split the document",
                )
        texts = list(q.documents)
        if all(is_blank(text) for text in texts):  # nothing to rank: scores of nothing
            raise InvalidField(
                "documents",
                "every document is blank (only whitespace, control or zero-width characters): "
                "send at least one with visible text",
            )
        scored, _, truncated = await serving.pair_costs(
            name, q.query, texts, "documents", q.max_tokens_per_doc
        )
        chunking = serving.config.chunking.replace(max_chunks_per_doc=q.max_chunks_per_doc)
        plan, tokens = await serving.window_costs(name, q.query, scored, "documents", chunking)
        if not q.truncation and (too_long := plan.too_long()) is not None:
            raise InvalidField(
                f"documents.{too_long}",
                f"does not fit the model's window of {plan.window} tokens with this query (it "
                f"is {plan.windows[too_long]} windows long), and truncation is off: shorten it, "
                "or allow truncation to score it by its best window",
            )
        pooled = await self._pooled(name, q.query, scored, plan, tokens, chunking.pooling)
        raw = [score for score, _ in pooled]
        shown = normalize_scores(raw, q.normalize or serving.config.normalize)
        return Ranking(
            reranker=name,
            results=[RankedDocument(i, shown[i], pooled[i][1]) for i in top_order(raw, q.top_n)],
            documents=len(texts),
            truncated=truncated,
            chunks=plan.usage,
        )

    def embedder_name(self, requested: str | None = None) -> str:
        """The reranker whose bi-encoder embeds: the one named; for a request without `model`,
        `embeddings` of the config, else the default if it has one, else the first served that
        has one; for a model id, the reranker that embeds with it, `embeddings` before the
        others (the default server's float32 encoder, not its int8 reranker of the same
        model), then any other that serves it."""
        serving = self.serving
        serving.check_ready()
        config = serving.config
        able = [n for n in config.rerankers if text_embedder(serving.rerankers[n])]
        chosen = config.embeddings
        first = [chosen] if chosen in able else []
        if requested is None:
            default = config.default_reranker_name
            name = first[0] if first else default if default in able or not able else able[0]
        elif requested in config.rerankers:
            name = requested
        else:  # a model id
            try:
                name = serving.resolve_reranker(
                    requested, among=[*first, *(n for n in able if n != chosen)]
                )
            except InvalidField:
                name = serving.resolve_reranker(requested)
        if name not in able:
            raise InvalidField(
                "model",
                f"reranker '{name}' has no bi-encoder to embed with: /v1/embeddings needs a "
                f"dense reranker (served here: {', '.join(able) or 'none'})",
            )
        return name

    async def embed(self, q: EmbedQuery) -> Embeddings:
        """Embeddings of one or more texts with a served dense reranker's encoder (no query or
        passage prefix), bounded like a rerank request, every bound checked before anything is
        embedded: `dimensions` against the model's, `limits.max_documents` texts of
        `limits.max_document_chars`, their tokens (each capped at the model's length, counted
        with its tokenizer) against `limits.max_request_cost`; admitted and timed out in the
        reranker's model thread, embedded in slices (`BatchScorer.slice_tokens`)."""
        serving = self.serving
        config = serving.config
        limits = config.limits
        name = self.embedder_name(q.model)
        reranker = serving.rerankers[name]
        dimensions = embedding_dimensions(reranker)
        if q.dimensions is not None and dimensions is not None and q.dimensions != dimensions:
            raise InvalidField(
                "dimensions",
                f"{q.dimensions}: this model's embeddings have {dimensions} dimensions (they "
                "cannot be shortened here)",
            )
        texts = list(q.texts)
        if not texts:
            raise InvalidField("texts", "give at least one text")
        if len(texts) > limits.max_documents:
            raise InvalidField(
                "texts",
                f"{len(texts)} texts, over the limit of {limits.max_documents}: send them in "
                "several requests",
            )
        for i, text in enumerate(texts):
            if is_blank(text):
                raise InvalidField(f"texts.{i}", BLANK)
            if len(text) > limits.max_document_chars:
                raise InvalidField(
                    f"texts.{i}",
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
                "texts",
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
        if q.dimensions is not None and q.dimensions != matrix.shape[1]:
            raise InvalidField(
                "dimensions",
                f"{q.dimensions}: this model's embeddings have {matrix.shape[1]} "
                "dimensions (they cannot be shortened here)",
            )
        return Embeddings(reranker=name, vectors=matrix, tokens=_usage_tokens(reranker, costs, cap))

    async def search(self, q: SearchQuery) -> SearchResults:
        """First-stage search over a configured index, optionally reranked."""
        serving = self.serving
        config = serving.config
        limits = config.limits
        retrievers = serving.retrievers
        serving.check_ready()
        if not retrievers:
            raise InvalidField("index", "no index is configured on this server")
        index = q.index or config.default_index_name or next(iter(retrievers))
        if index not in retrievers:
            raise InvalidField(
                "index",
                f"'{index[:100]}' is not served here: choose one of {', '.join(retrievers)}",
            )
        reranker = serving.resolve_reranker(q.rerank, "rerank") if q.rerank else None
        serving.check_query(q.query)
        if q.top_n > limits.max_search_top_n:
            raise InvalidField("top_n", f"{q.top_n} is over the limit of {limits.max_search_top_n}")
        depth = q.depth or (max(q.top_n, 100) if reranker else q.top_n)
        depth = min(depth, limits.max_search_top_n) if q.depth is None else depth
        if depth > limits.max_search_top_n:
            raise InvalidField("depth", f"{depth} is over the limit of {limits.max_search_top_n}")
        if depth < q.top_n:
            raise InvalidField("depth", f"{depth} is smaller than top_n={q.top_n}")
        try:
            hits = await asyncio.to_thread(retrievers[index].search, q.query, depth)
        except Exception as exc:
            # A damaged index or document store: the server's fault, never the client's.
            log.error("index %s failed on a search: %s", index, exc, exc_info=True)
            raise BackendFailed(
                f"index '{index}' failed to answer; details are in the server log"
            ) from None
        chunks = ChunkUsage()
        best: list[BestChunk | None] = [None] * len(hits)
        if reranker is not None and hits:
            passages = [h.text for h in hits]
            plan, tokens = await serving.window_costs(
                reranker, q.query, passages, "depth", config.chunking
            )
            pooled = await self._pooled(
                reranker, q.query, passages, plan, tokens, config.chunking.pooling, "query"
            )
            raw = [score for score, _ in pooled]
            best = [chunk for _, chunk in pooled]
            chunks = plan.usage
            order = top_order(raw, q.top_n)
            shown = normalize_scores(raw, q.normalize or config.normalize)
        else:
            raw = shown = []
            order = list(range(min(q.top_n, len(hits))))
        results = []
        for rank, i in enumerate(order, 1):
            hit = hits[i]
            first = _finite([float(hit.score)])[0]
            results.append(
                FoundPassage(
                    rank=rank,
                    docid=str(hit.docid),
                    text=hit.text,
                    score=shown[i] if reranker else first,
                    retrieval_score=first,
                    rerank_score=raw[i] if reranker else None,
                    best_chunk=best[i],
                )
            )
        return SearchResults(
            index=index, reranker=reranker, results=results, documents=len(hits), chunks=chunks
        )
