"""The rerank and search service, apart from HTTP: what a request means, not how it travels.

Why apart: the ranking rules (which reranker a `model` names, the limits, truncation, scoring
through the batcher, normalization, ranking, the response) are the product; FastAPI is one way
to reach them. Keeping this module free of any web framework (an import-linter contract checks
it) lets it be driven by other transports and tested without a server, and keeps the routes in
`cisrank.api.routes` thin: validate, call the service, map its errors to status codes.

Errors are raised as `ServiceError` subclasses that say what went wrong, never which status code
it is; `cisrank.api.routes` owns that mapping.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from cisrank.api.batching import BatchScorer, QueueFullError, ScoringFailed, ScoringTimeout
from cisrank.api.config import RerankerSpec, ServerConfig
from cisrank.api.metrics import Metrics
from cisrank.api.schemas import (
    ContextRequest,
    ContextResponse,
    DocumentIn,
    GenerateRequest,
    GenerateResponse,
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
    Usage,
)
from cisrank.api.truncate import find_tokenizer, truncate_texts
from cisrank.data.types import rank_order
from cisrank.errors import CisrankError
from cisrank.rerank.base import Reranker
from cisrank.retrieval.base import Retriever

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------- errors


class ServiceError(Exception):
    """A request the service cannot answer; the transport decides how to say so."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidField(ServiceError):
    """A field of the request is out of its limits or names something not served here."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


class NotReady(ServiceError):
    """The models are still loading, or loading them failed."""


class LoadFailed(ServiceError):
    """A configured model or index failed to load: permanent until the server is restarted with
    a fixed configuration, so never answered with "retry in N seconds"."""


class Overloaded(ServiceError):
    """Too many requests are already waiting for the reranker."""


class TimedOut(ServiceError):
    """The request was not scored within its timeout."""


class BackendFailed(ServiceError):
    """A served component (an index, its document store) failed: the server's fault, not the
    request's. The message names the component only; the exception is logged."""


# --------------------------------------------------------------------------- model loading


def build_reranker(spec: RerankerSpec) -> Reranker:
    """A reranker from its spec: a registry kind, or a `module:factory` import path."""
    if ":" in spec.kind:
        module_name, _, attr = spec.kind.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise CisrankError(f"reranker kind '{spec.kind}' cannot be imported: {exc}") from exc
        return factory(spec.model, **spec.options)
    from cisrank.rerank.registry import load_reranker

    reranker = load_reranker(spec.kind, spec.model, **spec.options)
    if reranker.keeps_order:
        raise CisrankError("reranker kind 'none' cannot be served: pick dense, cis, ...")
    return reranker


def open_retriever(path: os.PathLike[str] | str) -> Retriever:
    """Open an index folder with `cisrank.indexes.kinds.open_index` (imported when first used)."""
    from cisrank.indexes.kinds import open_index

    return open_index(os.fspath(path))


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


def public_model_id(model: str | None) -> str | None:
    """The model id as `/v1/models` shows it: a Hugging Face id as is, a local folder by its
    name only (a server path is nobody's business outside it)."""
    if model is None:
        return None
    if os.path.isabs(model) or model.startswith(("~", "./", "../")):
        return os.path.basename(os.path.normpath(os.path.expanduser(model))) or model
    return model


def _check_query(query: str, max_chars: int) -> None:
    if len(query) > max_chars:
        raise InvalidField("query", f"{len(query)} characters, over the limit of {max_chars}")


# ------------------------------------------------------------------------------- service


class RankingService:
    """Rerankers, their batchers, indexes and readiness; answers rerank and search requests."""

    def __init__(
        self,
        config: ServerConfig,
        metrics: Metrics,
        rerankers: Mapping[str, Reranker] | None = None,
        retrievers: Mapping[str, Retriever] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.rerankers: dict[str, Reranker] = {}
        self.scorers: dict[str, BatchScorer] = {}
        self.retrievers: dict[str, Retriever] = dict(retrievers or {})
        self.tokenizers: dict[str, Any] = {}
        self.error: str | None = None
        """Why loading failed, naming the component only (it is shown to clients)."""
        self._ready = threading.Event()
        self._loader: threading.Thread | None = None
        if rerankers is not None:
            self._install(dict(rerankers))
            if retrievers is None and config.indexes:
                self.retrievers = {n: open_retriever(s.path) for n, s in config.indexes.items()}
            self._ready.set()

    # ---- readiness and loading

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.error is None

    def _install(self, rerankers: dict[str, Reranker]) -> None:
        for name, reranker in rerankers.items():
            self.tokenizers[name] = find_tokenizer(reranker)
            self.scorers[name] = BatchScorer(reranker, name, self.config.batching, self.metrics)
        self.rerankers = rerankers

    def start_loading(self) -> None:
        """Load models in a thread so that /healthz answers while they load."""
        if self._ready.is_set() or self._loader is not None:
            return
        self._loader = threading.Thread(target=self._load, name="cisrank-loader", daemon=True)
        self._loader.start()

    def _load(self) -> None:
        component = "the server"
        try:
            loaded: dict[str, Reranker] = {}
            for name, spec in self.config.rerankers.items():
                component = f"reranker '{name}'"
                started = time.perf_counter()
                loaded[name] = build_reranker(spec)
                log.info(
                    "loaded reranker %s (%s, %s) in %.1f s",
                    name,
                    spec.kind,
                    spec.model,
                    time.perf_counter() - started,
                )
            retrievers = {}
            for name, index in self.config.indexes.items():
                component = f"index '{name}'"
                retrievers[name] = open_retriever(index.path)
                log.info("opened index %s", name)
            self._install(loaded)
            self.retrievers = retrievers
        except Exception as exc:
            # The exception's text (paths, file names) goes to the log; clients see the component.
            self.error = f"{component} failed to load; details are in the server log"
            log.error("loading %s failed: %s: %s", component, type(exc).__name__, exc)
        finally:
            self._ready.set()

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout) and self.error is None

    def open(self) -> None:
        """Accept requests again (an app whose lifespan runs more than once)."""
        for scorer in self.scorers.values():
            scorer.open()

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in self.scorers.values()))

    # ---- lookups

    def scorer(self, name: str) -> BatchScorer:
        if self.error is not None:
            raise LoadFailed(self.error)
        if not self.ready:
            raise NotReady("models are still loading: retry shortly")
        return self.scorers[name]

    def resolve_reranker(self, requested: str | None, field: str = "model") -> str:
        """A configured reranker name from a request's `model` (its name or its model id)."""
        if requested is None:
            return self.config.default_reranker_name
        if requested in self.config.rerankers:
            return requested
        for name, spec in self.config.rerankers.items():
            if spec.model is not None and requested in (spec.model, public_model_id(spec.model)):
                return name
        choices = ", ".join(self.config.rerankers)
        raise InvalidField(
            field, f"'{requested[:100]}' is not served here: choose one of {choices}"
        )

    def models(self) -> ModelList:
        """The rerankers (by the name a request's `model` takes) and indexes served here."""
        cards = []
        for name, spec in self.config.rerankers.items():
            loaded = self.rerankers.get(name)
            model_id = public_model_id(spec.model or getattr(loaded, "model_name", None)) or ""
            cards.append(ModelCard(id=name, kind=spec.kind, model=model_id, ready=self.ready))
        names = list(self.config.indexes) or list(self.retrievers)
        indexes = [
            IndexCard(id=n, kind=getattr(self.retrievers.get(n), "name", None)) for n in names
        ]
        return ModelList(data=cards, indexes=indexes, default=self.config.default_reranker_name)

    def redact(self, text: str) -> str:
        """`text` with the configured server paths (index folders, local model folders, path
        options) replaced by the component's name, for a message that goes to a client."""
        paths: dict[str, str] = {}
        for name, index in self.config.indexes.items():
            for form in (str(index.path), str(index.path.expanduser().resolve())):
                paths[form] = f"<index {name}>"
        for name, spec in self.config.rerankers.items():
            values = [spec.model, *spec.options.values()]
            for value in values:
                if isinstance(value, str) and public_model_id(value) != value:
                    for form in (value, os.path.realpath(os.path.expanduser(value))):
                        paths[form] = f"<{name} file {public_model_id(value)}>"
        for path in sorted(paths, key=len, reverse=True):
            if len(path) > 1:
                text = text.replace(path, paths[path])
        return text

    # ---- scoring

    async def _score(
        self, name: str, query: str, texts: list[str], field: str = "documents"
    ) -> list[float]:
        """Scores through the batcher. The model failing on this request's own text (scored
        alone, so no other request is to blame) is a 4xx naming `field` when it is an input
        error (`cisrank.api.batching.is_input_error`), else the original error (500, logged).
        In a search, `field` is `query`: the only text of the request the client sent."""
        scorer = self.scorer(name)
        try:
            return _finite(await scorer.score(query, texts))
        except QueueFullError as exc:
            raise Overloaded(f"{exc}: retry later") from None
        except ScoringTimeout as exc:
            raise TimedOut(str(exc)) from None
        except ScoringFailed as exc:
            if exc.input_error:
                raise InvalidField(
                    field, f"the reranker cannot read this request's text: {exc}"
                ) from None
            assert exc.__cause__ is not None
            raise exc.__cause__ from None

    def _check_cost(
        self, name: str, query: str, texts: Sequence[str], field: str, per_doc: int | None = None
    ) -> None:
        """The per-request budget, before any model work (see `cisrank.api.batching`)."""
        budget = self.config.limits.max_request_cost
        cost = self.scorer(name).cost(query, texts, per_doc)
        if cost > budget:
            raise InvalidField(
                field,
                f"estimated cost {cost} (documents x tokens, tokens ~ characters / 4) is over "
                f"the limit of {budget}: send fewer or shorter documents, or set "
                "max_tokens_per_doc",
            )

    async def rerank(self, body: RerankRequest) -> RerankResponse:
        """Rank `documents` for `query`, most relevant first."""
        limits = self.config.limits
        name = self.resolve_reranker(body.model)
        _check_query(body.query, limits.max_query_chars)
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
        self._check_cost(name, body.query, texts, "documents", body.max_tokens_per_doc)
        truncated = 0
        scored = texts
        if body.max_tokens_per_doc is not None:
            scored, truncated = await self.scorer(name).call(
                truncate_texts, self.tokenizers.get(name), texts, body.max_tokens_per_doc
            )
        raw = await self._score(name, body.query, scored)
        shown = normalize_scores(raw, body.normalize or self.config.normalize)
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

    async def context(self, body: ContextRequest) -> ContextResponse:
        """Arrange `documents` into a RAG prompt with a CIS reranker's causal LM, gauge it
        (`cisrank.api.assembly`)."""
        from cisrank.api.assembly import assemble_context

        return await assemble_context(self, body)

    async def generate(self, body: GenerateRequest) -> GenerateResponse:
        """Answer over `documents` with naive or entropy-based decoding, bounded in passages,
        new tokens and time (`cisrank.api.assembly`)."""
        from cisrank.api.assembly import generate_answer

        return await generate_answer(self, body)

    async def search(self, body: SearchRequest) -> SearchResponse:
        """First-stage search over a configured index, optionally reranked."""
        config = self.config
        limits = config.limits
        if not self.ready:
            self.scorer(config.default_reranker_name)  # raises NotReady
        if not self.retrievers:
            raise InvalidField("index", "no index is configured on this server")
        index = body.index or config.default_index_name or next(iter(self.retrievers))
        if index not in self.retrievers:
            raise InvalidField(
                "index",
                f"'{index[:100]}' is not served here: choose one of {', '.join(self.retrievers)}",
            )
        reranker = self.resolve_reranker(body.rerank, "rerank") if body.rerank else None
        _check_query(body.query, limits.max_query_chars)
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
            hits = await asyncio.to_thread(self.retrievers[index].search, body.query, depth)
        except Exception as exc:
            # A damaged index or document store: the server's fault, never the client's.
            log.error("index %s failed on a search: %s", index, exc, exc_info=True)
            raise BackendFailed(
                f"index '{index}' failed to answer; details are in the server log"
            ) from None
        if reranker is not None and hits:
            passages = [h.text for h in hits]
            self._check_cost(reranker, body.query, passages, "depth")
            raw = await self._score(reranker, body.query, passages, "query")
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
