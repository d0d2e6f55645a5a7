"""`--workers N --threads-per-worker T`: a model's work spread over local processes, one per core.

Why processes: on a CPU a causal LM at batch sizes that keep padding small runs near one core's
matmul peak already, and one torch process scales about 1.4x from one thread to two (intra-op
threads split small matrices badly), while two single-threaded processes scale close to 2x
(measured in bench/RESULTS.md). So every model-backed job can run as N worker processes of T
torch threads each, every worker loading the model once.

Two users, one pool:

- the offline jobs (teacher scoring, the prior job, dense encoding) give it their shards as the
  Ray engine does (`cisrank.jobs.ray.ShardJob`: `load()` once per worker, `score(state,
  block)` per shard), so a shard is scored by the same code on a local pool, on Ray or in this
  process, and resumes the same way (`run_local_shards`);
- a reranker (`cisrank.rerank.pooled.PooledReranker`) hands each worker a share of a batch's
  (query, passage) pairs and puts the scores back in order (`WorkerPool.map`).

Workers are spawned (never forked: a forked torch with threads is unsafe), load the model in an
initializer, and a worker whose model fails to load reports that error (its first line), not a
broken pool. A worker whose parent dies (a job stopped with SIGTERM or SIGKILL, which runs no
cleanup in the parent) exits within a second instead of finishing its shard for nobody: an
orphan would hold a core and a model's memory while the rerun of the job starts beside it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from cisrank.errors import CisrankError

log = logging.getLogger(__name__)


def cores() -> int:
    """CPU cores this process may run on (its affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class WorkerOptions:
    """How many processes a job runs on and how many torch threads each uses (neither changes
    an output beyond float rounding: scores do not depend on batch composition)."""

    workers: int | None = None
    """Worker processes; None: one per core (`cores()`)."""
    threads_per_worker: int = 1

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise CisrankError(f"--workers must be >= 1, got {self.workers}")
        if self.threads_per_worker < 1:
            raise CisrankError(f"--threads-per-worker must be >= 1, got {self.threads_per_worker}")

    @property
    def count(self) -> int:
        return self.workers if self.workers is not None else cores()


THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""The BLAS libraries' thread variables, which a process reads when it first imports torch."""


def set_threads(threads: int) -> None:
    """Torch's intra-op threads of this process (and the BLAS libraries' through the env, for a
    process that has not imported torch yet)."""
    for name in THREAD_ENV:
        os.environ[name] = str(threads)
    import torch

    torch.set_num_threads(threads)


def on_gpu(device: str | None) -> bool:
    """Whether model work with this `--device` runs on a GPU (auto: when CUDA is visible), where
    one process already fills the device and more workers would only share it."""
    if device is not None and device != "auto":
        return str(device).startswith("cuda")
    import torch

    return bool(torch.cuda.is_available())


def for_device(options: WorkerOptions, device: str | None) -> WorkerOptions:
    """`options` with the default worker count made one on a GPU (an explicit count stands)."""
    if options.workers is None and on_gpu(device):
        return WorkerOptions(workers=1, threads_per_worker=options.threads_per_worker)
    return options


class WorkerJob(Protocol):
    """What every worker runs: `load()` once, then `score(state, item)` per item. Must pickle
    (it is sent to every worker); `cisrank.jobs.ray.ShardJob` is one."""

    def load(self) -> Any: ...

    def score(self, state: Any, item: Any) -> Any: ...


# The worker process's loaded model, set by `_start` (one job per process).
_STATE: dict[str, Any] = {}


ORPHAN_POLL_S = 0.5


def _exit_when_orphaned(parent: int) -> None:
    """Poll the parent pid: a reparented worker (init or a subreaper adopted it) exits at once.
    Polling, not PR_SET_PDEATHSIG: that signal fires when the *thread* that spawned the worker
    ends, and a server may start its pool from a short-lived thread."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_POLL_S)
        os._exit(1)  # no cleanup owed: the parent that would read the results is gone

    threading.Thread(target=watch, name="cisrank-orphan-watch", daemon=True).start()


def _start(job: WorkerJob, threads: int, parent: int) -> None:
    _exit_when_orphaned(parent)
    set_threads(threads)
    try:
        _STATE["job"], _STATE["state"] = job, job.load()
    except Exception as exc:  # reported by the first task, with its own message
        _STATE["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"


def _loaded(_: Any) -> int:
    """A task that returns once its worker has loaded its model (the initializer runs first)."""
    if "error" in _STATE:
        raise CisrankError(f"a worker could not load its model: {_STATE['error']}")
    return os.getpid()


def _run(item: Any) -> Any:
    if "error" in _STATE:
        raise CisrankError(f"a worker could not load its model: {_STATE['error']}")
    return _STATE["job"].score(_STATE["state"], item)


class WorkerPool:
    """`processes` spawned workers running `job`; `map` scores items on them, in parallel."""

    def __init__(self, job: WorkerJob, processes: int, threads_per_worker: int = 1) -> None:
        import multiprocessing

        if processes < 1:
            raise CisrankError(f"a worker pool needs at least one process, got {processes}")
        self.processes = processes
        self._executor = ProcessPoolExecutor(
            max_workers=processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(job, threads_per_worker, os.getpid()),
        )

    def submit(self, item: Any) -> Future[Any]:
        return self._executor.submit(_run, item)

    def warm(self, timeout_s: float = 600.0) -> None:
        """Start every process and wait until each has loaded its model (or say why one could
        not): a server is ready, and a timed request starts, with the workers already loaded."""
        import time

        seen: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(seen) < self.processes and time.monotonic() < deadline:
            pending = [self._executor.submit(_loaded, None) for _ in range(self.processes)]
            seen.update(f.result() for f in pending)
            if len(seen) < self.processes:
                time.sleep(0.05)  # another process is still loading its model

    def map(self, items: Sequence[Any]) -> list[Any]:
        """`job.score` of every item, in input order."""
        return [f.result() for f in [self.submit(item) for item in items]]

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_local_shards(
    blocks: Iterable[tuple[int, Any]],
    job: WorkerJob,
    options: WorkerOptions,
    on_shard: Callable[[int, Any], None],
) -> int:
    """Score `(shard, block)` pairs on a local pool and hand each shard's result to `on_shard`
    as it completes (the offline jobs write it there, atomically), so an interrupted run keeps
    every shard already handed over. Returns the shards handed over."""
    from concurrent.futures import as_completed

    todo = list(blocks)
    if not todo:
        return 0
    done = 0
    with WorkerPool(job, min(options.count, len(todo)), options.threads_per_worker) as pool:
        futures = {pool.submit(block): shard for shard, block in todo}
        try:
            for future in as_completed(futures):
                on_shard(futures[future], future.result())
                done += 1
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return done


def balanced_split(costs: Sequence[float], parts: int) -> list[list[int]]:
    """Indices of `costs` dealt into `parts` lists of near-equal total cost (longest first to
    the least loaded part, ties by index): deterministic for the same costs."""
    loads = [0.0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        p = min(range(parts), key=lambda p: (loads[p], p))
        out[p].append(i)
        loads[p] += costs[i]
    return [sorted(x) for x in out]
