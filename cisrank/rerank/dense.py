"""Dense reranker: cosine similarity of a bi-encoder's normalized query and passage embeddings.

Works with any sentence-transformers model folder, and with a plain Hugging Face encoder such as
Contriever (sentence-transformers then adds mean pooling, which is exactly Contriever's pooling).

The model runs on a runtime of the table (`cisrank.runtimes.table`, task `feature-extraction`):
torch (sentence-transformers' `encode`, exact float32 by default, bf16 under autocast:
`embedder_torch`) or ONNX Runtime (the model's module stack exported once, float32 or dynamic
int8: `embedder_onnx`), `auto` choosing for the host (`cisrank.runtimes.auto`). `/v1/embeddings`
and the dense teacher embed through this class, so they run on the same runtime.

Passage embeddings are kept by content (`passage_cache_mb`, `cisrank.rerank.passage_cache`)
where an embedding is a function of the passage alone: float32 (torch or ONNX Runtime) and int8
one text a batch. Measured on all-MiniLM-L6-v2 over 100 DL19 passages (one thread, AVX512-BF16
host): float32 embeddings move with their batch company by at most 1.2e-7 a component (float32
rounding, the same as the uncached reranker's between two requests of different company), torch
bf16 under autocast by 7.6e-4, about 6,000 times that; so the cache is off in bf16 and float16
(a passage's cached vector would be its first request's company's). A cached float32 vector is
the one computed in the request that first missed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cisrank.models.fingerprint import model_fingerprint
from cisrank.models.resolve import resolve_model
from cisrank.rerank.base import BaseReranker, PassageWindow, fast_only
from cisrank.rerank.configs import DenseRerankerConfig
from cisrank.rerank.passage_cache import EmbeddingCache, cache_space
from cisrank.runtimes.auto import resolve_embedder_backend
from cisrank.runtimes.embedder import EmbedderBackend, open_embedder

MIB = 1 << 20


def company_moves(compute_type: str | None, batch_size: int) -> str | None:
    """Why a passage's embedding in `compute_type` at `batch_size` texts a batch depends on the
    texts batched with it (None where it does not, beyond float32 rounding): what rules the
    passage cache out. float32 is exact up to rounding; int8's activation scale is its batch's
    unless the batch is the one text; bf16 and float16 round the padded batch's products
    (measured 7.6e-4 a component for bf16 autocast, see the module docstring)."""
    if compute_type == "float32":
        return None
    if compute_type == "int8":
        return None if batch_size == 1 else "int8 over several texts a batch"
    return f"{compute_type} rounds each batch's products differently"


def _model_identity(model: str) -> str:
    """The fingerprint of the model's folder (`model_fingerprint`), or of its name where it
    resolves to a hub id rather than a folder."""
    path = resolve_model(model)
    if Path(path).is_dir():
        return model_fingerprint(path)
    return "name:" + path


class DenseReranker(BaseReranker):
    name = "dense"
    passage_major = True  # a passage is embedded once for all the queries of a batch

    def __init__(
        self,
        model: str | None = None,
        *,
        config: DenseRerankerConfig | None = None,
        passage_cache: EmbeddingCache | None = None,
        **options: Any,
    ) -> None:
        """`options` are `DenseRerankerConfig` fields; `passage_cache` is a cache to share (its
        entries are keyed by model, runtime, dtype and length, so several rerankers may hold
        one), else one of `passage_cache_mb` is made where the runtime allows it."""
        self.config = (config or DenseRerankerConfig()).replace(model=model, **options)
        self.model_name = self.config.model
        c = self.config
        self.backend, dtype = resolve_embedder_backend(c.backend, c.device, c.dtype)
        self.config = c = c.replace(backend=self.backend, dtype=dtype)
        self.runner: EmbedderBackend
        self.runner, self.batch_size = open_embedder(
            c.model,
            self.backend,
            c.dtype,
            device=c.device,
            threads=torch.get_num_threads(),  # ONNX Runtime's: torch's (--threads-per-worker)
            max_length=c.max_seq_length,
            batch_size=c.batch_size,
        )
        self.compute_type = self.runner.compute_type
        self.runtime = self.runner.name
        # Capabilities: the encoder's tokenizer, and its sequence length as the pair limit.
        self.fast_tokenizer = fast_only(self.runner.tokenizer)
        self.pair_token_limit = self.runner.max_length
        if self.pair_token_limit:
            tok = self.runner.tokenizer
            reserved = tok.num_special_tokens_to_add(pair=False)
            if c.passage_prefix:
                reserved += len(tok(c.passage_prefix, add_special_tokens=False)["input_ids"])
            self.passage_window = PassageWindow(
                max(1, self.pair_token_limit - reserved), self.fast_tokenizer
            )
        self.embedder = self  # its bi-encoder embeds texts (`/v1/embeddings`)
        # The passage cache, where a passage's embedding is its own (`company_moves`).
        self.passage_cache_off = company_moves(self.compute_type, self.batch_size)
        if self.passage_cache_off is not None or (passage_cache is None and not c.passage_cache_mb):
            self.passage_cache = None
        else:
            if passage_cache is None:
                passage_cache = EmbeddingCache(c.passage_cache_mb * MIB)
            self.passage_cache = passage_cache
            self._cache_space = cache_space(
                _model_identity(c.model), self.runtime, self.compute_type, self.pair_token_limit
            )

    @property
    def dimensions(self) -> int | None:
        """The length of its embeddings, as the model declares it."""
        return self.runner.dimensions

    def embed(self, texts: Sequence[str], prefix: str = "") -> np.ndarray:
        """L2-normalized float32 embeddings, one row per text, on the runtime's path."""
        if prefix:
            texts = [prefix + t for t in texts]
        return np.asarray(self.runner.embed(list(texts), self.batch_size), dtype=np.float32)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """The passages' embeddings (the passage prefix put before each), those in the passage
        cache read from it and only the others encoded, in one call, then kept."""
        texts = [self.config.passage_prefix + t for t in texts]
        cache = self.passage_cache
        if cache is None:
            return self.embed(texts)
        found = cache.get_many(self._cache_space, texts)
        missing = [i for i, v in enumerate(found) if v is None]
        if missing:
            new = self.embed([texts[i] for i in missing])
            cache.put_many(self._cache_space, [texts[i] for i in missing], new)
            for i, row in zip(missing, new, strict=True):
                found[i] = row
        rows = [row for row in found if row is not None]
        if len(rows) != len(found):  # every text is a hit or was embedded just now
            raise RuntimeError("a passage embedding is missing after the cache was filled")
        if not rows:
            return np.zeros((0, self.dimensions or 0), dtype=np.float32)
        return np.stack(rows).astype(np.float32, copy=False)

    def score_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]:
        """All queries in one encode call and all passages in another, so concurrent requests
        share model batches. Identical texts are embedded once: cheaper, and they cannot get
        different scores from sitting in differently padded batches.

        Passages go through the passage cache (`embed_passages`); queries do not: a query is
        rarely sent twice (each request brings a new question), it is one text of a request's
        hundred, and kept it would evict passages that do come back."""
        requests = [(q, list(p)) for q, p in requests]
        if not any(p for _, p in requests):
            return [[] for _ in requests]
        queries = list(dict.fromkeys(q for q, p in requests if p))
        texts = list(dict.fromkeys(t for _, p in requests for t in p))
        q_emb = dict(zip(queries, self.embed(queries, self.config.query_prefix), strict=True))
        p_emb = self.embed_passages(texts)
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
