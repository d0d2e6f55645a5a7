"""Request and response models of the REST API, in one place.

The rerank shape is the Cohere/Jina one that vLLM, LiteLLM, infinity and the official Cohere SDKs
speak, so cisrank is a drop-in for them. Static limits live here; limits that an operator can
change (`Limits` in `cisrank.api.config`) are checked by the routes against the running config.

Unknown request fields are ignored rather than rejected: clients send extras we do not implement
(Cohere's `rank_fields`, `max_chunks_per_doc`, `priority`, `relevant_spans`) and must still work.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cisrank.context.config import (
    ArrangeConfig,
    AssemblerConfig,
    DecoderConfig,
    GenerationAssemblerConfig,
)

Normalization = Literal["none", "sigmoid", "minmax"]


def _default(config: type[BaseModel], field: str) -> Any:
    """A library config's default as a request's JSON value (an enum's as its string): the API
    declares no default of its own."""
    value = config.model_fields[field].default
    return value.value if isinstance(value, Enum) else value


def _non_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or whitespace only")
    return value


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class DocumentIn(BaseModel):
    """A document as an object: `text` is scored; `id` and any other fields are echoed back."""

    model_config = ConfigDict(extra="allow")

    text: str = Field(description="The passage text that is scored.")
    id: str | int | None = Field(default=None, description="Your id, echoed in the result.")


class RerankRequest(_Request):
    query: str = Field(min_length=1, description="The search query (not blank).")
    documents: list[str | DocumentIn] = Field(
        min_length=1, description="Passages as strings or {text, id?} objects."
    )
    top_n: int | None = Field(default=None, ge=1, description="Return only the best N.")
    return_documents: bool = Field(default=False, description="Echo each document's text.")
    model: str | None = Field(
        default=None, description="A configured reranker name (GET /v1/models); default if unset."
    )
    max_tokens_per_doc: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Truncate each document to this many tokens."
    )
    normalize: Normalization | None = Field(
        default=None,
        description="Score normalization: none (raw, the default), sigmoid, or minmax over this "
        "request's documents.",
    )

    _query_not_blank = field_validator("query")(_non_blank)


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str


class RerankResult(BaseModel):
    index: int = Field(description="Position of the document in the request.")
    relevance_score: float
    id: str | int | None = Field(default=None, description="The document's id, when it had one.")
    document: RerankDocument | None = None


class ApiVersion(BaseModel):
    version: str = "2"


class BilledUnits(BaseModel):
    search_units: int = 1


class Meta(BaseModel):
    """Cohere's `meta` block, so that its SDKs find what they look for."""

    api_version: ApiVersion = Field(default_factory=ApiVersion)
    billed_units: BilledUnits = Field(default_factory=BilledUnits)


class Usage(BaseModel):
    documents: int = Field(description="Documents scored.")
    truncated_documents: int = Field(default=0, description="Documents cut by max_tokens_per_doc.")


class RerankResponse(BaseModel):
    id: str
    model: str = Field(description="The reranker that scored the request.")
    results: list[RerankResult] = Field(description="Most relevant first.")
    usage: Usage
    meta: Meta = Field(default_factory=Meta)


class SearchRequest(_Request):
    query: str = Field(min_length=1)
    top_n: int = Field(default=10, ge=1, description="Passages to return.")
    index: str | None = Field(default=None, description="A configured index; default if unset.")
    rerank: str | None = Field(
        default=None, description="A configured reranker name to rerank the first stage with."
    )
    depth: int | None = Field(
        default=None, ge=1, description="First-stage candidates to rerank (default max(top_n,100))."
    )
    normalize: Normalization | None = None

    _query_not_blank = field_validator("query")(_non_blank)


class SearchResult(BaseModel):
    rank: int
    docid: str
    text: str
    score: float = Field(description="The score the ranking is by (rerank if reranked).")
    retrieval_score: float
    rerank_score: float | None = None


class SearchResponse(BaseModel):
    id: str
    index: str
    model: str | None = Field(description="The reranker, or null for first-stage order.")
    results: list[SearchResult]
    usage: Usage


# ---- RAG context assembly (POST /v1/context)

# The JSON names of `cisrank.context.Arrangement` and `Decoding` (a test holds them equal): a
# Literal keeps the schema and the 422 bodies as they were.
Arrangement = Literal[
    "ranked", "reverse", "edges", "pmi_rotation", "likelihood_select", "curvature"
]


class ContextDocumentIn(BaseModel):
    """A passage of a context: `text`, an optional `title` (rendered as `(Title: t)`) and `id`."""

    model_config = ConfigDict(extra="allow")

    text: str = Field(description="The passage text.")
    title: str = Field(default="", description="Its title, shown in the prompt.")
    id: str | int | None = Field(default=None, description="Your id, echoed in the result.")


class NoiseIn(_Request):
    """Random passages put before the arranged ones ([I, random..., retrieved, Q], as in "The
    Power of Noise"), drawn with `seed` from `documents` (a pool sent in the request) or from a
    served `index`."""

    n: int = Field(ge=0, description="How many noise passages.")
    seed: int = Field(default=0, description="Seed of the draw (the same seed, the same noise).")
    documents: list[str | ContextDocumentIn] | None = Field(
        default=None, description="The pool to draw from, as strings or {text, title?, id?}."
    )
    index: str | None = Field(
        default=None, description="A served index (GET /v1/models) to draw from instead."
    )


class ContextRequest(_Request):
    query: str = Field(min_length=1, description="The question (not blank).")
    documents: list[str | ContextDocumentIn] = Field(
        min_length=1, description="The top-K passages, best first (as a reranker ranked them)."
    )
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
    noise: NoiseIn | None = Field(default=None, description="Noise padding (The Power of Noise).")
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

    _query_not_blank = field_validator("query")(_non_blank)


class ContextCandidate(BaseModel):
    order: list[int]
    mean_logprob: float


class ContextGauge(BaseModel):
    """The question likelihood of the final prompt (the PMI and likelihood gauges of RAG
    performance): an answer-free confidence."""

    mean_logprob: float = Field(description="Mean log p(question tokens | prompt before them).")
    logprob: float = Field(description="Summed over the question's tokens.")
    num_tokens: int
    pmi: float | None = Field(default=None, description="mean_logprob - mean with no passages.")
    mean_logprob_no_context: float | None = None


class NoiseOut(BaseModel):
    id: str
    title: str
    text: str


class ContextUsage(BaseModel):
    documents: int = Field(description="Passages arranged.")
    noise: int = Field(default=0, description="Noise passages in the prompt.")
    prompts_scored: int = Field(description="Prompts whose question likelihood was computed.")
    prompt_tokens: int = Field(description="Tokens of the final prompt (BOS included).")


class ContextResponse(BaseModel):
    id: str
    model: str = Field(description="The reranker whose language model scored the prompts.")
    arrange: str
    template: str
    order: list[int] = Field(
        description="Indexes of the request's documents in prompt order (after the noise)."
    )
    ids: list[str | int | None] = Field(
        description="Ids of the prompt's passages in prompt order, noise first (the documents' "
        "own ids, or null for a document without one)."
    )
    scores: list[float] | None = Field(
        description="curvature: per request document, l(rotation where it is first) + "
        "l(rotation where it is last); null for the other arrangements."
    )
    candidates: list[ContextCandidate] = Field(
        description="The scored rotations or shuffles (orders of the request's documents)."
    )
    noise: list[NoiseOut] = Field(description="The noise passages, in prompt order.")
    gauge: ContextGauge
    prompt: str = Field(description="The prompt text, ending where the answer begins.")
    usage: ContextUsage


Decoding = Literal["naive", "avg_ens", "replug", "leens", "clehe"]


class GenerateRequest(_Request):
    query: str = Field(min_length=1, description="The question (not blank).")
    documents: list[str | ContextDocumentIn] = Field(
        min_length=1, description="The top-K passages, best first."
    )
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
    scores: list[float] | None = Field(
        default=None, description="replug: one reranker score per document."
    )
    tau: float = Field(
        default=_default(DecoderConfig, "tau"), gt=0, description="LeEns/CLeHe entropy temperature."
    )
    beta: float = Field(
        default=_default(DecoderConfig, "beta"), ge=0, description="CLeHe contrast strength."
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

    _query_not_blank = field_validator("query")(_non_blank)


class GenerateUsage(BaseModel):
    documents: int
    prompt_tokens: int = Field(description="Tokens of the longest decoded row's prompt.")
    generated_tokens: int


class GenerateResponse(BaseModel):
    id: str
    model: str
    decoding: str
    order: list[int] = Field(description="naive: the documents' order in the prompt.")
    answer: str
    tokens: list[int]
    attribution: list[str | int | None] = Field(
        description="Per generated token, the id (or index) of the lowest-entropy document; "
        "null for naive."
    )
    weights: list[list[float]] = Field(description="Per step, the documents' weights.")
    layers: list[int | None] = Field(description="clehe: per step, the contrast layer l*.")
    usage: GenerateUsage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    kind: str
    model: str
    ready: bool


class IndexCard(BaseModel):
    """A served index by name and kind (never by its folder: no server path leaves the server)."""

    id: str
    kind: str | None = Field(default=None, description="bm25, dense, ...; null while loading.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
    indexes: list[IndexCard] = Field(default_factory=list)
    default: str


class FieldError(BaseModel):
    field: str = Field(description="Dotted path of the offending field, e.g. documents.3.text.")
    message: str
    type: str


class ErrorBody(BaseModel):
    """Every 4xx/5xx body: a message a human can act on and the fields that caused it."""

    error: str = Field(description="A short code: invalid_request, unauthorized, overloaded...")
    message: str
    fields: list[FieldError] = Field(default_factory=list)


class Health(BaseModel):
    status: str
    detail: dict[str, Any] = Field(default_factory=dict)
