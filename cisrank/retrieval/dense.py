"""Dense first stage: a bi-encoder (sentence-transformers, or a plain encoder with mean pooling as
Contriever) embeds passages into a FAISS index; queries are embedded the same way at search time.

This module is the query-time half: the index's parameters (`DenseIndexConfig`), the encoding that
passages and queries share (`encode`) and the retriever. The build (resumable encoding in shards,
then FAISS) is `cisrank.indexes.dense`.

Index types: `flat` (exact inner product, the default and the reference), `hnsw` (graph, no
training, fast at millions) and `ivf` (k-means lists, `nprobe` lists searched). With normalized
embeddings (the default, right for all-MiniLM-L6-v2) inner product is cosine; Contriever-style
models are trained for raw dot product: pass `normalize=False`. GPU FAISS is used at search time
when faiss was built with GPU support and a GPU is visible.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Literal, get_args

import numpy as np
from pydantic import Field

from cisrank.data.manifest import Manifest
from cisrank.data.types import SearchHit
from cisrank.errors import CisrankError, DamagedFileError, DataError, require
from cisrank.models.fingerprint import model_fingerprint
from cisrank.models.resolve import resolve_model
from cisrank.retrieval.base import IndexConfig
from cisrank.retrieval.docstore import DOCSTORE_FILE, DocStore

FAISS_FILE = "faiss.index"
IndexType = Literal["flat", "hnsw", "ivf"]
INDEX_TYPES: tuple[str, ...] = get_args(IndexType)


class DenseIndexConfig(IndexConfig):
    """The bi-encoder and how it embeds (all baked into the stored embeddings), and the FAISS
    index over them."""

    label: ClassVar[str] = "dense"

    model: str = Field(default="all-MiniLM-L6-v2", description="Bi-encoder: hub id or folder.")
    batch_size: int = Field(default=64, ge=1, description="Passages per encoder batch.")
    shard_size: int = Field(default=8192, ge=1, description="Passages per resumable shard.")
    normalize: bool = Field(
        default=True, description="Cosine (normalized) or raw dot product (Contriever)."
    )
    max_seq_length: int | None = Field(
        default=None, ge=1, description="Token limit; the model's own when unset."
    )
    query_prefix: str = Field(default="", description="Put before every query (e5: 'query: ').")
    passage_prefix: str = Field(default="", description="Put before every passage.")
    index_type: IndexType = Field(default="flat", description="flat (exact), hnsw or ivf.")
    hnsw_m: int = Field(default=32, ge=2, description="HNSW graph degree.")
    hnsw_ef_construction: int = Field(default=200, ge=1)
    hnsw_ef_search: int = Field(default=128, ge=1)
    ivf_nlist: int | None = Field(
        default=None, ge=1, description="IVF lists; about 4 sqrt(n) when unset."
    )
    ivf_nprobe: int = Field(default=16, ge=1, description="IVF lists searched per query.")
    dtype: str | None = Field(
        default=None,
        description="Encoder precision: float32, bfloat16 or float16; unset: the device's "
        "(bf16 on GPUs that support it, fp16 on older ones, float32 on CPU). The manifest's "
        "model.dtype records the one used.",
    )


def import_faiss():
    return require("faiss", "dense", "the dense index (FAISS)")


def encode(encoder, texts: Sequence[str], config: DenseIndexConfig, prefix: str) -> np.ndarray:
    import torch

    if prefix:
        texts = [prefix + t for t in texts]
    with torch.inference_mode():
        emb = encoder.encode(
            list(texts),
            batch_size=config.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=config.normalize,
            show_progress_bar=False,
        )
    return np.ascontiguousarray(emb, dtype=np.float32)


class DenseRetriever:
    """Embeds queries with the index's model and searches its FAISS index."""

    name = "dense"

    def __init__(
        self,
        path: str | Path,
        manifest: Manifest,
        device: str | None = None,
        check_model: bool = True,
    ) -> None:
        from cisrank.models.encoders import load_sentence_transformer

        faiss = import_faiss()
        self.path = Path(path)
        self.config = DenseIndexConfig.from_params(manifest.params)
        model = manifest.model or {}
        model_path = resolve_model(self.config.model)
        if check_model and model.get("fingerprint") not in (None, model_fingerprint(model_path)):
            raise DataError(
                f"the model '{self.config.model}' at {model_path} is not the one that built "
                f"the index at {self.path} (fingerprint differs): rebuild the index or restore "
                "the model"
            )
        self.model_name = self.config.model
        self.encoder = load_sentence_transformer(
            model_path, device, self.config.max_seq_length, self.config.dtype
        )
        try:
            self.index = faiss.read_index(str(self.path / FAISS_FILE))
        except (RuntimeError, MemoryError, ValueError) as exc:  # faiss raises RuntimeError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DamagedFileError(
                self.path / FAISS_FILE, f"FAISS cannot read it: {first}"
            ) from None
        if self.config.index_type == "hnsw":
            self.index.hnsw.efSearch = self.config.hnsw_ef_search
        elif self.config.index_type == "ivf":
            self.index.nprobe = self.config.ivf_nprobe
        self.docs = DocStore(self.path / DOCSTORE_FILE)
        if len(self.docs) != self.index.ntotal:
            raise DamagedFileError(
                self.path / DOCSTORE_FILE,
                f"{len(self.docs)} passages, but {FAISS_FILE} holds {self.index.ntotal}",
            )
        self.on_gpu = self._to_gpu(faiss)
        self._lock = threading.RLock()  # see embed_queries

    def _to_gpu(self, faiss) -> bool:
        try:
            gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
        except Exception:  # pragma: no cover - faiss builds without GPU support
            gpus = 0
        if gpus < 1 or self.config.index_type == "hnsw":  # no GPU HNSW in faiss
            return False
        self.index = faiss.index_cpu_to_all_gpus(self.index)  # pragma: no cover - needs a GPU
        return True  # pragma: no cover

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """One thread at a time: the API searches from many threads, and the encoder's fast
        tokenizer fails ("Already borrowed") when one thread changes its settings while another
        encodes; a GPU FAISS index is not safe for concurrent searches either."""
        with self._lock:
            return encode(self.encoder, queries, self.config, self.config.query_prefix)

    def search(self, query: str, k: int = 10) -> list[SearchHit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[SearchHit]]:
        if k < 1:
            raise CisrankError(f"k must be >= 1, got {k}")
        if not queries:
            return []
        with self._lock:
            emb = self.embed_queries(queries)
            scores, ids = self.index.search(emb, min(k, self.index.ntotal))
        out = []
        for row_s, row_i in zip(scores, ids, strict=True):
            pairs = sorted(
                ((int(i), float(s)) for i, s in zip(row_i, row_s, strict=True) if i >= 0),
                key=lambda p: (-p[1], p[0]),
            )
            rows = self.docs.get([i for i, _ in pairs]) if pairs else []
            out.append([SearchHit(d, s, t) for (d, t), (_, s) in zip(rows, pairs, strict=True)])
        return out
