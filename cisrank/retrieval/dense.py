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
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import numpy as np
from pydantic import Field
from tqdm.auto import tqdm

from cisrank.data.corpus import CorpusReader
from cisrank.data.manifest import BuildOutput, Manifest, library_versions
from cisrank.data.types import SearchHit
from cisrank.errors import CisrankError, DamagedFileError, DataError, require
from cisrank.fileio import atomic_write_bytes, atomic_write_text
from cisrank.models.fingerprint import model_fingerprint
from cisrank.models.resolve import resolve_model
from cisrank.retrieval.base import IndexConfig
from cisrank.retrieval.docstore import DOCSTORE_FILE, DocStore, write_docstore

log = logging.getLogger(__name__)

SHARD_DIR = "shards"
EMBEDDINGS_FILE = "embeddings.npy"
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


def _faiss():
    return require("faiss", "dense", "the dense index (FAISS)")


def _encode(encoder, texts: Sequence[str], config: DenseIndexConfig, prefix: str) -> np.ndarray:
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


def build_faiss(embeddings: np.ndarray, config: DenseIndexConfig):
    """A FAISS inner-product index of the requested type over `embeddings` (float32, [n, d])."""
    faiss = _faiss()
    n, dim = embeddings.shape
    kind = config.index_type
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
    else:
        nlist = int(config.ivf_nlist or max(1, min(int(4 * math.sqrt(n)), n // 39 or 1)))
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
    config: DenseIndexConfig,
    *,
    resume: bool,
    progress: bool,
    device: str | None = None,
    engine: str | None = None,
    ray: Any = None,
    job_wrapper: Callable[[Any], Any] | None = None,
) -> BuildOutput:
    """Encode in resumable shards, join, build FAISS, write the document store.

    `engine="ray"` encodes the missing shards on a Ray actor pool (`ray`: the engine's
    `RayOptions`; `job_wrapper` wraps the actors' job, for tests); the shards, the join, FAISS
    and the document store are the same as a local build's, so a build interrupted on one
    engine resumes on the other.
    """
    from cisrank.devices import resolve_device, resolve_dtype
    from cisrank.models.encoders import dtype_name, load_sentence_transformer

    engine = engine or "local"
    if engine not in ("local", "ray"):
        raise CisrankError(f"--engine must be one of local, ray, not '{engine}'")
    corpus = reader.load()
    faiss = _faiss()
    model_path = resolve_model(config.model)
    fingerprint = model_fingerprint(model_path)
    with ExitStack() as stack:  # a Ray cluster started for the build stops after it
        if engine == "ray":
            # The actors' device decides the precision (a GPU: bf16), so it is resolved there.
            from cisrank import ray_engine

            ray_options = ray or ray_engine.RayOptions()
            ray_mod = stack.enter_context(ray_engine.ray_session(ray_options))
            res = ray_engine.plan_resources(ray_mod, ray_options)
            base_job = DenseShardJob(model_path, config, device)
            dtype_label = ray_engine.describe_remote(ray_mod, base_job, res)["dtype"]
        else:
            # Resolved once, before any shard: the precision decides the embeddings, so shards
            # encoded in another one (a rerun on another device) are not reused, and the manifest
            # records it.
            dtype_label = dtype_name(resolve_dtype(config.dtype, resolve_device(device)))
        shard_dir = out / SHARD_DIR
        meta = {
            "model_fingerprint": fingerprint,
            "passages": len(corpus),
            "params": config.model_dump(),
            "dtype": dtype_label,
        }
        meta_path = shard_dir / "meta.json"
        if shard_dir.exists():
            same = resume and meta_path.is_file() and json.loads(meta_path.read_text()) == meta
            if not same:
                log.info("%s: discarding shards of a different build", shard_dir)
                shutil.rmtree(shard_dir)
        shard_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(meta_path, json.dumps(meta, sort_keys=True))

        shard_size = config.shard_size
        n_shards = math.ceil(len(corpus) / shard_size)
        spans = [
            (i, i * shard_size, min(len(corpus), (i + 1) * shard_size)) for i in range(n_shards)
        ]
        todo = [s for s in spans if not _shard_ok(shard_dir / f"emb-{s[0]:05d}.npy", s[2] - s[1])]
        done_rows = len(corpus) - sum(end - start for _, start, end in todo)
        reused = n_shards - len(todo)
        if reused:
            log.info("resuming: %d of %d shards already encoded", reused, n_shards)
        encoder = None
        scored = 0
        with tqdm(
            total=len(corpus),
            initial=done_rows,
            desc="encode" if engine == "local" else "encode (ray)",
            unit="passage",
            disable=not progress,
        ) as bar:
            if engine == "local":
                for i, start, end in todo:
                    if encoder is None:
                        encoder = load_sentence_transformer(
                            model_path, device, config.max_seq_length, config.dtype
                        )
                    emb = _encode(encoder, corpus.texts[start:end], config, config.passage_prefix)
                    _save_npy(shard_dir / f"emb-{i:05d}.npy", emb)
                    bar.update(end - start)
                    scored += 1
            else:
                scored = _encode_ray(
                    ray_engine,
                    ray_mod,
                    ray_options,
                    res,
                    base_job,
                    job_wrapper,
                    corpus.texts,
                    todo,
                    shard_dir,
                    bar,
                )

    embeddings = np.concatenate([np.load(shard_dir / f"emb-{i:05d}.npy") for i, _, _ in spans])
    _save_npy(out / EMBEDDINGS_FILE, embeddings)
    index = build_faiss(embeddings, config)
    tmp = out / (FAISS_FILE + ".partial")
    faiss.write_index(index, str(tmp))
    tmp.replace(out / FAISS_FILE)
    write_docstore(out / DOCSTORE_FILE, zip(corpus.docids, corpus.texts, strict=True))
    shutil.rmtree(shard_dir)
    return BuildOutput(
        files=[EMBEDDINGS_FILE, FAISS_FILE, DOCSTORE_FILE],
        params=config.model_dump(),
        libraries=library_versions(
            "sentence-transformers", "transformers", "torch", "faiss-cpu", "faiss-gpu", "numpy"
        ),
        model={
            "name": config.model,
            "path": model_path,
            "fingerprint": fingerprint,
            "dimension": int(embeddings.shape[1]),
            "dtype": dtype_label,
        },
        extra={
            "engine": engine,
            "shards": n_shards,
            "shards_reused": reused,
            "shards_scored": scored,
        },
    )


class DenseShardJob:
    """Dense encoding as Ray actors run it: the local build's encoder and `_encode` over each
    shard; the result rows are the embeddings, one fixed-size list per passage."""

    def __init__(self, model_path: str, config: DenseIndexConfig, device: str | None) -> None:
        self.model_path = str(model_path)
        self.config = config
        self.device = device

    def load(self) -> Any:
        from cisrank.models.encoders import load_sentence_transformer

        return load_sentence_transformer(
            self.model_path, self.device, self.config.max_seq_length, self.config.dtype
        )

    def describe(self, encoder: Any) -> dict[str, Any]:
        from cisrank.models.encoders import dtype_name

        return {"dtype": dtype_name(next(encoder.parameters()).dtype)}

    def score(self, encoder: Any, batch: Any) -> Any:
        import pyarrow as pa

        texts = batch.column("text").to_pylist()
        emb = _encode(encoder, texts, self.config, self.config.passage_prefix)
        values = pa.array(emb.reshape(-1), pa.float32())
        return pa.table(
            {
                "shard": batch.column("shard"),
                "pos": batch.column("pos"),
                "embedding": pa.FixedSizeListArray.from_arrays(values, emb.shape[1]),
            }
        )


def _encode_ray(
    ray_engine, ray, options, res, base_job, job_wrapper, texts, todo, shard_dir, bar
) -> int:
    """The shards in `todo` encoded by the actor pool, each saved as the local build saves it."""
    import pyarrow as pa

    blocks = [
        pa.table(
            {
                ray_engine.SHARD: pa.array([i] * (end - start), pa.int64()),
                ray_engine.POS: pa.array(range(end - start), pa.int64()),
                "text": pa.array(texts[start:end], pa.string()),
            }
        )
        for i, start, end in todo
    ]
    expected = {i: end - start for i, start, end in todo}

    def write(shard: int, table: Any) -> None:
        column = table.column("embedding").combine_chunks()
        dim = column.type.list_size
        emb = column.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
        _save_npy(shard_dir / f"emb-{shard:05d}.npy", np.ascontiguousarray(emb, np.float32))
        bar.update(table.num_rows)

    job = job_wrapper(base_job) if job_wrapper is not None else base_job
    return ray_engine.run_shards(ray, blocks, job, options, res, expected, write)


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
            return _encode(self.encoder, queries, self.config, self.config.query_prefix)

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
