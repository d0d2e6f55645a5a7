"""The offline prior job: log p(K) of every passage of a corpus, computed once into a prior store.

CIS = log p(K|Q) - log p(K), and log p(K) depends on the passage alone. Left to query time, it
doubles the forward passes of every first sighting of a passage; computed offline, once per corpus
and on whatever accelerator is at hand, it leaves only the conditional term on the hot path.

The job is the index kind `prior` (`cisrank index build prior`), run by the interrupt-safe driver of
`cisrank.indexes.build`. Its one file, `priors.sqlite`, is a `PriorStore` filled through the CIS
reranker's own prior path (`CISReranker.summed_log_priors`: look the batch up, score the misses from
[BOS], write them back), so the keys (hash of the truncated token ids) and the namespace
(`store_fingerprint`: model, tokenizer, compute dtype, `max_doc_tokens`) are by construction the
ones a `CISReranker` with the same model, dtype and `max_doc_tokens` looks up: the file is used
as is with `--prior-store`. The template and `normalize` do not enter: priors are stored as summed
log-probabilities and normalized when read.

Resume needs no bookkeeping of its own. Entries are content-addressed and each batch is committed
in one transaction, so a rerun after an interruption looks every batch up, finds what the
interrupted run committed and computes only the rest.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator
from tqdm.auto import tqdm

from cisrank import ray_engine
from cisrank.data.corpus import CorpusReader
from cisrank.data.manifest import BuildOutput, library_versions
from cisrank.data.shards import claim_shard_dir, resume_shards
from cisrank.errors import CisrankError
from cisrank.ray_engine import POS, SHARD, RayOptions, check_engine
from cisrank.runtimes.table import BackendName
from cisrank.rerank.prior_table import TABLE_FILE
from cisrank.retrieval.base import IndexConfig
from cisrank.workers import WorkerOptions, WorkerPool

log = logging.getLogger(__name__)

PRIOR_FILE = "priors.sqlite"
DEFAULT_BATCH_SIZE = 256
DEFAULT_SHARD_SIZE = 4096
"""Passages per shard of a Ray build (a multiple of the batch size keeps the engine's batches
those of a local build): the unit of work an actor takes and of what a rerun keeps."""
SHARD_DIR = "shards"


class PriorIndexConfig(IndexConfig):
    """Parameters that change the stored values; a change between an interrupted run and its
    rerun starts clean. How the job runs (device, batch sizes) is passed as options instead, so
    that a rerun with another batch size or device still resumes."""

    label: ClassVar[str] = "prior"
    unknown_hint: ClassVar[str] = (
        " (batch_size, batch_tokens and device are options of the build, not parameters)"
    )

    model: str | None = Field(
        default=None,
        validate_default=True,
        description="Causal LM of the CIS reranker: hub id or folder (required).",
    )
    max_doc_tokens: int = Field(
        default=512, ge=1, description="Passage tokens kept; must match the reranker's."
    )
    dtype: str | None = Field(
        default=None,
        description="float32, bfloat16, float16 (default: the device's, as the reranker picks "
        "it); part of the store's key, so it must match the reranker's.",
    )
    backend: BackendName = Field(
        default="torch",
        description="Runtime of the causal LM, as the reranker's --backend (auto: onnx int8 on "
        "a CPU with the onnx extra); part of the store's key, so it must match the reranker's.",
    )

    @field_validator("model", mode="before")
    @classmethod
    def _model_given(cls, model: object) -> str:
        # No default model is a safe guess: priors of the wrong model are silently useless.
        if model is None or not str(model).strip():
            raise CisrankError("the prior index needs a causal LM: pass --model (hub id or folder)")
        return str(model)


def _batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def build_prior(
    reader: CorpusReader,
    out: Path,
    config: PriorIndexConfig,
    *,
    resume: bool,
    progress: bool,
    device: str | None = None,
    batch_size: int | None = None,
    batch_tokens: int | None = None,
    engine: str | None = None,
    ray: RayOptions | None = None,
    shard_size: int | None = None,
    job_wrapper: Callable[[Any], Any] | None = None,
    workers: WorkerOptions | None = None,
) -> BuildOutput:
    """Stream the corpus in batches and store log p(K) of every passage not stored yet.

    With several `workers`, this process scores every N-th batch and N - 1 worker processes
    the others, each with its own model and its own connection to the same store (SQLite in WAL
    mode takes concurrent writers; a key is written once whoever scores it).

    `engine="ray"` scores the corpus on a Ray actor pool instead, into the Parquet prior table
    `priors.parquet` (see `build_prior_ray`).

    A passage is its `contents` (title and text), the text retrievers return for reranking.
    `batch_size` passages are looked up, scored and committed together, so at most one batch of
    work is lost to an interruption; `batch_tokens` bounds the padded tokens per forward pass
    (the engine's default when None). `resume` needs no handling: whatever an interrupted run
    committed is found in the store by its key and not computed again.
    """
    from cisrank.lm.backends import load_engine
    from cisrank.rerank.cis import CISReranker
    from cisrank.rerank.prior_store import PriorStore

    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
    if batch_size < 1:
        raise CisrankError(f"batch_size must be >= 1, got {batch_size}")
    if check_engine(engine) == "ray":
        return build_prior_ray(
            reader,
            out,
            config,
            resume=resume,
            progress=progress,
            device=device,
            batch_size=batch_size,
            batch_tokens=batch_tokens,
            ray_options=ray or RayOptions(),
            shard_size=shard_size,
            job_wrapper=job_wrapper,
        )
    (out / TABLE_FILE).unlink(missing_ok=True)  # a Ray build's table, if the engine changed
    # The model first: a bad --model fails before any file of the index is written.
    lm = load_engine(
        str(config.model),
        backend=config.backend,
        device=device,
        dtype=config.dtype,
        batch_tokens=batch_tokens,
    )
    store = PriorStore(out / PRIOR_FILE)
    try:
        reranker = CISReranker(
            config.model,
            max_doc_tokens=config.max_doc_tokens,
            normalize="sum",
            prior_store=store,
            engine=lm,
        )
        fingerprint = reranker.store_fingerprint
        stored_before = store.count(fingerprint)
        if stored_before:
            log.info("%s: %d priors already stored, computing the rest", out, stored_before)
        passages = 0
        pool = workers.count if workers is not None else 1
        extra = (
            WorkerPool(
                PriorStoreJob(
                    **_PriorModel.fields(config, batch_tokens, device), store=str(out / PRIOR_FILE)
                ),
                pool - 1,
                workers.threads_per_worker if workers is not None else 1,
            )
            if pool > 1
            else None
        )
        pending: list[Any] = []
        try:
            with tqdm(desc="prior", unit="passage", disable=not progress) as bar:
                for i, texts in enumerate(_batched((p.contents for p in reader), batch_size)):
                    if extra is not None and i % pool:
                        pending.append(extra.submit(texts))
                        while len(pending) > 2 * pool:  # bounded: the corpus streams
                            bar.update(pending.pop(0).result())
                    else:
                        # the reranker's own path: store lookup, misses scored from [BOS],
                        # written back
                        reranker.summed_log_priors(reranker.passage_ids(texts))
                        bar.update(len(texts))
                    passages += len(texts)
                    bar.set_postfix(
                        computed=store.count(fingerprint) - stored_before, refresh=False
                    )
                for future in pending:
                    bar.update(future.result())
        finally:
            if extra is not None:
                extra.close()
        stored = store.count(fingerprint)
        reused = passages - (stored - stored_before)
    finally:
        store.close()  # the last connection checkpoints the WAL: priors.sqlite is self-contained
    computed = stored - stored_before
    log.info("%s: %d passages, %d priors computed, %d reused", out, passages, computed, reused)
    return BuildOutput(
        files=[PRIOR_FILE],
        mutable=[PRIOR_FILE],  # a CIS reranker with --prior-store adds the priors it computes
        params={
            **config.model_dump(),
            "batch_size": batch_size,
            "batch_tokens": lm.batch_tokens,
        },
        libraries=library_versions("transformers", "torch", "tokenizers"),
        model={
            "name": config.model,
            "fingerprint": lm.fingerprint(),
            "store_fingerprint": fingerprint,
            "dtype": lm.compute_type,
            "device": lm.device,
        },
        extra={
            "passages": passages,
            "priors_computed": computed,
            "priors_reused": reused,
            "priors_stored": stored,
        },
    )


@dataclass(frozen=True)
class _PriorModel:
    """The model of a prior job as each of its workers or actors loads it: its own engine, and
    the CIS reranker's prior path (summed log-probabilities)."""

    model: str
    max_doc_tokens: int
    dtype: str | None
    batch_tokens: int | None
    device: str | None
    backend: str

    @staticmethod
    def fields(
        config: PriorIndexConfig, batch_tokens: int | None, device: str | None
    ) -> dict[str, Any]:
        """The model part of a job from the index's parameters and the build's options."""
        return {
            "model": str(config.model),
            "max_doc_tokens": config.max_doc_tokens,
            "dtype": config.dtype,
            "batch_tokens": batch_tokens,
            "device": device,
            "backend": config.backend,
        }

    def reranker(self, prior_store: Any = None) -> Any:
        """The CIS reranker, keeping its priors in `prior_store` (None: in its memory)."""
        from cisrank.lm.backends import load_engine
        from cisrank.rerank.cis import CISReranker

        engine = load_engine(
            self.model,
            backend=self.backend,
            device=self.device,
            dtype=self.dtype,
            batch_tokens=self.batch_tokens,
        )
        return CISReranker(
            self.model,
            max_doc_tokens=self.max_doc_tokens,
            normalize="sum",
            prior_store=prior_store,
            engine=engine,
        )


@dataclass(frozen=True)
class PriorStoreJob(_PriorModel):
    """A worker of the local prior job: its own model and its own connection to the store,
    scoring batches through the reranker's prior path (lookup, misses scored, written back)."""

    store: str

    def load(self) -> Any:
        from cisrank.rerank.prior_store import PriorStore

        return self.reranker(PriorStore(self.store))

    def score(self, reranker: Any, texts: list[str]) -> int:
        reranker.summed_log_priors(reranker.passage_ids(texts))
        return len(texts)


# ---------------------------------------------------------------------------------- Ray engine


@dataclass(frozen=True)
class PriorShardJob(_PriorModel):
    """The prior job's scoring as Ray actors run it: the CIS reranker's own prior path
    (`CISReranker.summed_log_priors`) over each shard, `batch_size` passages at a time, as the
    local job does; the results are the prior table's rows."""

    batch_size: int

    def load(self) -> Any:
        # no prior store: the priors a shard repeats are kept in the reranker's memory
        return self.reranker()

    def describe(self, reranker: Any) -> dict[str, Any]:
        engine = reranker.engine
        return {
            "fingerprint": engine.fingerprint(),
            "store_fingerprint": reranker.store_fingerprint,
            "dtype": engine.compute_type,
            "device": engine.device,
            "batch_tokens": engine.batch_tokens,
        }

    def score(self, reranker: Any, batch: Any) -> Any:
        import pyarrow as pa

        from cisrank.rerank.prior_store import passage_key
        from cisrank.rerank.prior_table import prior_rows, table_schema

        texts = batch.column("text").to_pylist()
        items: list[tuple[str, float, int]] = []
        for start in range(0, len(texts), self.batch_size):
            docs = reranker.passage_ids(texts[start : start + self.batch_size])
            logprobs = reranker.summed_log_priors(docs)
            items += [(passage_key(d), lp, len(d)) for d, lp in zip(docs, logprobs, strict=True)]
        table = pa.table(prior_rows(reranker.store_fingerprint, items), schema=table_schema())
        return table.append_column(SHARD, batch.column(SHARD)).append_column(POS, batch.column(POS))


def _shard_path(folder: Path, index: int) -> Path:
    return folder / f"prior-{index:05d}.parquet"


def _prior_shard_ok(path: Path, rows: int, fingerprint: str) -> bool:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["fingerprint"])
    except (OSError, ValueError):
        return False
    if table.num_rows != rows:
        return False
    return rows == 0 or pc.all(pc.equal(table.column(0), fingerprint)).as_py() is True


def build_prior_ray(
    reader: CorpusReader,
    out: Path,
    config: PriorIndexConfig,
    *,
    resume: bool,
    progress: bool,
    device: str | None,
    batch_size: int,
    batch_tokens: int | None,
    ray_options: RayOptions,
    shard_size: int | None = None,
    job_wrapper: Callable[[Any], Any] | None = None,
) -> BuildOutput:
    """log p(K) of every passage on a Ray actor pool, into the Parquet prior table.

    The corpus is cut into shards of `shard_size` passages; each shard missing from `shards/`
    is one block for the actors, and its rows are written to `shards/prior-NNNNN.parquet`
    (temp file and rename) once they are all back. A rerun keeps every shard file of the same
    store fingerprint and shard size, so only the missing shards are scored. When all are
    there, they are joined into `priors.parquet` (sorted by key, one row per distinct passage),
    and the shards are removed; the driver writes the manifest after that.

    `job_wrapper` wraps the actors' job (tests use it to count or kill actors).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cisrank.fileio import atomic_write_bytes
    from cisrank.rerank.prior_table import write_prior_table

    shard_size = DEFAULT_SHARD_SIZE if shard_size is None else int(shard_size)
    if shard_size < 1:
        raise CisrankError(f"shard_size must be >= 1, got {shard_size}")
    base = PriorShardJob(
        **_PriorModel.fields(config, batch_tokens, device), batch_size=batch_size
    )
    job = job_wrapper(base) if job_wrapper is not None else base
    shard_dir = out / SHARD_DIR
    with ray_engine.ray_session(ray_options) as ray:
        res = ray_engine.plan_resources(ray, ray_options)
        info = ray_engine.describe_remote(ray, base, res)
        fingerprint = info["store_fingerprint"]
        meta = {"store_fingerprint": fingerprint, "shard_size": shard_size}
        claim_shard_dir(shard_dir, meta, resume=resume, logger=log)
        plan = resume_shards(
            (
                ray_engine.text_block(i, texts)
                for i, texts in enumerate(_batched((p.contents for p in reader), shard_size))
            ),
            rows=lambda block: block.num_rows,
            complete=lambda i, rows: _prior_shard_ok(_shard_path(shard_dir, i), rows, fingerprint),
        )
        if plan.reused:
            log.info("%s: resuming, %d of %d shards already scored", out, plan.reused, plan.shards)

        with tqdm(
            total=plan.rows,
            initial=plan.done_rows,
            desc="prior (ray)",
            unit="passage",
            disable=not progress,
        ) as bar:

            def write(shard: int, table: Any) -> None:
                sink = pa.BufferOutputStream()
                pq.write_table(table.drop_columns([SHARD, POS]), sink, compression="zstd")
                atomic_write_bytes(_shard_path(shard_dir, shard), sink.getvalue().to_pybytes())
                bar.update(table.num_rows)

            blocks = [block for _, block in plan.todo]
            scored = ray_engine.run_shards(ray, blocks, job, ray_options, res, plan.expected, write)

    parts = [pq.read_table(_shard_path(shard_dir, i)) for i in range(plan.shards)]
    if parts:
        joined = pa.concat_tables(parts)
    else:
        from cisrank.rerank.prior_table import table_schema

        joined = table_schema().empty_table()
    stored = write_prior_table(out / TABLE_FILE, joined)
    (out / PRIOR_FILE).unlink(missing_ok=True)  # a local build's store, if the engine changed
    shutil.rmtree(shard_dir)
    log.info("%s: %d passages, %d priors in %s", out, plan.rows, stored, TABLE_FILE)
    return BuildOutput(
        files=[TABLE_FILE],
        params={
            **config.model_dump(),
            "batch_size": batch_size,
            "batch_tokens": info["batch_tokens"],
        },
        libraries=library_versions("transformers", "torch", "tokenizers", "ray", "pyarrow"),
        model={
            "name": config.model,
            "fingerprint": info["fingerprint"],
            "store_fingerprint": fingerprint,
            "dtype": info["dtype"],
            "device": info["device"],
        },
        extra={
            "engine": "ray",
            "actors": res.actors,
            "shard_size": shard_size,
            "shards": plan.shards,
            "shards_scored": scored,
            "shards_reused": plan.reused,
            "passages": plan.rows,
            "priors_stored": stored,
        },
    )
