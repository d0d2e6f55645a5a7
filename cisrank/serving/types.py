"""What the serving engine is asked and what it answers: plain domain values, no wire shape.

Why apart from the wire: the same ranking is reached through Cohere's and Jina's rerank, TEI's,
OpenAI's embeddings and cisrank's own search and context shapes (`cisrank.api.shapes`, one
converter each), and from Python without any server. Each shape's converter builds a query here
from its request and its response from a result here; the engine never sees a shape.

Field names: a `ServiceError` that blames a field (`InvalidField`) names it by the query's own
attributes, dotted for items (`documents.3`, `documents.3.text`, `noise.documents.0.id`,
`texts.1`); a converter renames them to its shape's (`texts.1` is OpenAI's `input.1`, a string
document's `documents.3.text` is Cohere's `documents.3`).

Defaults: a query's settings that have a library default (the arrangement, the template, the
decoding...) have none here; the converter passes them, so each default is declared once (in
`cisrank.context.config`, which the wire shapes read).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np

    from cisrank.context import Candidate, Gauge
    from cisrank.data.types import Passage

Normalization = Literal["none", "sigmoid", "minmax"]

BLANK = "must not be empty or blank (only whitespace, control or zero-width characters)"
"""What a text field that `is_blank` is told: one rule for every text a request sends."""

_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
_INVISIBLE_FILLERS = frozenset("\u034f\u115f\u1160\u2800\u3164\uffa0")
"""Characters of other categories that are drawn as nothing: the combining grapheme joiner, the
Hangul fillers and the blank Braille pattern."""


def is_blank(text: str) -> bool:
    """Whether `text` holds no visible character: only whitespace, control characters (NUL
    included), format characters (zero-width space and joiners, the byte order mark, bidi
    marks) and blank fillers. `str.strip` alone let `"\u200b\ufeff"` and `"\u0000"` through
    as a query. Stops at the first visible character: a usual text costs one look."""
    return all(
        c in _INVISIBLE_FILLERS or unicodedata.category(c) in _INVISIBLE_CATEGORIES for c in text
    )


"""How scores are shown: raw (CIS is a log-ratio, not a probability), a sigmoid, or min-max over
one request's documents."""


# --------------------------------------------------------------------------- rank and embed


@dataclass(frozen=True)
class RerankQuery:
    """Rank `documents` for `query`, most relevant first. Errors name `query`, `documents`,
    `documents.N` (a document over the character limit), `model`."""

    query: str
    documents: Sequence[str]
    model: str | None = None
    """A served reranker's name or its model's id; the default reranker when None."""
    top_n: int | None = None
    max_tokens_per_doc: int | None = None
    normalize: Normalization | None = None
    """None: the server's default (`ServerConfig.normalize`)."""


@dataclass(frozen=True)
class RankedDocument:
    index: int
    """The document's position in the query."""
    score: float
    """As asked to be shown (`normalize`), finite."""


@dataclass(frozen=True)
class Ranking:
    reranker: str
    """The name of the reranker that scored the documents."""
    results: list[RankedDocument]
    """Most relevant first, at most `top_n`."""
    documents: int
    """Documents scored."""
    truncated: int
    """Documents cut to `max_tokens_per_doc`."""


@dataclass(frozen=True)
class EmbedQuery:
    """Embed `texts` with a served dense reranker's encoder. Errors name `texts`, `texts.N`,
    `model`, `dimensions`."""

    texts: Sequence[str]
    model: str | None = None
    dimensions: int | None = None
    """The length the caller expects (it must be the model's own)."""


@dataclass(frozen=True)
class Embeddings:
    reranker: str
    vectors: np.ndarray
    """(texts, dimensions) float32, unit length, in the query's order."""
    tokens: int
    """Tokens the model read, each text cut at its length, special tokens included."""


@dataclass(frozen=True)
class SearchQuery:
    """First-stage search over a served index, reranked when `rerank` names a reranker. Errors
    name `query`, `index`, `rerank`, `top_n`, `depth`."""

    query: str
    top_n: int = 10
    index: str | None = None
    rerank: str | None = None
    depth: int | None = None
    """First-stage candidates; default max(top_n, 100) when reranked, else top_n."""
    normalize: Normalization | None = None


@dataclass(frozen=True)
class FoundPassage:
    rank: int
    docid: str
    text: str
    score: float
    """What the order is by: the (normalized) rerank score, else the first stage's."""
    retrieval_score: float
    rerank_score: float | None
    """Raw, when reranked."""


@dataclass(frozen=True)
class SearchResults:
    index: str
    reranker: str | None
    results: list[FoundPassage]
    documents: int
    """First-stage candidates found."""


# --------------------------------------------------------------------------- what is served


@dataclass(frozen=True)
class ServedReranker:
    name: str
    kind: str
    model: str
    """Its model's public id (a local folder by its name), "" while unknown."""
    ready: bool
    runtime: str | None = None
    """The runtime its model runs on (torch, onnx, ctranslate2), None while it loads."""
    compute_type: str | None = None
    """The number format it computes in (float32, bfloat16, int8), None while it loads."""


@dataclass(frozen=True)
class ServedIndex:
    name: str
    kind: str | None
    """bm25, dense, ...; None while it loads."""


@dataclass(frozen=True)
class Catalog:
    rerankers: list[ServedReranker]
    indexes: list[ServedIndex]
    default: str
    embeddings: str | None = None
    """The reranker whose encoder /v1/embeddings uses without a `model` (None: none embeds,
    or not known while the models load)."""


@dataclass(frozen=True)
class RerankerInfo:
    """What is known of one loaded reranker (TEI's `/info` shows the default one)."""

    name: str
    model: str
    """Its model's public id, else its name."""
    compute_type: str | None
    runtime: str | None
    """The runtime its model runs on (torch, onnx, ctranslate2)."""
    pair_token_limit: int | None
    processes: int
    """Processes its model work runs on (its workers in a pool)."""
    passage_cache: dict[str, int] | None = None
    """Its passage cache's counters and bytes (`EmbeddingCache.stats`), where it keeps one."""


# --------------------------------------------------------------------------- context, generate


@dataclass(frozen=True)
class Document:
    """A passage of a context or generation request."""

    text: str
    title: str = ""
    id: str | int | None = None


@dataclass(frozen=True)
class NoiseSpec:
    """`n` random passages drawn with `seed` from `documents` or from a served `index`."""

    n: int
    seed: int = 0
    documents: Sequence[Document] | None = None
    index: str | None = None


@dataclass(frozen=True)
class RerankFirst:
    """Rank the documents with served reranker `reranker` first; its best `top_k` go on."""

    reranker: str
    top_k: int


@dataclass(frozen=True, kw_only=True)
class ContextQuery:
    """Arrange `documents` into a RAG prompt with a served reranker's causal LM. Errors name
    these attributes (`documents.N.text`, `documents.N.id`, `noise.n`, `rerank.reranker`...)
    and the prompt's parts (`template`, `document_format`, `fields.NAME`)."""

    query: str
    documents: Sequence[Document]
    arrange: str
    template: str
    fields: Mapping[str, str] = field(default_factory=dict)
    document_format: str | None = None
    chat: bool
    noise: NoiseSpec | None = None
    shuffles: int | None
    seed: int
    pmi: bool = False
    model: str | None = None
    rerank: RerankFirst | None = None


@dataclass(frozen=True, kw_only=True)
class GenerateQuery:
    """Answer `query` over `documents`, greedy, with naive or document-parallel decoding."""

    query: str
    documents: Sequence[Document]
    decoding: str
    arrange: str
    template: str
    fields: Mapping[str, str] = field(default_factory=dict)
    document_format: str | None = None
    chat: bool
    scores: Sequence[float] | None = None
    tau: float
    beta: float
    layers: Sequence[int] | None
    max_new_tokens: int
    model: str | None = None
    rerank: RerankFirst | None = None


@dataclass(frozen=True)
class RerankPick:
    """What the reranker of `rerank` chose: the query's documents it kept, best first, and their
    raw scores."""

    reranker: str
    indexes: list[int]
    scores: list[float]


@dataclass(frozen=True)
class ArrangedContext:
    reranker: str
    """The reranker whose causal LM scored the prompts."""
    arrange: str
    template: str
    order: list[int]
    """The query's documents in prompt order (after the noise)."""
    ids: list[str | int | None]
    """The prompt's passages' ids in prompt order, noise first."""
    scores: list[float] | None
    candidates: list[Candidate]
    noise: list[Passage]
    gauge: Gauge
    prompt: str
    rerank: RerankPick | None
    documents: int
    prompts_scored: int
    prompt_tokens: int


@dataclass(frozen=True)
class GeneratedAnswer:
    reranker: str
    decoding: str
    order: list[int]
    answer: str
    tokens: list[int]
    attribution: list[str | int | None]
    weights: list[list[float]]
    layers: list[int | None]
    rerank: RerankPick | None
    documents: int
    prompt_tokens: int
    generated_tokens: int
