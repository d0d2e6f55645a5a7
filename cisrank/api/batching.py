"""A queue and one worker per reranker: concurrent requests share model calls, off the event loop.

Why: a model is not thread-safe and a CPU or GPU is saturated by one call at a time, so requests
are serialized through one thread per model; the event loop only parses, validates and waits.

How a round works (`BatchScorer._run`):

1. When idle, the worker takes the first job and waits at most `max_wait_ms` for more to arrive
   (the bounded batch wait); when busy, whatever queued up during the last model call is taken
   at once, without waiting.
2. It plans one batch of at most `max_batch_passages` passages over all waiting jobs, shortest
   remaining first. A large request is split into chunks, so a small request that arrives while
   a large one is being scored waits at most one chunk, never the whole large request.
   Shortest-first alone would starve a large request behind a steady stream of small ones (each
   round fills up with them), so it ages: a job that got no passages scored for `max_age_ms` is
   planned first, oldest first, and gets its chunk whatever its size; then its clock restarts.
   A large request thus advances by a chunk at least every `max_age_ms` plus a model call or
   so, instead of waiting for the stream of small ones to pause (or for its own timeout).
3. The batch is scored in the model thread: with one `score_batch([(query, passages), ...])`
   call when the reranker offers it (one model batch across requests), else one `score` per job
   chunk in the same thread hop. Scores of a chunk equal scores of the whole because the reranker
   contract makes scores independent of batch composition.

Admission control: at most `max_queue` unfinished requests per reranker; the next one gets
`QueueFullError` (503 + Retry-After). A request that is not done after its timeout gets
`ScoringTimeout` and its remaining chunks are dropped, so a timed-out request costs no more work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from cisrank.api.config import BatchingConfig
from cisrank.rerank.base import Reranker

log = logging.getLogger(__name__)
T = TypeVar("T")


class QueueFullError(Exception):
    """Too many requests are waiting for this reranker: answer 503 with Retry-After."""


class ScoringTimeout(Exception):
    """The request was not scored within its timeout."""


@runtime_checkable
class MultiQueryScorer(Protocol):
    """Optional reranker extension: score several (query, passages) pairs in one model batch."""

    def score_batch(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[list[float]]: ...


class BatchObserver(Protocol):
    """What the batcher reports (implemented by `cisrank.api.metrics.Metrics`)."""

    def observe_batch(
        self, reranker: str, passages: int, requests: int, seconds: float
    ) -> None: ...

    def set_queue_depth(self, reranker: str, depth: int) -> None: ...


@dataclass(eq=False)
class _Job:
    query: str
    passages: Sequence[str]
    future: asyncio.Future[list[float]]
    waiting_since: float  # loop time of acceptance, then of its last scored chunk
    scores: list[float] = field(default_factory=list)
    next: int = 0  # first passage not yet handed to the model
    cancelled: bool = False

    @property
    def remaining(self) -> int:
        return len(self.passages) - self.next


def _waited(job: _Job) -> float:
    return job.waiting_since


def _remaining(job: _Job) -> int:
    return job.remaining


def score_chunks(
    reranker: Reranker, chunks: Sequence[tuple[str, Sequence[str]]]
) -> list[list[float]]:
    """Score (query, passages) pairs in the calling thread, as one batch where the model can."""
    if isinstance(reranker, MultiQueryScorer):
        out = reranker.score_batch(chunks)
    else:
        out = [reranker.score(q, list(p)) for q, p in chunks]
    for (_, passages), scores in zip(chunks, out, strict=True):
        if len(scores) != len(passages):
            raise RuntimeError(
                f"reranker returned {len(scores)} scores for {len(passages)} passages"
            )
    return [[float(s) for s in scores] for scores in out]


class BatchScorer:
    """Serializes one reranker's model calls through one thread, coalescing concurrent requests."""

    def __init__(
        self,
        reranker: Reranker,
        name: str,
        config: BatchingConfig | None = None,
        observer: BatchObserver | None = None,
    ) -> None:
        self.reranker = reranker
        self.name = name
        self.config = config or BatchingConfig()
        self.observer = observer
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._active: list[_Job] = []
        self._unfinished = 0
        self._closed = False

    # ------------------------------------------------------------------ public

    @property
    def depth(self) -> int:
        """Requests accepted and not yet answered."""
        return self._unfinished

    async def score(
        self, query: str, passages: Sequence[str], timeout: float | None = None
    ) -> list[float]:
        """Scores in input order; raises QueueFullError, ScoringTimeout or the reranker's error."""
        if not passages:
            return []
        if self._closed:
            raise QueueFullError(f"reranker '{self.name}' is shutting down")
        self._ensure_started()
        if self._unfinished >= self.config.max_queue:
            raise QueueFullError(
                f"{self._unfinished} requests are already waiting for reranker '{self.name}'"
            )
        assert self._loop is not None and self._queue is not None
        job = _Job(query, passages, self._loop.create_future(), self._loop.time())
        self._unfinished += 1
        self._report_depth()
        self._queue.put_nowait(job)
        timeout = self.config.request_timeout_s if timeout is None else timeout
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        except TimeoutError:
            self._cancel(job)
            raise ScoringTimeout(
                f"not scored within {timeout:g} s: the server is overloaded, retry later"
            ) from None
        except BaseException:  # the client went away (CancelledError): stop working for it
            self._cancel(job)
            raise

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in this model's thread (tokenizers share its state with the model)."""
        self._ensure_started()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    def open(self) -> None:
        """Accept requests again after `aclose` (an app whose lifespan runs more than once)."""
        self._closed = False

    async def aclose(self, drain_timeout: float = 30.0) -> None:
        """Finish what was accepted (bounded), then stop the worker and the thread."""
        self._closed = True
        deadline = time.monotonic() + drain_timeout
        while self._unfinished and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._worker
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # ---------------------------------------------------------------- internal

    def _ensure_started(self) -> None:
        """Start the worker on the running loop (again, if a test client started a new loop)."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"cisrank-{self.name}")
        if self._loop is loop and self._worker is not None and not self._worker.done():
            return
        self._loop = loop
        self._queue = asyncio.Queue()
        self._active = []
        self._unfinished = 0
        self._worker = loop.create_task(self._run(), name=f"cisrank-batcher-{self.name}")

    def _report_depth(self) -> None:
        if self.observer is not None:
            self.observer.set_queue_depth(self.name, self._unfinished)

    def _cancel(self, job: _Job) -> None:
        if not job.cancelled and not job.future.done():
            job.cancelled = True
            job.future.cancel()
            self._unfinished -= 1
            self._report_depth()

    def _finish(self, job: _Job, result: list[float] | None, error: BaseException | None) -> None:
        if job.cancelled or job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result or [])
        self._unfinished -= 1
        self._report_depth()

    def _take_waiting(self) -> None:
        assert self._queue is not None
        while not self._queue.empty():
            self._active.append(self._queue.get_nowait())

    def _plan(self, now: float) -> list[tuple[_Job, int, int]]:
        """Chunks for the next model batch: jobs starved for `max_age_ms` first (oldest first),
        then shortest remaining first, FIFO among equals."""
        capacity = self.config.max_batch_passages
        oldest = now - self.config.max_age_ms / 1000.0
        aged = sorted((j for j in self._active if j.waiting_since <= oldest), key=_waited)
        fresh = sorted((j for j in self._active if j.waiting_since > oldest), key=_remaining)
        plan: list[tuple[_Job, int, int]] = []
        for job in aged + fresh:
            if capacity <= 0:
                break
            take = min(job.remaining, capacity)
            plan.append((job, job.next, job.next + take))
            capacity -= take
        return plan

    async def _run(self) -> None:
        assert self._queue is not None and self._loop is not None
        loop = self._loop
        wait_s = self.config.max_wait_ms / 1000.0
        while True:
            if not self._active:
                self._active.append(await self._queue.get())
                deadline = loop.time() + wait_s
                while sum(j.remaining for j in self._active) < self.config.max_batch_passages:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    try:
                        self._active.append(await asyncio.wait_for(self._queue.get(), left))
                    except TimeoutError:
                        break
            self._take_waiting()
            self._active = [j for j in self._active if not j.cancelled]
            if not self._active:
                continue
            plan = self._plan(loop.time())
            chunks = [(job.query, job.passages[a:b]) for job, a, b in plan]
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(
                    self._executor, score_chunks, self.reranker, chunks
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a reranker failure fails its requests, never the worker
                log.exception("reranker %s failed on a batch of %d requests", self.name, len(plan))
                for job, _, _ in plan:
                    self._finish(job, None, exc)
                failed = {id(job) for job, _, _ in plan}
                self._active = [j for j in self._active if id(j) not in failed]
                continue
            if self.observer is not None:
                self.observer.observe_batch(
                    self.name,
                    sum(b - a for _, a, b in plan),
                    len(plan),
                    time.perf_counter() - started,
                )
            scored_at = loop.time()
            for (job, _a, b), scores in zip(plan, results, strict=True):
                job.scores.extend(scores)
                job.next = b
                job.waiting_since = scored_at
                if job.remaining == 0:
                    self._finish(job, job.scores, None)
            self._active = [j for j in self._active if j.remaining > 0 and not j.cancelled]
