"""What the serving engine is asked and what it answers: plain domain values, no wire shape.

Why apart from the wire: the same ranking is reached through Cohere's and Jina's rerank, TEI's,
OpenAI's embeddings and cisrank's own search and context shapes (`cisrank.api.shapes`), and from
Python without any server. One type per request: a query here carries its limits (pydantic, no
web framework), and a wire model is that query plus its shape's renames: cisrank's own search,
context and generation bodies are these queries (`cisrank.api.schemas` subclasses them), and the
Cohere, TEI and OpenAI shapes rename a few fields (`texts`, `input`, a document as an object) and
take the others by name. The engine never sees a shape.

A query is validated when it is made, wherever it is made: a value out of its limits (a `top_n`
of 0 or -3, a blank query) is an `InvalidField` naming it, the error the engine raises for what
only the running config can say (a `top_n` over `limits.max_search_top_n`), so a Python caller
and every transport get one error type (a request body is validated by the API first, and its
422 lists every field at fault).

Field names: a `ServiceError` that blames a field (`InvalidField`) names it by the query's own
attributes, dotted for items (`documents.3`, `documents.3.text`, `noise.documents.0.id`,
`texts.1`); a shape renames them to its own (`texts.1` is OpenAI's `input.1`, a string document's
`documents.3.text` is Cohere's `documents.3`).

Defaults: a query's settings that have a library default (the arrangement, the template, the
decoding...) take it from `cisrank.context.config`, so each default is declared once.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from cisrank.context.config import (
    ArrangeConfig,
    AssemblerConfig,
    DecoderConfig,
    GenerationAssemblerConfig,
)
from cisrank.data.types import BestChunk
from cisrank.rerank.chunking import ChunkUsage
from cisrank.serving.errors import InvalidField

if TYPE_CHECKING:
    import numpy as np

    from cisrank.context import Candidate, Gauge
    from cisrank.data.types import Passage

Normalization = Literal["none", "sigmoid", "minmax"]
"""How scores are shown: raw (CIS is a log-ratio, not a probability), a sigmoid, or min-max over
one request's documents."""

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


# --------------------------------------------------------------------------- limits


def _non_blank(value: str) -> str:
    if is_blank(value):
        raise ValueError(BLANK)
    return value


QueryText = Annotated[str, Field(min_length=1), AfterValidator(_non_blank)]
"""A query or question: at least one visible character (`is_blank`)."""

Positive = Annotated[int, Field(ge=1)]
"""A count of at least one (a search's depth, an embedding's dimensions)."""

TopN = Positive
"""How many results: at least one (a cut to 0 answers nothing, one to -3 drops the last three)."""

TokensPerDoc = Annotated[int, Field(ge=1, le=1_000_000)]
"""The tokens a document is cut to."""

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
"""A float that is a number: JSON's non-standard NaN and Infinity (which Python's parser reads)
are refused, naming the field."""

# The JSON names of `cisrank.context.Arrangement` and `Decoding` (a test holds them equal): a
# Literal keeps the schema and the 422 bodies as they were.
Arrangement = Literal[
    "ranked", "reverse", "edges", "pmi_rotation", "likelihood_select", "curvature"
]
Decoding = Literal["naive", "avg_ens", "replug", "leens", "clehe"]

MIN_TAU = 1e-4
"""The smallest LeEns/CLeHe temperature served: weights are softmax(-H / tau) over entropies H of
at most ln(vocabulary) (< 14), so 1e-4 already makes them one-hot; a tau near 5e-324 made them
NaN (docs/reliability.md)."""
MAX_BETA = 100.0
"""The largest CLeHe contrast strength served (the paper uses 0.25; 1e308 gave inf - inf)."""

_UNION_MEMBERS = frozenset({"str", "int", "float", "bool"})


def _member(part: int | str) -> bool:
    """Whether a part of a pydantic error location names a union's member (`str`, `Document`,
    `function-after[...]`), not a field: every field here is in lower case."""
    return isinstance(part, str) and (part in _UNION_MEMBERS or part[:1].isupper() or "[" in part)


def _field_of(loc: Sequence[int | str]) -> str:
    """A pydantic error location as the dotted name of the field."""
    return ".".join(str(p) for p in loc if not _member(p))


def _default(config: type[BaseModel], field: str) -> Any:
    """A library config's default as a query's value (an enum's as its string)."""
    value = config.model_fields[field].default
    return value.value if isinstance(value, Enum) else value


class Query(BaseModel):
    """A request to the engine. Strict (a number is not a string, a boolean not a number),
    closed (a misspelled field is an error, not ignored) and frozen; made out of its limits, it
    is an `InvalidField` naming a field at fault."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, protected_namespaces=())

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            # the deepest location: of a union's members, the one that says what is wrong
            fault = max(exc.errors(), key=lambda e: len(e["loc"]))
            raise InvalidField(_field_of(fault["loc"]), fault["msg"]) from None

    # Only a query made in Python comes through this `__init__`: validation (a wire body, a
    # query nested in one) keeps pydantic's own, whose `ValidationError` the API answers with a
    # 422 that lists every field at fault. The mark is pydantic's (its `RootModel` sets it too).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- rank and embed


class RerankQuery(Query):
    """Rank `documents` for `query`, most relevant first. Errors name `query`, `documents`,
    `documents.N` (a document over the character limit), `model`, `top_n`."""

    query: QueryText
    documents: Sequence[str] = Field(min_length=1)
    model: str | None = None
    """A served reranker's name or its model's id; the default reranker when None."""
    top_n: TopN | None = None
    max_tokens_per_doc: TokensPerDoc | None = None
    max_chunks_per_doc: Positive | None = None
    """Windows scored per long document at most (its first ones); None: all of them."""
    truncation: bool = True
    """False: a document that does not fit the model's window whole is refused (naming it)
    instead of being cut into windows (Voyage's `truncation`, TEI's `truncate`)."""
    normalize: Normalization | None = None
    """None: the server's default (`ServerConfig.normalize`)."""


@dataclass(frozen=True)
class RankedDocument:
    index: int
    """The document's position in the query."""
    score: float
    """As asked to be shown (`normalize`), finite."""
    best_chunk: BestChunk | None = None
    """Its best window: a character span of the document as sent, and its raw score."""


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
    chunks: ChunkUsage = field(default_factory=ChunkUsage)
    """Documents cut into windows, windows scored, windows dropped by `max_chunks_per_doc`."""


class EmbedQuery(Query):
    """Embed `texts` with a served dense reranker's encoder. Errors name `texts`, `texts.N`,
    `model`, `dimensions`."""

    texts: Sequence[str]
    model: str | None = None
    dimensions: Positive | None = None
    """The length the caller expects (it must be the model's own)."""


@dataclass(frozen=True)
class Embeddings:
    reranker: str
    vectors: np.ndarray
    """(texts, dimensions) float32, unit length, in the query's order."""
    tokens: int
    """Tokens the model read, each text cut at its length, special tokens included."""


class SearchQuery(Query):
    """First-stage search over a served index, reranked when `rerank` names a reranker. Errors
    name `query`, `index`, `rerank`, `top_n`, `depth`."""

    query: QueryText
    top_n: TopN = Field(default=10, description="Passages to return.")
    index: str | None = Field(default=None, description="A configured index; default if unset.")
    rerank: str | None = Field(
        default=None, description="A configured reranker name to rerank the first stage with."
    )
    depth: Positive | None = Field(
        default=None, description="First-stage candidates to rerank (default max(top_n,100))."
    )
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
    best_chunk: BestChunk | None = None
    """Its best window, when reranked (the whole passage where it fits the model)."""


@dataclass(frozen=True)
class SearchResults:
    index: str
    reranker: str | None
    results: list[FoundPassage]
    documents: int
    """First-stage candidates found."""
    chunks: ChunkUsage = field(default_factory=ChunkUsage)
    """What the reranking's chunking did (nothing without a reranker)."""


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


class Document(Query):
    """A passage of a context: `text`, an optional `title` (rendered as `(Title: t)`) and `id`."""

    text: str = Field(description="The passage text.")
    title: str = Field(default="", description="Its title, shown in the prompt.")
    id: str | int | None = Field(default=None, description="Your id, echoed in the result.")


Passages = Sequence[str | Document]
"""A context's passages: each a text alone, or a `Document` with its title and id."""


class NoiseSpec(Query):
    """`n` random passages drawn with `seed` from `documents` or from a served `index`."""

    n: int = Field(ge=0, description="How many noise passages.")
    seed: int = Field(default=0, description="Seed of the draw (the same seed, the same noise).")
    documents: Passages | None = None
    index: str | None = Field(
        default=None, description="A served index (GET /v1/models) to draw from instead."
    )


class RerankFirst(Query):
    """Take the passages from a served reranker first: all `documents` are ranked by it (each
    document's title and text, as `cisrank eval rag` ranks them) and its best `top_k` go on,
    best first (the pipeline `cisrank eval rag` measures, in one call)."""

    reranker: str = Field(description="A served reranker (GET /v1/models), by name or model id.")
    top_k: int = Field(ge=1, description="How many of its best documents go on (all if fewer).")


class ContextQuery(Query):
    """Arrange `documents` into a RAG prompt with a served reranker's causal LM. Errors name
    these attributes (`documents.N.text`, `documents.N.id`, `noise.n`, `rerank.reranker`...)
    and the prompt's parts (`template`, `document_format`, `fields.NAME`)."""

    query: QueryText = Field(description="The question (not blank).")
    documents: Passages = Field(min_length=1)
    arrange: Arrangement = Field(
        default=_default(ArrangeConfig, "arrange"),
        description="ranked, reverse (best next to the question), edges, pmi_rotation, "
        "likelihood_select or curvature (per-passage scores).",
    )
    template: str = Field(
        default=_default(AssemblerConfig, "template"),
        description="qa, noise, kv, entropy, or a custom string holding {documents} and "
        "{question} (other {names} take their values from `fields`).",
    )
    fields: dict[str, str] = Field(default_factory=dict, description="A template's other fields.")
    document_format: str | None = Field(
        default=None,
        description="Passage format with {index}, {title}, {text}, {id} (default the "
        "template's: 'Document [{index}](Title: {title}) {text}').",
    )
    chat: bool = Field(
        default=_default(AssemblerConfig, "chat"),
        description="Wrap the prompt in the model's chat template.",
    )
    noise: NoiseSpec | None = None
    shuffles: int | None = Field(
        default=_default(ArrangeConfig, "shuffles"),
        ge=0,
        description="likelihood_select: random shuffles (default K - 1).",
    )
    seed: int = Field(
        default=_default(ArrangeConfig, "seed"), description="Seed of likelihood_select's shuffles."
    )
    pmi: bool = Field(default=False, description="Also gauge PMI against no passages.")
    model: str | None = Field(
        default=None, description="A configured cis reranker (its causal LM); default if unset."
    )
    rerank: RerankFirst | None = Field(
        default=None,
        description="Rank the documents with a served reranker first and arrange its top_k.",
    )


class GenerateQuery(Query):
    """Answer `query` over `documents`, greedy, with naive or document-parallel decoding."""

    query: QueryText = Field(description="The question (not blank).")
    documents: Passages = Field(min_length=1)
    decoding: Decoding = Field(
        default=_default(DecoderConfig, "decoding"),
        description="naive (all passages in one prompt), or the document-parallel avg_ens, "
        "replug (weights from `scores`), leens, clehe (entropy-based decoding).",
    )
    arrange: Arrangement = Field(
        default=_default(ArrangeConfig, "arrange"),
        description="naive: the passages' order in the prompt.",
    )
    template: str = Field(
        default=_default(GenerationAssemblerConfig, "template"),
        description="As /v1/context; the entropy-based decoding paper's prompts.",
    )
    fields: dict[str, str] = Field(default_factory=dict)
    document_format: str | None = None
    chat: bool = _default(GenerationAssemblerConfig, "chat")
    scores: list[FiniteFloat] | None = Field(
        default=None,
        description="One reranker score per document (replug's weights; any decoding checks "
        "the count).",
    )
    tau: float = Field(
        default=_default(DecoderConfig, "tau"),
        gt=0,
        allow_inf_nan=False,
        description=f"LeEns/CLeHe entropy temperature, at least {MIN_TAU:g}.",
    )
    beta: float = Field(
        default=_default(DecoderConfig, "beta"),
        ge=0,
        allow_inf_nan=False,
        description=f"CLeHe contrast strength, at most {MAX_BETA:g}.",
    )
    layers: list[int] | None = Field(
        default=_default(DecoderConfig, "layers"),
        description="CLeHe candidate layers (default: even layers, last half).",
    )
    max_new_tokens: int = Field(
        default=_default(DecoderConfig, "max_new_tokens"),
        ge=1,
        description="Most tokens to generate.",
    )
    model: str | None = Field(default=None, description="A configured cis reranker.")
    rerank: RerankFirst | None = Field(
        default=None,
        description="Rank the documents with a served reranker first and answer over its top_k "
        "(replug without `scores` weighs them by its scores).",
    )

    @field_validator("tau")
    @classmethod
    def _tau_not_tiny(cls, value: float) -> float:
        if value < MIN_TAU:
            raise ValueError(
                f"must be at least {MIN_TAU:g}: a smaller temperature turns the passage "
                "weights softmax(-entropy / tau) into infinities (no number)"
            )
        return value

    @field_validator("beta")
    @classmethod
    def _beta_bounded(cls, value: float) -> float:
        if value > MAX_BETA:
            raise ValueError(
                f"must be at most {MAX_BETA:g}: (1 + beta) * log p - beta * log q overflows "
                "to infinity - infinity (no number) for large beta"
            )
        return value


@dataclass(frozen=True)
class RerankPick:
    """What the reranker of `rerank` chose: the query's documents it kept, best first, and their
    raw scores."""

    reranker: str
    indexes: list[int]
    scores: list[float]
    best_chunks: list[BestChunk | None] = field(default_factory=list)
    """Per kept document, the span of its text its best window holds, which the prompt
    received (None: the document was read whole)."""
    chunks: ChunkUsage | None = None
    """What the ranking's chunking did (windows scored, documents chunked, windows left out)."""


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
