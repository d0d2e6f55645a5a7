"""Request and response models of the REST API, in one place.

The rerank shape is the Cohere/Jina one that vLLM, LiteLLM, infinity and the official Cohere SDKs
speak, so cisrank is a drop-in for them. One type per request: cisrank's own search, context
and generation bodies are the engine's queries (`cisrank.serving.types`), subclassed here only to
accept `top_k` and the documents as strings or objects; the Cohere, TEI and OpenAI bodies are
their shapes' fields with the engine's limits on them (`TopN`, `QueryText`...), renamed into a
query by `cisrank.api.shapes`. Limits that an operator can change (`Limits` in
`cisrank.serving.config`) are checked by the engine against the running config.

Unknown request fields are refused (422 naming them: a misspelled `top_k` used to be ignored
silently, and the default count came back), except the documented fields of the shapes clients
bring, which are accepted: Cohere's `priority` (accepted, not used), Cohere's `rank_fields`
(used: documents ranked by those fields, `cisrank.rerank.fields`), Cohere's `max_chunks_per_doc`
(used: a long document is cut into windows, `ServerConfig.chunking`, and at most that many of
them are scored), Voyage's `truncation` (false: a document that does not fit the model's window
whole is refused, naming it; TEI's `truncate: false` is the same), and TEI's `raw_scores`,
`return_text`, `truncate` and `truncation_direction` on `POST /rerank`. One name per idea: the
result count is `top_n` everywhere, `top_k` (Jina's and Voyage's name) accepted as its alias.

Types are strict (pydantic's strict mode on every request model): a number is not a string, a
boolean not a number. `top_n: true` was read as 1 and `top_n: "2"` as 2, `return_documents: "yes"`
as true; each is now a 422 naming the field. A float field takes an integer (`"tau": 1`). Every
text a request ranks or embeds, and every query, follows one blank rule
(`cisrank.serving.types.is_blank`: zero-width, control and whitespace characters alone are blank).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from cisrank.rerank.chunking import ChunkUsage
from cisrank.serving.types import (
    ContextQuery,
    Document,
    GenerateQuery,
    NoiseSpec,
    Normalization,
    Positive,
    QueryText,
    SearchQuery,
    TokensPerDoc,
    TopN,
)


class _Request(BaseModel):
    """A request body: a field it does not declare is a 422 naming it, and so is a value of
    another JSON type than the field's (strict: no string read as a number, no number as a
    boolean)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), strict=True)


TOP_N_ALIASES = AliasChoices("top_n", "top_k")
"""`top_k` is accepted for `top_n` (one name per idea; both given is a 422 naming `top_k`)."""


class DocumentIn(BaseModel):
    """A document as an object: `text` is scored (with `rank_fields`, the fields named are);
    `id` and any other fields are echoed back."""

    model_config = ConfigDict(extra="allow", strict=True)

    text: str | None = Field(
        default=None,
        description="The passage text that is scored (required unless rank_fields are given).",
    )
    id: str | int | None = Field(default=None, description="Your id, echoed in the result.")


class RerankRequest(_Request):
    query: QueryText = Field(description="The search query (not blank).")
    documents: list[str | DocumentIn] = Field(
        min_length=1, description="Passages as strings or {text, id?} objects."
    )
    top_n: TopN | None = Field(
        default=None,
        validation_alias=TOP_N_ALIASES,
        description="Return only the best N (`top_k` is accepted as its alias).",
    )
    return_documents: bool = Field(default=False, description="Echo each document's text.")
    model: str | None = Field(
        default=None, description="A configured reranker name (GET /v1/models); default if unset."
    )
    max_tokens_per_doc: TokensPerDoc | None = Field(
        default=None, description="Truncate each document to this many tokens."
    )
    normalize: Normalization | None = Field(
        default=None,
        description="Score normalization: none (raw, the default), sigmoid, or minmax over this "
        "request's documents.",
    )
    # Documented fields of the Cohere rerank API (v1 and v2), accepted so that its SDKs and the
    # clients built on them work unchanged; not used.
    rank_fields: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Cohere: rank each document by these fields, in this order, as "
        "`field: value` lines (an object's fields, or those of a string holding a JSON object "
        "or YAML mapping; a plain string is its `text`). A document without one is a 422 "
        "naming it and the field; best_chunk then spans that rendering.",
    )
    max_chunks_per_doc: Positive | None = Field(
        default=None,
        description="Cohere v1: windows scored per long document at most (its first ones; the "
        "windows dropped are counted in usage). Default: every window.",
    )
    truncation: bool = Field(
        default=True,
        description="Voyage: false refuses a document that does not fit the model's window "
        "whole (a 422 naming it) instead of scoring it by its best window.",
    )
    priority: int | None = Field(default=None, description="Cohere: accepted, not used.")


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str | None = None


class BestChunkOut(BaseModel):
    """A document's best-scoring window: a RAG client puts this span, not the whole document,
    in its prompt."""

    start: int = Field(description="Its first character in the document's text as sent.")
    end: int = Field(description="The character after its last (text[start:end]).")
    score: float = Field(description="Its raw score (the model's, never normalized).")
    text: str | None = Field(
        default=None,
        description="Its text, with return_documents, where it is a part of the document (a "
        "document read whole is in `document`).",
    )


class RerankResult(BaseModel):
    index: int = Field(description="Position of the document in the request.")
    relevance_score: float
    id: str | int | None = Field(default=None, description="The document's id, when it had one.")
    document: RerankDocument | None = None
    best_chunk: BestChunkOut | None = Field(
        default=None,
        description="The document's best window (the whole document where it fits the model).",
    )


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


class ChunksUsed(BaseModel):
    """What chunking did to a ranking: `/v1/rerank`'s and `/v1/search`'s usage, and the
    `rerank` step of `/v1/context` and `/v1/generate`."""

    chunked_documents: int = Field(
        default=0, description="Documents longer than the model's window, cut into windows."
    )
    windows_scored: int = Field(default=0, description="Windows scored, every document's.")
    windows_dropped: int = Field(
        default=0, description="Windows not scored: past max_chunks_per_doc (or first pooling)."
    )


class RerankUsage(ChunksUsed, Usage):
    """What a ranking scored: its documents, those cut by max_tokens_per_doc, and its windows."""

    @classmethod
    def counted(cls, documents: int, chunks: ChunkUsage, truncated: int = 0) -> RerankUsage:
        """The usage of a ranking of `documents`, `truncated` of them cut, chunked as `chunks`."""
        return cls(
            documents=documents,
            truncated_documents=truncated,
            chunked_documents=chunks.chunked_documents,
            windows_scored=chunks.windows_scored,
            windows_dropped=chunks.windows_dropped,
        )


class RerankResponse(BaseModel):
    id: str
    model: str = Field(description="The reranker that scored the request.")
    results: list[RerankResult] = Field(description="Most relevant first.")
    usage: RerankUsage
    meta: Meta = Field(default_factory=Meta)


class SearchRequest(SearchQuery):
    top_n: TopN = Field(
        default=10,
        validation_alias=TOP_N_ALIASES,
        description="Passages to return (`top_k` is accepted as its alias).",
    )


class SearchResult(BaseModel):
    rank: int
    docid: str
    text: str
    score: float = Field(description="The score the ranking is by (rerank if reranked).")
    retrieval_score: float
    rerank_score: float | None = None
    best_chunk: BestChunkOut | None = Field(
        default=None,
        description="When reranked: the passage's best window (the whole passage where it fits "
        "the model).",
    )


class SearchResponse(BaseModel):
    id: str
    index: str
    model: str | None = Field(description="The reranker, or null for first-stage order.")
    results: list[SearchResult]
    usage: RerankUsage


# ---- the shapes users bring: TEI's rerank, OpenAI's embeddings


class TeiRerankRequest(_Request):
    """Hugging Face text-embeddings-inference's `POST /rerank` body (`texts`, not `documents`)."""

    query: QueryText = Field(description="The search query (not blank).")
    texts: list[str] = Field(min_length=1, description="The passages to rank.")
    raw_scores: bool = Field(
        default=False,
        description="TEI: raw scores; false (its default) puts a classifier's logit through a "
        "sigmoid, as TEI does (a dense reranker's cosine is not a logit and is returned as is).",
    )
    return_text: bool = Field(default=False, description="TEI: echo each text.")
    truncate: bool | None = Field(
        default=None,
        description="TEI: false refuses a text that does not fit the model's window whole (a "
        "422 naming it); unset or true, a long text is scored by its best window.",
    )
    truncation_direction: Literal["right", "Right", "left", "Left"] | None = Field(
        default=None, description="TEI: only right (the default) is served."
    )
    model: str | None = Field(
        default=None,
        description="cisrank: a configured reranker (GET /v1/models); default if unset.",
    )


class TeiRank(BaseModel):
    """One entry of TEI's rerank answer, a JSON list most relevant first."""

    index: int = Field(description="Position of the text in the request.")
    score: float
    text: str | None = Field(default=None, description="The text, with return_text.")


class EmbeddingsRequest(_Request):
    """OpenAI's `POST /v1/embeddings` body (as infinity and TEI serve it), for a served dense
    (bi-encoder) reranker."""

    input: str | list[str] = Field(description="A text or a list of texts (not token ids).")
    model: str | None = Field(
        default=None,
        description="A configured dense reranker (its name or model id; a model id picks the "
        "config's `embeddings` reranker first). Unset: the config's `embeddings` reranker (the "
        "bare server's: 'dense-float32', all-MiniLM-L6-v2 in float32), else the default "
        "reranker where it embeds, else the first dense one.",
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float",
        description="float: lists of numbers; base64: little-endian float32 bytes, base64 "
        "(what the openai client asks for by default).",
    )
    dimensions: Positive | None = Field(
        default=None, description="Must be the model's own dimension when given."
    )
    user: str | None = Field(default=None, description="OpenAI: accepted, not used.")


class EmbeddingOut(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="Unit-length vector (or its base64).")


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int = Field(description="Tokens the model read (each text cut at its length).")
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingOut]
    model: str = Field(description="The reranker whose encoder embedded the texts (its name).")
    usage: EmbeddingsUsage


# ---- RAG context assembly (POST /v1/context)


class ContextDocumentIn(Document):
    """A passage of a context: `text`, an optional `title` (rendered as `(Title: t)`) and `id`."""

    model_config = ConfigDict(extra="allow")


class NoiseIn(NoiseSpec):
    """Random passages put before the arranged ones ([I, random..., retrieved, Q], as in "The
    Power of Noise"), drawn with `seed` from `documents` (a pool sent in the request) or from a
    served `index`."""

    documents: list[str | ContextDocumentIn] | None = Field(
        default=None, description="The pool to draw from, as strings or {text, title?, id?}."
    )


class ChosenSpan(BaseModel):
    """The part of a long document the prompt received: its best window's span of the text."""

    start: int = Field(description="Its first character in the document's text as sent.")
    end: int = Field(description="The character after its last (text[start:end]).")
    score: float = Field(description="The window's raw score (the model's, never normalized).")


class RerankChoice(BaseModel):
    """What the reranker of `rerank` chose: the request's documents it kept, best first, and
    their scores (raw, as /v1/rerank gives them). A document longer than the reranker's window
    is scored by its best window (the server's chunking, as /v1/rerank) and only that window's
    span of its text goes in the prompt: `best_chunks` says which."""

    reranker: str
    indexes: list[int] = Field(description="Indexes of the request's documents, best first.")
    scores: list[float]
    best_chunks: list[ChosenSpan | None] = Field(
        default_factory=list,
        description="Per kept document, in `indexes` order, the span of its text the prompt "
        "received (its best window); null where the document went in whole.",
    )
    chunks: ChunksUsed | None = Field(
        default=None, description="What the ranking's chunking did, as /v1/rerank's usage."
    )


class ContextRequest(ContextQuery):
    documents: list[str | ContextDocumentIn] = Field(
        min_length=1, description="The top-K passages, best first (as a reranker ranked them)."
    )
    noise: NoiseIn | None = Field(default=None, description="Noise padding (The Power of Noise).")


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
        description="curvature: per arranged document (the request's, or with `rerank` the "
        "chosen ones in `rerank.indexes` order), l(rotation where it is first) + "
        "l(rotation where it is last); null for the other arrangements."
    )
    candidates: list[ContextCandidate] = Field(
        description="The scored rotations or shuffles (orders of the arranged documents)."
    )
    noise: list[NoiseOut] = Field(description="The noise passages, in prompt order.")
    gauge: ContextGauge
    prompt: str = Field(description="The prompt text, ending where the answer begins.")
    rerank: RerankChoice | None = Field(
        default=None, description="With `rerank`: the documents its reranker chose."
    )
    usage: ContextUsage


class GenerateRequest(GenerateQuery):
    documents: list[str | ContextDocumentIn] = Field(
        min_length=1, description="The top-K passages, best first."
    )


class GenerateUsage(BaseModel):
    documents: int
    prompt_tokens: int = Field(description="Tokens of the longest decoded row's prompt.")
    generated_tokens: int


class GenerateResponse(BaseModel):
    id: str
    model: str
    decoding: str
    order: list[int] = Field(
        description="naive: the order in the prompt of the request's documents (with `rerank`, "
        "of those it chose)."
    )
    answer: str
    tokens: list[int]
    attribution: list[str | int | None] = Field(
        description="Per generated token, the id (or index) of the lowest-entropy document; "
        "null for naive."
    )
    weights: list[list[float]] = Field(description="Per step, the documents' weights.")
    layers: list[int | None] = Field(description="clehe: per step, the contrast layer l*.")
    rerank: RerankChoice | None = Field(
        default=None, description="With `rerank`: the documents its reranker chose."
    )
    usage: GenerateUsage


class ModelCard(BaseModel):
    id: str = Field(description="The name a request's `model` takes (and responses carry).")
    object: Literal["model"] = "model"
    kind: str
    model: str = Field(description="The model it serves (a local folder by its name).")
    ready: bool
    runtime: str | None = Field(
        default=None,
        description="The runtime its model runs on (torch, onnx, ctranslate2), as `--backend "
        "auto` chose it; null while it loads.",
    )
    dtype: str | None = Field(
        default=None,
        description="The number format it computes in (float32, bfloat16, int8); null while "
        "it loads.",
    )


class IndexCard(BaseModel):
    """A served index by name and kind (never by its folder: no server path leaves the server)."""

    id: str
    kind: str | None = Field(default=None, description="bm25, dense, ...; null while loading.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
    indexes: list[IndexCard] = Field(default_factory=list)
    default: str = Field(description="The reranker of a /v1/rerank request without `model`.")
    embeddings: str | None = Field(
        default=None,
        description="The reranker whose encoder embeds a /v1/embeddings request without "
        "`model`; null where none embeds or while the models load.",
    )


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


class TeiLabels(BaseModel):
    """TEI's classifier labels of a reranker model (cisrank's rerankers give one score per
    pair and name no labels: both maps are empty)."""

    id2label: dict[str, str] = Field(default_factory=dict)
    label2id: dict[str, int] = Field(default_factory=dict)


class ServedRuntime(BaseModel):
    """What runs behind one served name: its model, runtime and number format."""

    model_config = ConfigDict(protected_namespaces=())

    served_model_name: str = Field(description="The name a request's `model` takes.")
    model_id: str = Field(description="Its model (a local folder by name).")
    model_dtype: str | None = Field(description="float32, bfloat16, int8, ...")
    model_runtime: str | None = Field(description="torch, onnx, ctranslate2.")


class TeiInfo(BaseModel):
    """Hugging Face text-embeddings-inference's `GET /info`, filled with what cisrank knows of
    its default reranker (the one a request without `model` gets); every reranker served is in
    `GET /v1/models`."""

    model_config = ConfigDict(protected_namespaces=())

    model_id: str = Field(description="The default reranker's model (a local folder by name).")
    model_sha: str | None = Field(
        default=None, description="TEI: the model revision asked for; cisrank takes none (null)."
    )
    model_dtype: str | None = Field(
        description="The number format the model computes in (float32, bfloat16, int8...)."
    )
    model_runtime: str | None = Field(
        default=None,
        description="cisrank (not a TEI field): the runtime the model runs on (torch, onnx, "
        "ctranslate2), as `--backend auto` chose it.",
    )
    passage_cache: dict[str, int] | None = Field(
        default=None,
        description="cisrank (not a TEI field): the default reranker's passage-embedding cache "
        "(a bi-encoder's, `passage_cache_mb`): hits, misses, evictions, entries, bytes held and "
        "budget_bytes; null where it keeps none.",
    )
    served_model_name: str = Field(description="The name responses carry in `model`.")
    embeddings: ServedRuntime | None = Field(
        default=None,
        description="cisrank (not a TEI field): the encoder of a /v1/embeddings request "
        "without `model`; null where no served reranker embeds.",
    )
    rerankers: list[ServedRuntime] = Field(
        default_factory=list,
        description="cisrank (not a TEI field): every served reranker, its model, runtime and "
        "number format (the default's are the fields above).",
    )
    model_type: dict[Literal["reranker"], TeiLabels] = Field(
        description="TEI's model type: always a reranker here."
    )
    max_concurrent_requests: int = Field(
        description="Requests waiting per reranker before 503 (`batching.max_queue`)."
    )
    max_input_length: int | None = Field(
        description="Tokens of a (query, passage) pair the model reads; null where the model "
        "takes no pair limit (CIS cuts the passage at `max_doc_tokens`)."
    )
    max_batch_tokens: int = Field(description="Estimated tokens per model call.")
    max_batch_requests: int | None = Field(
        default=None, description="Requests per model call: not bounded (null)."
    )
    max_client_batch_size: int = Field(description="Documents per request (`limits`).")
    auto_truncate: bool = Field(
        default=True, description="A pair is always cut at the model's length."
    )
    tokenization_workers: int = Field(
        description="Processes that tokenize: one per worker of the default reranker."
    )
    version: str = Field(description="cisrank's version.")
    sha: str | None = None
    docker_label: str | None = None


class TeiError(BaseModel):
    """TEI's error body (`GET /health` when the server cannot serve)."""

    error: str
    error_type: Literal["Unhealthy"] = "Unhealthy"
