"""Dense first stage: a bi-encoder (sentence-transformers, or a plain encoder with mean pooling as
Contriever) embeds passages into a FAISS index; queries are embedded the same way at search time.

Encoding is the slow part of a build (hours for millions of passages on a CPU), so it runs in
shards of `shard_size` passages, each saved atomically to `shards/emb-NNNNN.npy` as soon as it is
done. A rerun of an interrupted build (same corpus, same parameters, same model fingerprint)
reuses every finished shard. When all shards exist they are joined into `embeddings.npy`, the
FAISS index is built from it, and the shards are removed.

Index types: `flat` (exact inner product, the default and the reference), `hnsw` (graph, no
training, fast at millions) and `ivf` (k-means lists, `nprobe` lists searched). With normalized
embeddings (the default, right for all-MiniLM-L6-v2) inner product is cosine; Contriever-style
models are trained for raw dot product: pass `normalize=False`. GPU FAISS is used at search time
when faiss was built with GPU support and a GPU is visible.
"""

from __future__ import annotations

import io
import json
import logging
import math
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from cisrank.data.corpus import CorpusReader
from cisrank.data.manifest import BuildOutput, Manifest, library_versions
from cisrank.data.types import SearchHit
from cisrank.errors import CisrankError, DataError, require
from cisrank.fileio import atomic_write_bytes, atomic_write_text
from cisrank.models.fingerprint import model_fingerprint
from cisrank.models.resolve import resolve_model
from cisrank.retrieval.docstore import DOCSTORE_FILE, DocStore, write_docstore

log = logging.getLogger(__name__)

SHARD_DIR = "shards"
EMBEDDINGS_FILE = "embeddings.npy"
FAISS_FILE = "faiss.index"
INDEX_TYPES = ("flat", "hnsw", "ivf")
DEFAULTS: dict[str, Any] = {
    "model": "all-MiniLM-L6-v2",
    "batch_size": 64,
    "shard_size": 8192,
    "normalize": True,
    "max_seq_length": None,
    "query_prefix": "",
    "passage_prefix": "",
    "index_type": "flat",
    "hnsw_m": 32,
    "hnsw_ef_construction": 200,
    "hnsw_ef_search": 128,
    "ivf_nlist": None,
    "ivf_nprobe": 16,
}


def _faiss():
    return require("faiss", "dense", "the dense index (FAISS)")


def resolve_params(params: dict[str, Any]) -> dict[str, Any]:
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise CisrankError(f"unknown dense parameters {sorted(unknown)}: known {sorted(DEFAULTS)}")
    merged = {**DEFAULTS, **{k: v for k, v in params.items() if v is not None}}
    if merged["index_type"] not in INDEX_TYPES:
        raise CisrankError(
            f"unknown FAISS index type '{merged['index_type']}': one of {', '.join(INDEX_TYPES)}"
        )
    for key in ("batch_size", "shard_size", "hnsw_m", "ivf_nprobe"):
        if int(merged[key]) < 1:
            raise CisrankError(f"dense parameter {key} must be >= 1, got {merged[key]}")
    return merged


def _encode(encoder, texts: Sequence[str], params: dict[str, Any], prefix: str) -> np.ndarray:
    import torch

    if prefix:
        texts = [prefix + t for t in texts]
    with torch.inference_mode():
        emb = encoder.encode(
            list(texts),
            batch_size=int(params["batch_size"]),
            convert_to_numpy=True,
            normalize_embeddings=bool(params["normalize"]),
            show_progress_bar=False,
        )
    return np.ascontiguousarray(emb, dtype=np.float32)


def _save_npy(path: Path, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array)
    atomic_write_bytes(path, buf.getvalue())


def _shard_ok(path: Path, rows: int) -> bool:
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return arr.ndim == 2 and arr.shape[0] == rows


def build_faiss(embeddings: np.ndarray, params: dict[str, Any]):
    """A FAISS inner-product index of the requested type over `embeddings` (float32, [n, d])."""
    faiss = _faiss()
    n, dim = embeddings.shape
    kind = params["index_type"]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, int(params["hnsw_m"]), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(params["hnsw_ef_construction"])
    else:
        nlist = int(params["ivf_nlist"] or max(1, min(int(4 * math.sqrt(n)), n // 39 or 1)))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(0)
        sample = embeddings[rng.choice(n, size=min(n, 256 * nlist), replace=False)]
        index.train(sample)
    index.add(embeddings)
    return index


def build_dense(
    reader: CorpusReader,
    out: Path,
    params: dict[str, Any],
    *,
    resume: bool,
    progress: bool,
    device: str | None = None,
) -> BuildOutput:
    """Encode in resumable shards, join, build FAISS, write the document store."""
    params = resolve_params(params)
    corpus = reader.load()
    faiss = _faiss()
    model_path = resolve_model(params["model"])
    fingerprint = model_fingerprint(model_path)
    shard_dir = out / SHARD_DIR
    shard_size = int(params["shard_size"])
    meta = {"model_fingerprint": fingerprint, "passages": len(corpus), "params": params}
    meta_path = shard_dir / "meta.json"
    if shard_dir.exists():
        same = resume and meta_path.is_file() and json.loads(meta_path.read_text()) == meta
        if not same:
            log.info("%s: discarding shards of a different build", shard_dir)
            shutil.rmtree(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(meta_path, json.dumps(meta, sort_keys=True))

    n_shards = math.ceil(len(corpus) / shard_size)
    spans = [(i, i * shard_size, min(len(corpus), (i + 1) * shard_size)) for i in range(n_shards)]
    todo = [s for s in spans if not _shard_ok(shard_dir / f"emb-{s[0]:05d}.npy", s[2] - s[1])]
    done_rows = len(corpus) - sum(end - start for _, start, end in todo)
    reused = n_shards - len(todo)
    if reused:
        log.info("resuming: %d of %d shards already encoded", reused, n_shards)
    encoder = None
    with tqdm(
        total=len(corpus), initial=done_rows, desc="encode", unit="passage", disable=not progress
    ) as bar:
        for i, start, end in todo:
            if encoder is None:
                from cisrank.models.encoders import load_sentence_transformer

                encoder = load_sentence_transformer(model_path, device, params["max_seq_length"])
            emb = _encode(encoder, corpus.texts[start:end], params, params["passage_prefix"])
            _save_npy(shard_dir / f"emb-{i:05d}.npy", emb)
            bar.update(end - start)

    embeddings = np.concatenate([np.load(shard_dir / f"emb-{i:05d}.npy") for i, _, _ in spans])
    _save_npy(out / EMBEDDINGS_FILE, embeddings)
    index = build_faiss(embeddings, params)
    tmp = out / (FAISS_FILE + ".partial")
    faiss.write_index(index, str(tmp))
    tmp.replace(out / FAISS_FILE)
    write_docstore(out / DOCSTORE_FILE, zip(corpus.docids, corpus.texts, strict=True))
    shutil.rmtree(shard_dir)
    return BuildOutput(
        files=[EMBEDDINGS_FILE, FAISS_FILE, DOCSTORE_FILE],
        params=params,
        libraries=library_versions(
            "sentence-transformers", "transformers", "torch", "faiss-cpu", "faiss-gpu", "numpy"
        ),
        model={
            "name": params["model"],
            "path": model_path,
            "fingerprint": fingerprint,
            "dimension": int(embeddings.shape[1]),
        },
        extra={"shards": n_shards, "shards_reused": reused},
    )


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

        faiss = _faiss()
        self.path = Path(path)
        self.params = resolve_params(manifest.params)
        model = manifest.model or {}
        model_path = resolve_model(self.params["model"])
        if check_model and model.get("fingerprint") not in (None, model_fingerprint(model_path)):
            raise DataError(
                f"the model '{self.params['model']}' at {model_path} is not the one that built "
                f"the index at {self.path} (fingerprint differs): rebuild the index or restore "
                "the model"
            )
        self.model_name = self.params["model"]
        self.encoder = load_sentence_transformer(model_path, device, self.params["max_seq_length"])
        self.index = faiss.read_index(str(self.path / FAISS_FILE))
        if self.params["index_type"] == "hnsw":
            self.index.hnsw.efSearch = int(self.params["hnsw_ef_search"])
        elif self.params["index_type"] == "ivf":
            self.index.nprobe = int(self.params["ivf_nprobe"])
        self.on_gpu = self._to_gpu(faiss)
        self.docs = DocStore(self.path / DOCSTORE_FILE)
        self._lock = threading.RLock()  # see embed_queries

    def _to_gpu(self, faiss) -> bool:
        try:
            gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
        except Exception:  # pragma: no cover - faiss builds without GPU support
            gpus = 0
        if gpus < 1 or self.params["index_type"] == "hnsw":  # no GPU HNSW in faiss
            return False
        self.index = faiss.index_cpu_to_all_gpus(self.index)  # pragma: no cover - needs a GPU
        return True  # pragma: no cover

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """One thread at a time: the API searches from many threads, and the encoder's fast
        tokenizer fails ("Already borrowed") when one thread changes its settings while another
        encodes; a GPU FAISS index is not safe for concurrent searches either."""
        with self._lock:
            return _encode(self.encoder, queries, self.params, self.params["query_prefix"])

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
