"""One runner for the offline shard jobs: the dense build, the prior job and teacher scoring.

A job supplies what is its own: a `ShardJob` (`load` a model, `describe` what identifies its
outputs, `score` one shard's block; it pickles, so workers and Ray actors run the same code), a
plan (`Shards`: its shards in order, how many rows each gives, the block each is scored as, and
how to tell a shard file already written) and a `ShardWriter` (a shard's result as the bytes of
its file). `run_shards` owns the rest, the same way for every job:

- the engine, one dispatch (`Engine`): `local` scores in this process, or on a pool of worker
  processes (`cisrank.jobs.pool`), with this process taking its share where the job says so
  (`driver_scores`); `ray` on a pool of Ray actors (`cisrank.jobs.ray`);
- describing the outputs where the model will run (the actors' device decides the compute type),
  then claiming the shard folder for that description (`claim_shard_dir`: a rerun of the same
  build keeps its shards, another build's are discarded) and resuming (`resume_shards`: only the
  shards without a complete file are scored);
- writing each shard's file atomically (temp file and rename) as soon as it is complete, so an
  interrupted job keeps every shard written and a file that exists is whole;
- the progress bar, counted in rows, starting at the rows already written.

A job whose shards leave no file of their own (the local prior job: each batch is committed to a
content-addressed store, which is its resume) gives no `complete` and no writer: its shards are
streamed, never held in memory together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Generic, TypeVar

from tqdm.auto import tqdm

from cisrank.fileio import atomic_write_bytes
from cisrank.jobs import ray as ray_jobs
from cisrank.jobs.ray import Engine, RayOptions, ShardJob
from cisrank.jobs.resume import ShardResume, claim_shard_dir, resume_shards

log = logging.getLogger(__name__)

T = TypeVar("T")


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """`items` in lists of `size` (the last shorter), streamed."""
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


@dataclass(frozen=True)
class Shards(Generic[T]):
    """A job's plan, made once its outputs are described."""

    items: Iterable[T]
    """The shards, in order (iterated once: a generator streams)."""
    rows: Callable[[T], int]
    """Rows a shard gives back."""
    block: Callable[[int, T], Any]
    """What the job's `score` takes for shard `index`."""
    complete: Callable[[int, int], bool] | None = None
    """Whether shard `index`'s file holds its `rows` rows (None: no shard files; streamed)."""
    folder: Path | None = None
    """The shard folder to claim for `meta` (None: the job claims its output itself)."""
    meta: dict[str, Any] | None = None


@dataclass(frozen=True)
class ShardWriter:
    """Where a shard's result goes, and its file's bytes."""

    path: Callable[[int], Path]
    encode: Callable[[int, Any], bytes]


@dataclass(frozen=True)
class Progress:
    desc: str | Callable[[dict[str, Any]], str]
    """The bar's label, or how the job's description names it; the runner adds where the
    shards run when it is not this process (" (ray)", " (N workers)")."""
    unit: str
    show: bool = True
    total: int | None = None
    """Rows in all; None: the plan's, where it is known before scoring."""
    postfix: Callable[[], dict[str, Any]] | None = None
    """Shown after every shard (the prior job's priors computed so far)."""


@dataclass(frozen=True)
class ShardRun:
    """What a run did."""

    engine: Engine
    info: dict[str, Any]
    """The job's description of its outputs (`ShardJob.describe`, or the job's own)."""
    shards: int = 0
    reused: int = 0
    """Shards whose file was complete: not scored again."""
    scored: int = 0
    rows: int = 0
    actors: int | None = None
    """Ray actors of the pool (None: the local engine)."""
    planned: bool = True
    """False where the plan was None: the output was complete already."""


class _Handed:
    """The progress bar, and the one way a shard's result is handed over."""

    def __init__(self, bar: Any, writer: ShardWriter | None, progress: Progress) -> None:
        self.bar, self.writer, self.postfix = bar, writer, progress.postfix
        self.scored = 0

    def done(self, shard: int, result: Any, rows: int) -> None:
        if self.writer is not None:
            atomic_write_bytes(self.writer.path(shard), self.writer.encode(shard, result))
        self.bar.update(rows)
        self.scored += 1
        if self.postfix is not None:
            self.bar.set_postfix(self.postfix(), refresh=False)


def run_shards(
    job: ShardJob,
    plan: Callable[[dict[str, Any]], Shards[Any] | None],
    writer: ShardWriter | None,
    *,
    engine: Engine,
    resume: bool,
    progress: Progress,
    ray: RayOptions | None = None,
    workers: Any = None,
    job_wrapper: Callable[[Any], Any] | None = None,
    describe: Callable[[], dict[str, Any]] | None = None,
    driver_scores: bool = False,
) -> ShardRun:
    """Run `job` over the shards `plan(description)` gives, on `engine`, writing each shard
    with `writer` (see the module docstring).

    `job_wrapper` wraps the job wherever it loads and scores (tests count, slow or kill it, or
    put an exact model under it). `describe`, on the local engine: what identifies the outputs
    without loading the model, which is then loaded only if a shard is left to score. `workers`
    (`cisrank.jobs.pool.WorkerOptions`, local engine): more than one scores the shards on a pool of
    worker processes, this process too where `driver_scores`."""
    wrapped = job_wrapper(job) if job_wrapper is not None else job
    if engine is Engine.RAY:
        return _run_ray(wrapped, plan, writer, resume, progress, ray or RayOptions())
    pool = workers if workers is not None and workers.count > 1 else None
    state = None
    if describe is not None:
        info = describe()
    else:
        state = wrapped.load()
        info = wrapped.describe(state)
    try:
        if pool is not None and not driver_scores:
            _close(wrapped, state)  # each worker loads its own; this process writes
            state = None
        shards = plan(info)
        if shards is None:
            return ShardRun(engine, info, planned=False)
        if shards.complete is None:
            return _stream(wrapped, state, shards, writer, progress, pool, info, driver_scores)
        split = _resume(shards, resume)
        suffix = f" ({pool.count} workers)" if pool is not None else ""
        with _bar(progress, info, split, suffix) as bar:
            handed = _Handed(bar, writer, progress)
            if pool is not None:
                from cisrank.jobs.pool import run_local_shards

                blocks = ((i, shards.block(i, item)) for i, item in split.todo)
                run_local_shards(
                    blocks, wrapped, pool, lambda i, r: handed.done(i, r, split.sizes[i])
                )
            else:
                for i, item in split.todo:
                    if state is None:
                        state = wrapped.load()
                    handed.done(i, wrapped.score(state, shards.block(i, item)), split.sizes[i])
        return _ran(engine, info, split, handed.scored)
    finally:
        _close(wrapped, state)


def _close(job: Any, state: Any) -> None:
    """The job's model closed (`close(state)` where it has one: the prior job's store)."""
    close = getattr(job, "close", None)
    if state is not None and close is not None:
        close(state)


def _resume(shards: Shards[Any], resume: bool) -> ShardResume[Any]:
    """The shard folder claimed and the shards split into kept and to score."""
    if shards.folder is not None:
        claim_shard_dir(shards.folder, shards.meta or {}, resume=resume, logger=log)
    assert shards.complete is not None
    split = resume_shards(shards.items, shards.rows, shards.complete)
    if split.reused:
        log.info("resuming: %d of %d shards already written", split.reused, split.shards)
    return split


def _bar(
    progress: Progress, info: dict[str, Any], split: ShardResume[Any] | None, suffix: str = ""
) -> Any:
    total = progress.total
    if total is None and split is not None:
        total = split.rows
    desc = progress.desc if isinstance(progress.desc, str) else progress.desc(info)
    return tqdm(
        total=total,
        initial=split.done_rows if split is not None else 0,
        desc=desc + suffix,
        unit=progress.unit,
        disable=not progress.show,
    )


def _ran(
    engine: Engine,
    info: dict[str, Any],
    split: ShardResume[Any],
    scored: int,
    actors: int | None = None,
) -> ShardRun:
    return ShardRun(
        engine,
        info,
        shards=split.shards,
        reused=split.reused,
        scored=scored,
        rows=split.rows,
        actors=actors,
    )


def _stream(
    job: Any,
    state: Any,
    shards: Shards[Any],
    writer: ShardWriter | None,
    progress: Progress,
    pool: Any,
    info: dict[str, Any],
    driver_scores: bool,
) -> ShardRun:
    """Shards without files of their own, scored as they are read: in this process, or dealt
    round robin to this process (where `driver_scores`) and the workers of `pool`, at most two
    per scorer queued."""
    from cisrank.jobs.pool import WorkerPool

    count = pool.count if pool is not None else 1
    processes = count - 1 if driver_scores else count
    extra = WorkerPool(job, processes, pool.threads_per_worker) if pool is not None else None
    n = rows = 0
    pending: list[tuple[Any, int, int]] = []
    with ExitStack() as stack, _bar(progress, info, None) as bar:
        if extra is not None:
            stack.callback(extra.close)
        handed = _Handed(bar, writer, progress)
        for i, item in enumerate(shards.items):
            size = shards.rows(item)
            if extra is not None and (i % count or not driver_scores):
                pending.append((extra.submit(shards.block(i, item)), i, size))
                while len(pending) > 2 * count:  # bounded: the input streams
                    future, shard, done = pending.pop(0)
                    handed.done(shard, future.result(), done)
            else:
                handed.done(i, job.score(state, shards.block(i, item)), size)
            n, rows = n + 1, rows + size
        for future, shard, done in pending:
            handed.done(shard, future.result(), done)
    return ShardRun(Engine.LOCAL, info, shards=n, scored=handed.scored, rows=rows)


def _run_ray(
    job: ShardJob,
    plan: Callable[[dict[str, Any]], Shards[Any] | None],
    writer: ShardWriter | None,
    resume: bool,
    progress: Progress,
    options: RayOptions,
) -> ShardRun:
    with ray_jobs.ray_session(options) as ray:
        res = ray_jobs.plan_resources(ray, options)
        info = ray_jobs.describe_remote(ray, job, res)  # where the actors will run
        shards = plan(info)
        if shards is None:
            return ShardRun(Engine.RAY, info, planned=False, actors=res.actors)
        split = _resume(shards, resume)
        with _bar(progress, info, split, " (ray)") as bar:
            handed = _Handed(bar, writer, progress)
            blocks = [shards.block(i, item) for i, item in split.todo]
            ray_jobs.score_on_actors(
                ray,
                blocks,
                job,
                options,
                res,
                split.expected,
                lambda i, table: handed.done(i, table, split.sizes[i]),
            )
    return _ran(Engine.RAY, info, split, handed.scored, res.actors)
