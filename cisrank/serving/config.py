"""The server's configuration: which rerankers and indexes it serves, and the limits it enforces.

One typed object (`ServerConfig`) filled from a JSON or YAML file (`cisrank serve --config FILE`)
or built in code by tests. API keys are deliberately *not* part of it: they come from the
`CISRANK_API_KEYS` environment variable so that a config file can be committed and shared.

Example (JSON)::

    {
      "rerankers": {
        "dense": {"kind": "dense", "model": "all-MiniLM-L6-v2", "options": {"batch_size": 64}},
        "cis": {"kind": "cis", "model": "smollm2-135m-instruct", "options": {"estimator": "reverse"}}
      },
      "default_reranker": "dense",
      "embeddings": "dense",
      "indexes": {"msmarco": {"path": "indexes/msmarco-bm25"}},
      "limits": {"max_documents": 10000, "max_request_cost": 1048576,
                 "max_inflight_body_bytes": 268435456},
      "batching": {"max_batch_passages": 256, "max_batch_tokens": 16384, "max_wait_ms": 5,
                   "max_inflight_cost": 4194304}
    }

Memory and cost bounds (docs/reliability.md, "Bounds"): `limits.max_inflight_body_bytes` bounds the
request bodies held by one server process at once (503 + Retry-After beyond it, before the body is
read), a request costs the tokens of its (query, passage) pairs, counted with the model's own
tokenizer (`cisrank.serving.token_count`; `cisrank.serving.batching.pair_tokens` caps a pair at the
model's `max_length`), with `limits.max_request_cost` per request (422 naming `documents`) and
`batching.max_inflight_cost` per reranker (503 + Retry-After), and `batching.max_batch_tokens`
and `batching.max_slice_s` bound one model call so a heavy request is scored in slices
interleaved with small requests.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from cisrank.config import ComponentConfig, read_config_file, validation_problem
from cisrank.errors import CisrankError
from cisrank.rerank.chunking import Chunking
from cisrank.rerank.spec import RerankerSpec

_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"


def _count(default: int | None, description: str) -> Any:
    """A field that counts something (documents, tokens, processes): at least 1; None, where the
    field allows it, for a value chosen at start."""
    return Field(default=default, ge=1, description=description)


class IndexSpec(ComponentConfig):
    """One searchable index, opened with `cisrank.retrieval.open_index(path)` at start."""

    path: Path


class Limits(ComponentConfig):
    """Request limits: anything over them is answered with a 4xx naming the field."""

    max_documents: int = _count(10_000, "Documents per rerank request.")
    max_document_chars: int = _count(32_768, "Characters per document (before token truncation).")
    max_query_chars: int = _count(
        8_192,
        "Characters of a query; also of a /v1/context or /v1/generate template, "
        "its document format and each of its fields.",
    )
    max_id_chars: int = _count(
        256,
        "Characters of a document's id in /v1/context and /v1/generate, where a "
        "document format can render it into the prompt.",
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Request bodies over this get 413."
    )
    max_search_top_n: int = _count(1000, "Largest top_n/depth of search.")
    max_new_tokens: int = _count(256, "Most tokens one /v1/generate request may generate.")
    max_generate_documents: int = _count(
        32,
        "Passages of one /v1/generate request (each is its own row of every "
        "decoding step of the document-parallel modes).",
    )
    max_inflight_body_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="Request-body bytes one server process holds at once (each worker of "
        "--workers N has its own). A request that would go over gets 503 + Retry-After before "
        "more of its body is read: checked up front against Content-Length, counted chunk by "
        "chunk for a chunked body. Parsed, a body takes about 2-4x its bytes in Python objects "
        "until its response is sent, so the default (256 MiB) keeps a server with a small model "
        "within 2 GB; at least `max_body_bytes`, so that any allowed body can get in alone.",
    )
    max_request_cost: int = _count(
        1024 * 1024,
        "Tokens one request may cost, counted with the model's own tokenizer: for a rerank, "
        "the sum over its documents of the tokens of (query, document) (after "
        "`max_tokens_per_doc`), each pair capped at the model's `max_length` where it has one; "
        "for /v1/embeddings the tokens of its texts; for /v1/context and /v1/generate the "
        "tokens of every prompt they score. Over it: 422 naming the field (`documents`, "
        "`depth` for a reranked search, `input`), before any model work.",
    )
    body_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A request body not fully received this long after its headers gets 408 and "
        "its connection is closed: a stalled or trickling client cannot hold a connection.",
    )
    max_header_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="Bytes of a request's head (request line and headers) `cisrank serve` reads; "
        "a larger head gets 431 and its connection is closed (cisrank.api.http_protocol).",
    )
    max_headers: int = _count(100, "Header lines of one request; more get 431.")
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request head not complete this long after its connection opened (or after "
        "the first byte of a following request) gets 408 and the connection is closed; a "
        "connection that sent nothing by then is closed.",
    )
    max_inflight_response_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="Bytes of response bodies one `cisrank serve` process holds at once while "
        "clients read them (each worker has its own). A response over 64 KiB that would go "
        "over is answered 503 + Retry-After instead: 32 clients that never read an 8 MB answer "
        "held 306 MB for as long as they stayed connected.",
    )
    response_send_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A response whose client takes in no 64 KiB of it for this long is cut "
        "and its connection closed (a client that stops reading cannot hold its answer's "
        "memory); counted as a client abort (499).",
    )
    max_connections: int | None = _count(
        None,
        "Connections one server process holds; one more is answered 503 with Retry-After and "
        "closed at once. Default and ceiling: the descriptor limit (ulimit -n) less the accept "
        "backlog and 128 descriptors kept for files, so the process never runs out of them.",
    )


class BatchingConfig(ComponentConfig):
    """How concurrent requests share model batches (see `cisrank.serving.batching`)."""

    max_batch_passages: int = _count(
        256,
        "Passages per model call; bigger requests are split into chunks of this size "
        "so that one large request cannot stall small ones for more than one chunk.",
    )
    max_batch_tokens: int = _count(
        16_384,
        "Tokens per model call (see `max_request_cost`): a slice of a "
        "request is bounded by this as well as by `max_batch_passages`, so one slice of long "
        "documents takes about as long as one of short ones, and a small request arriving "
        "behind a heavy one waits at most about one such slice. A single passage over it is "
        "scored alone. The default is TEI's max_batch_tokens: 32 pairs of 512 tokens, or about "
        "160 typical 100-token passage pairs.",
    )
    max_slice_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="Seconds one model call (a slice of a request) may take, at the rate "
        "measured on the reranker's recent calls: a slice holds at most the tokens that take "
        "this long, and at most `max_batch_tokens`. On a CPU running a causal LM, where "
        "16,384 tokens take a minute, this is what bounds the wait behind one slice and the "
        "work left running after a hang-up or a deadline (one passage or prompt that takes "
        "longer goes alone).",
    )
    max_wait_ms: float = Field(
        default=5.0, ge=0, le=10_000, description="How long a batch waits to fill up."
    )
    max_age_ms: float = Field(
        default=1000.0,
        ge=0,
        le=600_000,
        description="A request that got no passages scored for this long is planned first "
        "(then its clock restarts): a steady stream of small requests cannot starve a large one.",
    )
    max_queue: int = _count(256, "Requests waiting per reranker before 503 + Retry-After.")
    max_inflight_cost: int = _count(
        4 * 1024 * 1024,
        "Tokens accepted and not yet scored per reranker (the work queued "
        "ahead of a new request, so a bound on its wait); a request that would go over gets 503 "
        "+ Retry-After. A request is always admitted when nothing is in flight; at least "
        "`limits.max_request_cost`.",
    )
    request_timeout_s: float = Field(
        default=60.0, gt=0, description="A request still unscored after this gets 503."
    )
    retry_after_s: int = _count(1, "Retry-After sent with 503.")


DEFAULT_RERANKERS: dict[str, dict[str, Any]] = {
    "dense": {"kind": "dense", "options": {"backend": "auto"}},
    "student": {"kind": "student"},
    "dense-float32": {"kind": "dense", "options": {"backend": "auto", "dtype": "float32"}},
}
"""What a bare `cisrank serve` serves, chosen on DL21 (bench/RESULTS.md, "The default chosen
again"): the best on DL21 among the rerankers within 1.5x of the fastest's 100-passage latency.
`dense` is all-MiniLM-L6-v2 on `--backend auto` (ONNX Runtime int8 with the `onnx` extra: DL21
nDCG@10 0.5801, DL19 0.6438, p50 1.52 s against the student's 1.66 s in one run), the default of
`/v1/rerank`; `student`, the distilled cross-encoder shipped with cisrank (DL21 0.5505, DL19
0.6458), served by name; `dense-float32`, the same bi-encoder in float32 (ONNX Runtime float32,
as torch's to 1e-5, or torch float32 without the extra), the encoder of `/v1/embeddings`: int8
moves a cosine by up to 0.035-0.064 from float32's, and an embeddings client stores the vectors
and compares them with others made elsewhere from the same model."""

DEFAULT_EMBEDDINGS = "dense-float32"
"""The reranker of `DEFAULT_RERANKERS` whose encoder `/v1/embeddings` serves."""


class ServerConfig(ComponentConfig):
    """Everything `cisrank serve` needs besides host, port and workers."""

    rerankers: dict[str, RerankerSpec] = Field(
        default_factory=lambda: {
            name: RerankerSpec.model_validate(spec) for name, spec in DEFAULT_RERANKERS.items()
        },
        description="Served rerankers by name. Default: 'dense', the all-MiniLM-L6-v2 bi-encoder "
        "on --backend auto (ONNX Runtime int8 with the onnx extra; DL21 nDCG@10 0.5801, the "
        "default of /v1/rerank); 'student', the cross-encoder shipped with cisrank (DL21 "
        "0.5505); 'dense-float32', the same bi-encoder in float32 (the encoder of "
        "/v1/embeddings).",
    )
    default_reranker: str | None = Field(
        default=None, description="Used when a request names no model; the first one when unset."
    )
    embeddings: str | None = Field(
        default=None,
        description="The served reranker whose bi-encoder /v1/embeddings uses when a request "
        "names no reranker: for a request without `model`, and first among those serving the "
        "model id a request names. Default: 'dense-float32' with the default rerankers; with "
        "your own, the default reranker where it embeds, else the first that does.",
    )
    indexes: dict[str, IndexSpec] = Field(default_factory=dict)
    default_index: str | None = None
    normalize: Literal["none", "sigmoid", "minmax"] = Field(
        default="none",
        description="Default score normalization; raw scores unless a request or this asks.",
    )
    limits: Limits = Field(default_factory=Limits)
    chunking: Chunking = Field(
        default_factory=Chunking,
        description="How /v1/rerank cuts a document longer than its model's window: windows of "
        "window_tokens (null: the model's own) overlapping by overlap_tokens, scored each and "
        "pooled (max, mean or first); a request's max_chunks_per_doc caps them.",
    )
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    graceful_timeout_s: float | None = Field(
        default=60.0,
        gt=0,
        description="How long SIGTERM waits for in-flight requests; those still running then get "
        "503 with Retry-After (JSON), and `cisrank serve` exits 0.",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_embeddings(cls, data: Any) -> Any:
        """The default rerankers come with their embeddings encoder; rerankers of one's own
        name theirs (or leave it to the default reranker)."""
        if isinstance(data, dict) and "rerankers" not in data and "embeddings" not in data:
            return {**data, "embeddings": DEFAULT_EMBEDDINGS}
        return data

    @model_validator(mode="after")
    def _check_names(self) -> ServerConfig:
        if not self.rerankers:
            raise ValueError("configure at least one reranker under 'rerankers'")
        for name in [*self.rerankers, *self.indexes]:
            if not re.match(_NAME_RE, name):
                raise ValueError(f"name {name!r} must match {_NAME_RE}")
        if self.default_reranker is not None and self.default_reranker not in self.rerankers:
            raise ValueError(
                f"default_reranker {self.default_reranker!r} is not one of the configured "
                f"rerankers: {', '.join(self.rerankers)}"
            )
        if self.embeddings is not None and self.embeddings not in self.rerankers:
            raise ValueError(
                f"embeddings {self.embeddings!r} is not one of the configured rerankers: "
                f"{', '.join(self.rerankers)}"
            )
        if self.default_index is not None and self.default_index not in self.indexes:
            raise ValueError(f"default_index {self.default_index!r} is not a configured index")
        # A budget smaller than one allowed request would answer that request "retry later"
        # forever: refuse the config instead.
        if self.limits.max_inflight_body_bytes < self.limits.max_body_bytes:
            raise ValueError(
                f"limits.max_inflight_body_bytes ({self.limits.max_inflight_body_bytes}) must be "
                f"at least limits.max_body_bytes ({self.limits.max_body_bytes})"
            )
        if self.batching.max_inflight_cost < self.limits.max_request_cost:
            raise ValueError(
                f"batching.max_inflight_cost ({self.batching.max_inflight_cost}) must be at "
                f"least limits.max_request_cost ({self.limits.max_request_cost})"
            )
        return self

    @property
    def default_reranker_name(self) -> str:
        return self.default_reranker or next(iter(self.rerankers))

    @property
    def default_index_name(self) -> str | None:
        return self.default_index or next(iter(self.indexes), None)

    @classmethod
    def load(cls, path: str | Path) -> ServerConfig:
        """Read a JSON (or, with PyYAML installed, YAML) file; errors name the file and field."""
        data = read_config_file(path, "server config")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise CisrankError(f"{path}: {validation_problem(exc)}") from None
