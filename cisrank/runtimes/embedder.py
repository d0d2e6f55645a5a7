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
from concurrent.futures import Executor
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

    @property
    def lanes(self) -> Executor | None:
        """Threads that run its batches at once (ONNX int8, `int8_lanes`); None: one after
        the other."""
        ...

    def embed(self, texts: Sequence[str], batch_size: int, normalize: bool = True) -> np.ndarray:
        """Float32 embeddings of `texts`, one row each, in input order, at most `batch_size`
        texts a model batch; unit length unless `normalize` is False (models trained for raw
        dot products, as Contriever: a Normalize module of the model's own still applies)."""
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


def embed_batch_size(
    backend: EmbedderBackend, asked: int | None, task_cpu_batch: int | None
) -> int:
    """Texts a model batch: what the caller asked, else 128 on a GPU and the runtime's CPU size
    (16) on a CPU; dynamic int8 always one text a batch, whatever was asked: its activation scale
    is the batch's, and a passage's embedding must be a function of the passage alone (an index
    built in batches of 64 would not match the same passage embedded at serve time)."""
    from cisrank.runtimes.table import DYNAMIC_INT8_CPU_BATCH_SIZE

    if backend.compute_type == "int8":
        return DYNAMIC_INT8_CPU_BATCH_SIZE
    if asked:
        return asked
    return GPU_BATCH_SIZE if backend.device.type == "cuda" else (task_cpu_batch or 16)


GPU_BATCH_SIZE = 128


def open_embedder(
    model: str,
    backend: str,
    dtype: str | None,
    *,
    device: str | None = None,
    threads: int | None = None,
    max_length: int | None = None,
    batch_size: int | None = None,
) -> tuple[EmbedderBackend, int]:
    """The one way a bi-encoder is opened: for the dense reranker (and so `/v1/embeddings`, the
    hybrid's dense part and the dense teacher) and for the dense index's passages and queries, so
    an index built offline and its queries run on the same runtime and precision. `backend` may
    be `auto` (`cisrank.runtimes.auto.resolve_embedder_backend`); returns the loaded runtime and
    the texts a model batch (`embed_batch_size`)."""
    from cisrank.runtimes.auto import resolve_embedder_backend
    from cisrank.runtimes.table import FEATURE_EXTRACTION, check_serves, runtime

    name, compute = resolve_embedder_backend(backend, device, dtype)
    check_serves(name, FEATURE_EXTRACTION)
    row = runtime(name, FEATURE_EXTRACTION)
    runner = row.load()(model, compute, device=device, threads=threads, max_length=max_length)
    return runner, embed_batch_size(runner, batch_size, row.cpu_batch_size)
