"""The dense index build: every passage embedded by the bi-encoder, then a FAISS index over them.

Encoding is the slow part of a build (hours for millions of passages on a CPU), so it runs in
shards of `shard_size` passages on the shard runner (`cisrank.jobs.shards`), each saved
atomically to `shards/emb-NNNNN.npy` as soon as it is done. A rerun of an interrupted build
(same corpus, same parameters, same model fingerprint) reuses every finished shard. When all shards exist they are joined into
`embeddings.npy`, the FAISS index is built from it, and the shards are removed.

The index's parameters, the encoding and the retriever that searches the folder are the
query-time half, `cisrank.retrieval.dense`.
"""

from __future__ import annotations

import io
import logging
import math
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from cisrank.data.corpus import CorpusReader
from cisrank.data.manifest import BuildOutput, library_versions
from cisrank.fileio import atomic_write_bytes
from cisrank.jobs import ray as ray_jobs
from cisrank.jobs.ray import check_engine
from cisrank.jobs.shards import Progress, Shards, ShardWriter, run_shards
from cisrank.models.fingerprint import model_fingerprint
from cisrank.models.resolve import resolve_model
from cisrank.retrieval.dense import (
    FAISS_FILE,
    DenseIndexConfig,
    encode,
    import_faiss,
    open_encoder,
)
from cisrank.retrieval.docstore import DOCSTORE_FILE, write_docstore

log = logging.getLogger(__name__)

SHARD_DIR = "shards"
EMBEDDINGS_FILE = "embeddings.npy"


def _save_npy(path: Path, array: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, array)
    atomic_write_bytes(path, buf.getvalue())


def _shard_path(shard_dir: Path, index: int) -> Path:
    return shard_dir / f"emb-{index:05d}.npy"


def _shard_ok(path: Path, rows: int) -> bool:
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return arr.ndim == 2 and arr.shape[0] == rows


def build_faiss(embeddings: np.ndarray, config: DenseIndexConfig):
    """A FAISS inner-product index of the requested type over `embeddings` (float32, [n, d])."""
    faiss = import_faiss()
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

    The shards are the shard runner's (`cisrank.jobs.shards`): `engine="ray"` encodes the
    missing ones on a Ray actor pool (`ray`: the engine's `RayOptions`); `job_wrapper` wraps the
    job wherever it encodes, for tests. The shards, the join, FAISS and the document store are
    the same on either engine, so a build interrupted on one resumes on the other.
    """
    from cisrank.models.encoders import refuse_causal_lm

    corpus = reader.load()
    faiss = import_faiss()
    model_path = resolve_model(config.model)
    refuse_causal_lm(config.model, model_path)  # before any shard is encoded
    fingerprint = model_fingerprint(model_path)
    shard_dir = out / SHARD_DIR
    run = run_shards(
        DenseShardJob(model_path, config, device),
        partial(_plan, corpus, config, shard_dir, fingerprint),
        ShardWriter(lambda i: _shard_path(shard_dir, i), _embeddings_npy),
        engine=check_engine(engine),
        resume=resume,
        progress=Progress("encode", "passage", progress, total=len(corpus)),
        ray=ray,
        job_wrapper=job_wrapper,
        describe=lambda: _local_runtime(config, device),
    )
    embeddings = _join(out, shard_dir, run.shards, config, faiss)
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
            "runtime": run.info["runtime"],
            "dtype": run.info["dtype"],
        },
        extra={
            "engine": run.engine.value,
            "shards": run.shards,
            "shards_reused": run.reused,
            "shards_scored": run.scored,
        },
    )


def _plan(
    corpus: Any, config: DenseIndexConfig, shard_dir: Path, fingerprint: str, info: dict[str, Any]
) -> Shards[tuple[int, int]]:
    """The corpus in spans of `shard_size` passages, the folder claimed for this build: the
    runtime and precision decide the embeddings, so shards encoded in others (a rerun on another
    device or backend) are not reused, and the manifest records them."""
    size, total = config.shard_size, len(corpus)
    meta = {
        "model_fingerprint": fingerprint,
        "passages": total,
        "params": config.model_dump(),
        "runtime": info["runtime"],
        "dtype": info["dtype"],
    }
    return Shards(
        items=((start, min(total, start + size)) for start in range(0, total, size)),
        rows=lambda span: span[1] - span[0],
        block=lambda i, span: ray_jobs.text_block(i, corpus.texts[span[0] : span[1]]),
        complete=lambda i, rows: _shard_ok(_shard_path(shard_dir, i), rows),
        folder=shard_dir,
        meta=meta,
    )


def _join(out: Path, shard_dir: Path, shards: int, config: DenseIndexConfig, faiss: Any):
    """The shards joined into `embeddings.npy`, and the FAISS index over them (temp + rename)."""
    embeddings = np.concatenate([np.load(_shard_path(shard_dir, i)) for i in range(shards)])
    _save_npy(out / EMBEDDINGS_FILE, embeddings)
    index = build_faiss(embeddings, config)
    tmp = out / (FAISS_FILE + ".partial")
    faiss.write_index(index, str(tmp))
    tmp.replace(out / FAISS_FILE)
    return embeddings


def _local_runtime(config: DenseIndexConfig, device: str | None) -> dict[str, str]:
    """The runtime and precision a local build encodes in, known before the model loads (a Ray
    build's actors report theirs: their device decides it)."""
    from cisrank.devices import resolve_device, resolve_dtype
    from cisrank.models.encoders import dtype_name
    from cisrank.runtimes.auto import resolve_embedder_backend

    runtime, dtype = resolve_embedder_backend(config.backend, device, config.dtype)
    if runtime == "onnx":
        return {"runtime": runtime, "dtype": "float32" if dtype in (None, "fp32") else dtype}
    return {"runtime": runtime, "dtype": dtype_name(resolve_dtype(dtype, resolve_device(device)))}


def _embeddings_npy(shard: int, table: Any) -> bytes:
    """A shard's embeddings (`DenseShardJob.score`'s rows) as the bytes of its `.npy` file."""
    column = table.column("embedding").combine_chunks()
    emb = column.flatten().to_numpy(zero_copy_only=False).reshape(-1, column.type.list_size)
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(emb, np.float32))
    return buf.getvalue()


class DenseShardJob:
    """Dense encoding as Ray actors run it: the local build's encoder and `encode` over each
    shard; the result rows are the embeddings, one fixed-size list per passage."""

    def __init__(self, model_path: str, config: DenseIndexConfig, device: str | None) -> None:
        self.model_path = str(model_path)
        self.config = config
        self.device = device

    def load(self) -> Any:
        """The encoder on the build's runtime (`open_encoder`, as its queries will be), with its
        texts a batch."""
        return open_encoder(
            self.model_path, self.config, self.device, self.config.backend, self.config.dtype
        )

    def describe(self, encoder: Any) -> dict[str, Any]:
        runner, _ = encoder
        return {"runtime": runner.name, "dtype": runner.compute_type}

    def score(self, encoder: Any, batch: Any) -> Any:
        import pyarrow as pa

        texts = batch.column("text").to_pylist()
        runner, batch_size = encoder
        emb = encode(runner, texts, self.config, self.config.passage_prefix, batch_size)
        values = pa.array(emb.reshape(-1), pa.float32())
        return pa.table(
            {
                "shard": batch.column("shard"),
                "pos": batch.column("pos"),
                "embedding": pa.FixedSizeListArray.from_arrays(values, emb.shape[1]),
            }
        )
