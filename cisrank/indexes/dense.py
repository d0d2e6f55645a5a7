"""The dense index build: every passage embedded by the bi-encoder, then a FAISS index over them.

Encoding is the slow part of a build (hours for millions of passages on a CPU), so it runs in
shards of `shard_size` passages, each saved atomically to `shards/emb-NNNNN.npy` as soon as it is
done. A rerun of an interrupted build (same corpus, same parameters, same model fingerprint)
reuses every finished shard (`cisrank.data.shards`). When all shards exist they are joined into
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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from cisrank import ray_engine
from cisrank.data.corpus import CorpusReader
from cisrank.data.manifest import BuildOutput, library_versions
from cisrank.data.shards import claim_shard_dir, resume_shards
from cisrank.fileio import atomic_write_bytes
from cisrank.models.fingerprint import model_fingerprint
from cisrank.models.resolve import resolve_model
from cisrank.ray_engine import RayOptions, check_engine
from cisrank.retrieval.dense import FAISS_FILE, DenseIndexConfig, encode, import_faiss
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

    `engine="ray"` encodes the missing shards on a Ray actor pool (`ray`: the engine's
    `RayOptions`; `job_wrapper` wraps the actors' job, for tests); the shards, the join, FAISS
    and the document store are the same as a local build's, so a build interrupted on one
    engine resumes on the other.
    """
    from cisrank.devices import resolve_device, resolve_dtype
    from cisrank.models.encoders import dtype_name, load_sentence_transformer, refuse_causal_lm

    engine = check_engine(engine)
    corpus = reader.load()
    faiss = import_faiss()
    model_path = resolve_model(config.model)
    refuse_causal_lm(config.model, model_path)  # before any shard is encoded
    fingerprint = model_fingerprint(model_path)
    with ExitStack() as stack:  # a Ray cluster started for the build stops after it
        if engine == "ray":
            # The actors' device decides the precision (a GPU: bf16), so it is resolved there.
            ray_options = ray or RayOptions()
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
        claim_shard_dir(shard_dir, meta, resume=resume, logger=log)

        size, total = config.shard_size, len(corpus)
        plan = resume_shards(
            ((start, min(total, start + size)) for start in range(0, total, size)),
            rows=lambda span: span[1] - span[0],
            complete=lambda i, rows: _shard_ok(_shard_path(shard_dir, i), rows),
        )
        if plan.reused:
            log.info("resuming: %d of %d shards already encoded", plan.reused, plan.shards)
        encoder = None
        scored = 0
        with tqdm(
            total=total,
            initial=plan.done_rows,
            desc="encode" if engine == "local" else "encode (ray)",
            unit="passage",
            disable=not progress,
        ) as bar:
            if engine == "local":
                for i, (start, end) in plan.todo:
                    if encoder is None:
                        encoder = load_sentence_transformer(
                            model_path, device, config.max_seq_length, config.dtype
                        )
                    emb = encode(encoder, corpus.texts[start:end], config, config.passage_prefix)
                    _save_npy(_shard_path(shard_dir, i), emb)
                    bar.update(end - start)
                    scored += 1
            else:

                def write(shard: int, table: Any) -> None:
                    column = table.column("embedding").combine_chunks()
                    dim = column.type.list_size
                    emb = column.flatten().to_numpy(zero_copy_only=False).reshape(-1, dim)
                    _save_npy(_shard_path(shard_dir, shard), np.ascontiguousarray(emb, np.float32))
                    bar.update(table.num_rows)

                blocks = [
                    ray_engine.text_block(i, corpus.texts[start:end])
                    for i, (start, end) in plan.todo
                ]
                job = job_wrapper(base_job) if job_wrapper is not None else base_job
                scored = ray_engine.run_shards(
                    ray_mod, blocks, job, ray_options, res, plan.expected, write
                )

    embeddings = np.concatenate([np.load(_shard_path(shard_dir, i)) for i in range(plan.shards)])
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
            "shards": plan.shards,
            "shards_reused": plan.reused,
            "shards_scored": scored,
        },
    )


class DenseShardJob:
    """Dense encoding as Ray actors run it: the local build's encoder and `encode` over each
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
        emb = encode(encoder, texts, self.config, self.config.passage_prefix)
        values = pa.array(emb.reshape(-1), pa.float32())
        return pa.table(
            {
                "shard": batch.column("shard"),
                "pos": batch.column("pos"),
                "embedding": pa.FixedSizeListArray.from_arrays(values, emb.shape[1]),
            }
        )
