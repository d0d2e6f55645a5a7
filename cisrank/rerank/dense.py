"""Dense reranker: cosine similarity of a bi-encoder's normalized query and passage embeddings.

Works with any sentence-transformers model folder, and with a plain Hugging Face encoder such as
Contriever (sentence-transformers then adds mean pooling, which is exactly Contriever's pooling).

The model runs on a runtime of the table (`cisrank.runtimes.table`, task `feature-extraction`):
torch (sentence-transformers' `encode`, exact float32 by default, bf16 under autocast:
`embedder_torch`) or ONNX Runtime (the model's module stack exported once, float32 or dynamic
int8: `embedder_onnx`), `auto` choosing for the host (`cisrank.runtimes.auto`). `/v1/embeddings`
and the dense teacher embed through this class, so they run on the same runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cisrank.rerank.base import BaseReranker, fast_only
from cisrank.rerank.configs import DenseRerankerConfig
from cisrank.runtimes.auto import resolve_embedder_backend
from cisrank.runtimes.embedder import EmbedderBackend
from cisrank.runtimes.table import DYNAMIC_INT8_CPU_BATCH_SIZE, FEATURE_EXTRACTION, runtime

GPU_BATCH_SIZE = 128


class DenseReranker(BaseReranker):
    name = "dense"
    passage_major = True  # a passage is embedded once for all the queries of a batch

    def __init__(
        self, model: str | None = None, *, config: DenseRerankerConfig | None = None, **options: Any
    ) -> None:
        """`options` are `DenseRerankerConfig` fields."""
        self.config = (config or DenseRerankerConfig()).replace(model=model, **options)
        self.model_name = self.config.model
        c = self.config
        self.backend, dtype = resolve_embedder_backend(c.backend, c.device, c.dtype)
        self.config = c = c.replace(backend=self.backend, dtype=dtype)
        load = runtime(self.backend, FEATURE_EXTRACTION).load()
        self.runner: EmbedderBackend = load(
            c.model,
            c.dtype,
            device=c.device,
            threads=torch.get_num_threads(),  # ONNX Runtime's: torch's (--threads-per-worker)
            max_length=c.max_seq_length,
        )
        self.compute_type = self.runner.compute_type
        self.runtime = self.runner.name
        on_gpu = self.runner.device.type == "cuda"
        # dynamic int8 embeds one text a batch: its activation scale is the batch's
        cpu_batch = (
            DYNAMIC_INT8_CPU_BATCH_SIZE
            if self.compute_type == "int8"
            else runtime(self.backend, FEATURE_EXTRACTION).cpu_batch_size or 16
        )
        self.batch_size = c.batch_size or (GPU_BATCH_SIZE if on_gpu else cpu_batch)
        # Capabilities: the encoder's tokenizer, and its sequence length as the pair limit.
        self.fast_tokenizer = fast_only(self.runner.tokenizer)
        self.pair_token_limit = self.runner.max_length
        self.embedder = self  # its bi-encoder embeds texts (`/v1/embeddings`)

    @property
    def dimensions(self) -> int | None:
        """The length of its embeddings, as the model declares it."""
        return self.runner.dimensions

    def embed(self, texts: Sequence[str], prefix: str = "") -> np.ndarray:
        """L2-normalized float32 embeddings, one row per text, on the runtime's path."""
        if prefix:
            texts = [prefix + t for t in texts]
        return np.asarray(self.runner.embed(list(texts), self.batch_size), dtype=np.float32)

    def score_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        """All queries in one encode call and all passages in another, so concurrent requests
        share model batches. Identical texts are embedded once: cheaper, and they cannot get
        different scores from sitting in differently padded batches."""
        requests = [(q, list(p)) for q, p in requests]
        if not any(p for _, p in requests):
            return [[] for _ in requests]
        queries = list(dict.fromkeys(q for q, p in requests if p))
        texts = list(dict.fromkeys(t for _, p in requests for t in p))
        q_emb = dict(zip(queries, self.embed(queries, self.config.query_prefix), strict=True))
        p_emb = self.embed(texts, self.config.passage_prefix)
        row = {t: i for i, t in enumerate(texts)}
        out: list[list[float]] = []
        for q, p in requests:
            if not p:
                out.append([])
                continue
            # One dot product per distinct text, in float64: BLAS may round identical rows of
            # one matrix differently, which would split exact ties.
            rows = list(dict.fromkeys(row[t] for t in p))
            sims = p_emb[rows].astype(np.float64) @ q_emb[q].astype(np.float64)
            by_row = dict(zip(rows, sims.tolist(), strict=True))
            out.append([by_row[row[t]] for t in p])
        return out

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={self.model_name!r}, backend={self.backend!r}, "
            f"dtype={self.compute_type!r})"
        )
