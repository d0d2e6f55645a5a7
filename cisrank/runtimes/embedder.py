"""The feature-extraction task's interface: what a runtime computes for the bi-encoder reranker
(`cisrank.rerank.dense`), and so for `/v1/embeddings` and the dense teacher, which embed with it:
one unit-length float32 embedding per text.

A backend owns the whole of a text's embedding (tokenization, batching, the model, pooling and
normalization), because the reference it must reproduce is sentence-transformers' own `encode`
with the model's modules (Transformer, Pooling: mean, CLS, max..., Dense, Normalize):

- `embedder_torch` runs `SentenceTransformer.encode` itself, in float32 (exact, the default) or
  bf16 under autocast on CPUs with native bf16 and on GPUs;
- `embedder_onnx` runs the model's whole module stack (transformer to sentence embedding)
  exported once to ONNX, float32 or dynamic int8, with the tokenizer as sentence-transformers
  calls it and the cross-encoder's batching (`cisrank.runtimes.batching`).

The caller (the reranker) owns what is about requests: prefixes, deduplication, the dot
products. A new runtime is one module implementing `EmbedderBackend` with a loader (`Loader`) and
one row of the runtime table (`cisrank.runtimes.table`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch


class EmbedderBackend(Protocol):
    """A bi-encoder behind a runtime."""

    @property
    def name(self) -> str:
        """The runtime ("torch", "onnx", ...)."""
        ...

    @property
    def compute_type(self) -> str:
        """What it computes in ("float32", "bfloat16", "int8")."""
        ...

    @property
    def device(self) -> torch.device: ...

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the texts are read with."""
        ...

    @property
    def max_length(self) -> int | None:
        """The tokens of a text it reads (the model's `max_seq_length`, or the one asked for)."""
        ...

    @property
    def dimensions(self) -> int | None:
        """The length of its embeddings, as the model declares it."""
        ...

    def embed(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        """Unit-length float32 embeddings of `texts`, one row each, in input order, at most
        `batch_size` texts a model batch."""
        ...


class Loader(Protocol):
    """A feature-extraction row's loader in the runtime table: the backend of `model` in
    `compute_type` (None: the runtime's default) on `device`, `threads` intra-op threads of a CPU
    runtime (None: torch's), `max_length` the tokens a text is cut to (None: the model's),
    `options` the runtime's own."""

    def __call__(
        self,
        model: str,
        compute_type: str | None,
        *,
        device: str | None = None,
        threads: int | None = None,
        max_length: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> EmbedderBackend: ...


def normalized(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 length in float32, as `torch.nn.functional.normalize` does
    (sentence-transformers' `normalize_embeddings=True`: a zero row stays zero)."""
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, np.float32(1e-12))
