"""Dense reranker: cosine similarity of a bi-encoder's normalized query and passage embeddings.

Works with any sentence-transformers model folder, and with a plain Hugging Face encoder such as
Contriever (sentence-transformers then adds mean pooling, which is exactly Contriever's pooling).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cisrank.models.encoders import load_sentence_transformer
from cisrank.rerank.base import BaseReranker, fast_only
from cisrank.rerank.configs import DenseRerankerConfig


class DenseReranker(BaseReranker):
    name = "dense"
    passage_major = True  # a passage is embedded once for all the queries of a batch

    def __init__(
        self, model: str | None = None, *, config: DenseRerankerConfig | None = None, **options: Any
    ) -> None:
        """`options` are `DenseRerankerConfig` fields."""
        self.config = (config or DenseRerankerConfig()).replace(model=model, **options)
        self.model_name = self.config.model
        self.encoder = load_sentence_transformer(
            self.config.model, self.config.device, self.config.max_seq_length
        )
        on_gpu = self.encoder.device.type == "cuda"
        self.batch_size = self.config.batch_size or (128 if on_gpu else 16)
        # Capabilities: the encoder's tokenizer, and its sequence length as the pair limit.
        self.fast_tokenizer = fast_only(self.encoder.tokenizer)
        limit = self.encoder.max_seq_length
        self.pair_token_limit = limit if isinstance(limit, int) and limit > 0 else None
        weights = next(self.encoder.parameters(), None)
        self.compute_type = (
            str(weights.dtype).removeprefix("torch.") if weights is not None else None
        )
        self.embedder = self  # its bi-encoder embeds texts (`/v1/embeddings`)

    @property
    def dimensions(self) -> int | None:
        """The length of its embeddings, as the model declares it."""
        dimensions = self.encoder.get_embedding_dimension()
        return int(dimensions) if dimensions else None

    def embed(self, texts: Sequence[str], prefix: str = "") -> np.ndarray:
        """L2-normalized float32 embeddings; sentence-transformers sorts by length internally."""
        if prefix:
            texts = [prefix + t for t in texts]
        with torch.inference_mode():
            emb = self.encoder.encode(
                list(texts),
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.asarray(emb, dtype=np.float32)

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
