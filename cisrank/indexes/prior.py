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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from cisrank.data.corpus import CorpusReader
from cisrank.data.manifest import BuildOutput, library_versions
from cisrank.errors import CisrankError
from cisrank.jobs import ray as ray_jobs
from cisrank.jobs.pool import WorkerOptions
from cisrank.jobs.ray import POS, SHARD, Engine, RayOptions, check_engine
from cisrank.jobs.shards import Progress, Shards, ShardWriter, batched, run_shards
from cisrank.rerank.chunking import Chunking, Splitter, plan_request
from cisrank.rerank.prior_table import TABLE_FILE
from cisrank.retrieval.base import IndexConfig
from cisrank.runtimes.table import BackendName

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
    chunking: Chunking = Field(
        default_factory=Chunking,
        description="How a passage longer than max_doc_tokens is cut into windows, as the "
        "reranker's chunking cuts it (serve's `chunking`, rerank's --chunk-* flags): a prior is "
        "stored for every window the reranker will score, so a long passage costs no prior "
        "pass at query time. Pooling first or max_chunks_per_doc 1: the first window alone "
        "(the passage cut at max_doc_tokens).",
    )

    @field_validator("model", mode="before")
    @classmethod
    def _model_given(cls, model: object) -> str:
        # No default model is a safe guess: priors of the wrong model are silently useless.
        if model is None or not str(model).strip():
            raise CisrankError("the prior index needs a causal LM: pass --model (hub id or folder)")
        return str(model)


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
    """log p(K) of every passage not stored yet, on the shard runner (`cisrank.jobs.shards`).

    The local engine fills the SQLite store `priors.sqlite` (`_build_store`); `engine="ray"`
    scores the corpus on a Ray actor pool into the Parquet prior table `priors.parquet`
    (`_build_table`). `job_wrapper` wraps the job wherever it scores (tests use it to count,
    slow or kill it, or to put an exact model under it).

    A passage is its `contents` (title and text), the text retrievers return for reranking.
    `batch_size` passages are looked up, scored and committed together, so at most one batch of
    work is lost to an interruption; `batch_tokens` bounds the padded tokens per forward pass
    (the engine's default when None).
    """
    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else int(batch_size)
    if batch_size < 1:
        raise CisrankError(f"batch_size must be >= 1, got {batch_size}")
    fields = _PriorModel.fields(config, batch_tokens, device)
    build = _OUTPUTS[check_engine(engine)]
    return build(
        reader,
        out,
        config,
        fields,
        resume=resume,
        progress=progress,
        batch_size=batch_size,
        ray=ray,
        shard_size=shard_size,
        job_wrapper=job_wrapper,
        workers=workers,
    )


def _build_store(
    reader: CorpusReader,
    out: Path,
    config: PriorIndexConfig,
    fields: dict[str, Any],
    *,
    resume: bool,
    progress: bool,
    batch_size: int,
    job_wrapper: Callable[[Any], Any] | None,
    workers: WorkerOptions | None,
    **_ray: Any,
) -> BuildOutput:
    """The local engine: the corpus streamed in batches through the CIS reranker's own prior
    path, each batch committed to the store in one transaction.

    With several `workers`, this process scores every N-th batch and N - 1 worker processes
    the others, each with its own model and its own connection to the same store (SQLite in WAL
    mode takes concurrent writers; a key is written once whoever scores it). `resume` needs no
    handling: entries are content-addressed, so whatever an interrupted run committed is found
    by its key and not computed again.
    """
    from cisrank.rerank.prior_store import PriorStore

    (out / TABLE_FILE).unlink(missing_ok=True)  # a Ray build's table, if the engine changed
    path = out / PRIOR_FILE
    counts: dict[str, Any] = {}

    def plan(info: dict[str, Any]) -> Shards[list[str]]:
        # a connection of its own to count what is stored, closed last (below)
        counts["store"], counts["fingerprint"] = PriorStore(path), info["store_fingerprint"]
        counts["before"] = counts["store"].count(counts["fingerprint"])
        if counts["before"]:
            log.info("%s: %d priors already stored, computing the rest", out, counts["before"])
        return Shards(
            items=batched((p.contents for p in reader), batch_size),
            rows=len,
            block=lambda i, texts: texts,
        )

    def computed() -> dict[str, Any]:
        return {"computed": counts["store"].count(counts["fingerprint"]) - counts["before"]}

    try:
        # The model first (the job loads it before it opens the store): a bad --model fails
        # before any file of the index is written.
        run = run_shards(
            PriorStoreJob(**fields, store=str(path)),
            plan,
            None,
            engine=Engine.LOCAL,
            resume=resume,
            progress=Progress("prior", "passage", progress, postfix=computed),
            workers=workers,
            job_wrapper=job_wrapper,
            driver_scores=True,
        )
        stored = counts["store"].count(counts["fingerprint"])
    finally:
        if "store" in counts:  # the last connection checkpoints the WAL: a self-contained file
            counts["store"].close()
    info, passages = run.info, run.rows
    computed_now = stored - counts["before"]
    reused = passages - computed_now
    log.info("%s: %d passages, %d priors computed, %d reused", out, passages, computed_now, reused)
    return BuildOutput(
        files=[PRIOR_FILE],
        mutable=[PRIOR_FILE],  # a CIS reranker with --prior-store adds the priors it computes
        params={
            **config.model_dump(),
            "batch_size": batch_size,
            "batch_tokens": info["batch_tokens"],
        },
        libraries=library_versions("transformers", "torch", "tokenizers"),
        model=_manifest_model(config, info),
        extra={
            "passages": passages,
            "priors_computed": computed_now,
            "priors_reused": reused,
            "priors_stored": stored,
        },
    )


def _manifest_model(config: PriorIndexConfig, info: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": config.model,
        "fingerprint": info["fingerprint"],
        "store_fingerprint": info["store_fingerprint"],
        "dtype": info["dtype"],
        "device": info["device"],
    }


@dataclass(frozen=True)
class _PriorState:
    """What a prior job's worker loads once: the CIS reranker and a splitter of its own over
    the reranker's tokenizer (a fast tokenizer is not shared between threads)."""

    reranker: Any
    splitter: Splitter


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
    chunking: Chunking

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
            "chunking": config.chunking,
        }

    def loaded(self, store: str | None = None, engine: Any = None) -> _PriorState:
        """The CIS reranker, keeping its priors in the store at `store` (None: in its memory),
        with its window splitter; the model (or the given `engine`, as a test hands in one) is
        loaded before the store is opened, so a bad model leaves no file."""
        from cisrank.lm.backends import load_engine
        from cisrank.rerank.cis import CISReranker
        from cisrank.rerank.prior_store import PriorStore

        engine = engine or load_engine(
            self.model,
            backend=self.backend,
            device=self.device,
            dtype=self.dtype,
            batch_tokens=self.batch_tokens,
        )
        reranker = CISReranker(
            self.model,
            max_doc_tokens=self.max_doc_tokens,
            normalize="sum",
            prior_store=PriorStore(store) if store is not None else None,
            engine=engine,
        )
        # one copy of the tokenizer per loaded model, not per batch
        window = reranker.passage_window
        return _PriorState(reranker, Splitter(window.tokenizer if window is not None else None))

    def window_ids(self, state: _PriorState, texts: list[str]) -> tuple[list[list[int]], list[int]]:
        """(the token ids of every window of `texts` the CIS reranker scores at query time
        under `chunking`, the windows of each text): planned by `plan_request`, the one function
        the library and the server plan windows with. A CIS window reads no query tokens, so a
        passage's windows are the same for every query."""
        reranker = state.reranker
        plan = plan_request(state.splitter, reranker.passage_window, "", texts, self.chunking)
        return reranker.passage_ids(plan.texts(texts)), [len(spans) for spans in plan.spans]

    def describe(self, state: _PriorState) -> dict[str, Any]:
        engine = state.reranker.engine
        return {
            "fingerprint": engine.fingerprint(),
            "store_fingerprint": state.reranker.store_fingerprint,
            "dtype": engine.compute_type,
            "device": engine.device,
            "batch_tokens": engine.batch_tokens,
        }


@dataclass(frozen=True)
class PriorStoreJob(_PriorModel):
    """The local prior job, in this process and in each of its workers: its own model and its
    own connection to the store, scoring batches through the reranker's prior path (lookup,
    misses scored, written back)."""

    store: str

    def load(self) -> _PriorState:
        return self.loaded(self.store)

    def score(self, state: _PriorState, texts: list[str]) -> int:
        state.reranker.summed_log_priors(self.window_ids(state, texts)[0])
        return len(texts)

    def close(self, state: _PriorState) -> None:
        state.reranker.prior_store.close()


# ---------------------------------------------------------------------------------- Ray engine


@dataclass(frozen=True)
class PriorShardJob(_PriorModel):
    """The prior job's scoring as Ray actors run it: the CIS reranker's own prior path
    (`CISReranker.summed_log_priors`) over each shard, `batch_size` passages at a time, as the
    local job does; the results are the prior table's rows."""

    batch_size: int

    def load(self) -> _PriorState:
        # no prior store: the priors a shard repeats are kept in the reranker's memory
        return self.loaded()

    def score(self, state: _PriorState, batch: Any) -> Any:
        import numpy as np
        import pyarrow as pa

        from cisrank.rerank.prior_store import passage_key
        from cisrank.rerank.prior_table import prior_rows, table_schema

        texts = batch.column("text").to_pylist()
        items: list[tuple[str, float, int]] = []
        windows: list[int] = []
        for start in range(0, len(texts), self.batch_size):
            docs, counts = self.window_ids(state, texts[start : start + self.batch_size])
            logprobs = state.reranker.summed_log_priors(docs)
            items += [(passage_key(d), lp, len(d)) for d, lp in zip(docs, logprobs, strict=True)]
            windows += counts
        flat = pa.table(prior_rows(state.reranker.store_fingerprint, items), schema=table_schema())
        # one row per passage (the driver counts a shard's rows back), its windows' as lists
        offsets = pa.array(np.concatenate([[0], np.cumsum(windows)]), pa.int32())
        table = pa.table(
            {
                name: pa.ListArray.from_arrays(offsets, flat.column(name).combine_chunks())
                for name in flat.column_names
            }
        )
        return table.append_column(SHARD, batch.column(SHARD)).append_column(POS, batch.column(POS))


def _shard_path(folder: Path, index: int) -> Path:
    return folder / f"prior-{index:05d}.parquet"


_PASSAGES = b"cisrank.passages"
"""A shard file's metadata key: the passages its window rows come from."""


def _prior_shard_ok(path: Path, rows: int, fingerprint: str) -> bool:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["fingerprint"])
    except (OSError, ValueError):
        return False
    if (table.schema.metadata or {}).get(_PASSAGES) != str(rows).encode():
        return False
    return table.num_rows == 0 or pc.all(pc.equal(table.column(0), fingerprint)).as_py() is True


def _shard_parquet(shard: int, table: Any) -> bytes:
    """A shard's prior rows (`PriorShardJob.score`'s, a passage a row) as the bytes of its
    Parquet file: a window a row, the passages counted in the file's metadata."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from cisrank.rerank.prior_table import table_schema

    lists = table.drop_columns([SHARD, POS])
    flat = pa.table({n: pc.list_flatten(lists.column(n)) for n in lists.column_names})
    flat = flat.cast(table_schema()).replace_schema_metadata({_PASSAGES: str(table.num_rows)})
    sink = pa.BufferOutputStream()
    pq.write_table(flat, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def _build_table(
    reader: CorpusReader,
    out: Path,
    config: PriorIndexConfig,
    fields: dict[str, Any],
    *,
    resume: bool,
    progress: bool,
    batch_size: int,
    ray: RayOptions | None,
    shard_size: int | None,
    job_wrapper: Callable[[Any], Any] | None,
    **_local: Any,
) -> BuildOutput:
    """The Ray engine: log p(K) of every passage on an actor pool, into the Parquet prior table.

    The corpus is cut into shards of `shard_size` passages; each shard missing from `shards/`
    is one block for the actors, and its rows are written to `shards/prior-NNNNN.parquet`
    once they are all back. A rerun keeps every shard file of the same store fingerprint and
    shard size, so only the missing shards are scored. When all are there, they are joined
    into `priors.parquet` (sorted by key, one row per distinct passage), and the shards are
    removed; the driver writes the manifest after that.
    """
    shard_size = DEFAULT_SHARD_SIZE if shard_size is None else int(shard_size)
    if shard_size < 1:
        raise CisrankError(f"shard_size must be >= 1, got {shard_size}")
    shard_dir = out / SHARD_DIR

    def plan(info: dict[str, Any]) -> Shards[list[str]]:
        fingerprint = info["store_fingerprint"]
        return Shards(
            items=batched((p.contents for p in reader), shard_size),
            rows=len,
            block=ray_jobs.text_block,
            complete=lambda i, rows: _prior_shard_ok(_shard_path(shard_dir, i), rows, fingerprint),
            folder=shard_dir,
            meta={"store_fingerprint": fingerprint, "shard_size": shard_size},
        )

    run = run_shards(
        PriorShardJob(**fields, batch_size=batch_size),
        plan,
        ShardWriter(lambda i: _shard_path(shard_dir, i), _shard_parquet),
        engine=Engine.RAY,
        resume=resume,
        progress=Progress("prior", "passage", progress),
        ray=ray,
        job_wrapper=job_wrapper,
    )
    stored = _join_table(out / TABLE_FILE, shard_dir, run.shards)
    (out / PRIOR_FILE).unlink(missing_ok=True)  # a local build's store, if the engine changed
    shutil.rmtree(shard_dir)
    log.info("%s: %d passages, %d priors in %s", out, run.rows, stored, TABLE_FILE)
    info = run.info
    return BuildOutput(
        files=[TABLE_FILE],
        params={
            **config.model_dump(),
            "batch_size": batch_size,
            "batch_tokens": info["batch_tokens"],
        },
        libraries=library_versions("transformers", "torch", "tokenizers", "ray", "pyarrow"),
        model=_manifest_model(config, info),
        extra={
            "engine": Engine.RAY.value,
            "actors": run.actors,
            "shard_size": shard_size,
            "shards": run.shards,
            "shards_scored": run.scored,
            "shards_reused": run.reused,
            "passages": run.rows,
            "priors_stored": stored,
        },
    )


def _join_table(path: Path, shard_dir: Path, shards: int) -> int:
    """The shard files joined into the prior table at `path`; returns the priors stored."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cisrank.rerank.prior_table import table_schema, write_prior_table

    parts = [
        pq.read_table(_shard_path(shard_dir, i)).replace_schema_metadata(None)
        for i in range(shards)
    ]
    joined = pa.concat_tables(parts) if parts else table_schema().empty_table()
    return write_prior_table(path, joined)


_OUTPUTS: dict[Engine, Callable[..., BuildOutput]] = {
    Engine.LOCAL: _build_store,
    Engine.RAY: _build_table,
}
"""What each engine builds: the local engine fills the SQLite store that a CIS reranker also
writes to; Ray actors cannot share one SQLite file, so their rows make the Parquet table."""
