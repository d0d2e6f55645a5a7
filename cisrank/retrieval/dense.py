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
from cisrank.runtimes.embedder import EmbedderBackend, open_embedder
from cisrank.runtimes.table import BackendName

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
    backend: BackendName = Field(
        default="torch",
        description="Runtime that embeds the passages, and the queries at search time: torch "
        "(sentence-transformers' encode, exact float32 on a CPU), onnx (the model's modules "
        "exported to ONNX Runtime, CPU: float32 as torch's to 1e-5, or int8, one passage a "
        "batch) or auto (the dense reranker's rule). The manifest's model.runtime records the "
        "one used, and queries are embedded on it.",
    )
    dtype: str | None = Field(
        default=None,
        description="Encoder precision: float32, bfloat16 or float16 (torch), float32 or int8 "
        "(onnx); unset: the runtime's (torch: bf16 on GPUs that support it, fp16 on older "
        "ones, float32 on CPU). The manifest's model.dtype records the one used.",
    )


def import_faiss():
    return require("faiss", "dense", "the dense index (FAISS)")


def open_encoder(
    model_path: str, config: DenseIndexConfig, device: str | None, runtime: str, dtype: str | None
) -> tuple[EmbedderBackend, int]:
    """The index's bi-encoder on `runtime` in `dtype`, and its texts a batch: the dense
    reranker's way in (`cisrank.runtimes.embedder.open_embedder`), so passages embedded by a
    build and the queries searched against them run the same arithmetic."""
    return open_embedder(
        model_path,
        runtime,
        dtype,
        device=device,
        max_length=config.max_seq_length,
        batch_size=config.batch_size,
    )


def encode(
    encoder: EmbedderBackend,
    texts: Sequence[str],
    config: DenseIndexConfig,
    prefix: str,
    batch_size: int,
) -> np.ndarray:
    if prefix:
        texts = [prefix + t for t in texts]
    emb = encoder.embed(list(texts), batch_size, normalize=config.normalize)
    return np.ascontiguousarray(emb, dtype=np.float32)


def recorded_runtime(manifest: Manifest, config: DenseIndexConfig) -> tuple[str, str | None]:
    """The runtime and precision an index's passages were embedded in, which its queries must
    be embedded in too. Indexes built before runtimes were recorded are torch's, at the
    precision asked for then (unset: the device's)."""
    model = manifest.model or {}
    if "runtime" not in model:
        return "torch", config.dtype
    return str(model["runtime"]), model.get("dtype")


class DenseRetriever:
    """Embeds queries with the index's model and searches its FAISS index."""

    name = "dense"

    def __init__(
        self,
        path: str | Path,
        manifest: Manifest,
        device: str | None = None,
        check_model: bool = True,
        backend: str | None = None,
        dtype: str | None = None,
    ) -> None:
        """`backend` and `dtype`, where given, are what the caller expects the queries to be
        embedded with: an index embedded otherwise is refused (its vectors and the queries'
        would not be comparable); unset, the index's own (`recorded_runtime`)."""
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
        self.runtime, self.dtype = recorded_runtime(manifest, self.config)
        asked = {"backend": backend, "dtype": dtype}
        held = {"backend": self.runtime, "dtype": self.dtype}
        for what in ("backend", "dtype"):
            if asked[what] not in (None, "auto") and asked[what] != held[what]:
                raise DataError(
                    f"the index at {self.path} was embedded with {what} {held[what]}, not "
                    f"{asked[what]}: its queries are embedded the same way (drop the option, or "
                    f"rebuild the index with --{what} {asked[what]})"
                )
        self.encoder, self.batch_size = open_encoder(
            model_path, self.config, device, self.runtime, self.dtype
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
            return encode(
                self.encoder, queries, self.config, self.config.query_prefix, self.batch_size
            )

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
