"""A queue and one worker per reranker: concurrent requests share model calls, off the event loop.

Why: a model is not thread-safe and a CPU or GPU is saturated by one call at a time, so requests
are serialized through one thread per model; the event loop only parses, validates and waits.

How a round works (`BatchScorer._run`):

1. When idle, the worker takes the first job and waits at most `max_wait_ms` for more to arrive
   (the bounded batch wait); when busy, whatever queued up during the last model call is taken
   at once, without waiting.
2. It plans one batch of at most `max_batch_passages` passages and at most `max_batch_tokens`
   tokens (see "Cost" below; bounded in time too) over all waiting jobs, shortest remaining
   first. A large request is split into slices, so a small request that arrives while a large one is being
   scored waits at most one slice, never the whole large request. Bounding a slice by tokens and
   not only by passages is what makes "one slice" a bounded time: 256 passages of 15,000
   characters are a far longer model call than 256 passages of 300.
   Shortest-first alone would starve a large request behind a steady stream of small ones (each
   round fills up with them), so it ages: a job that got no passages scored for `max_age_ms` is
   planned first, oldest first, and gets its chunk whatever its size; then its clock restarts.
   A large request thus advances by a chunk at least every `max_age_ms` plus a model call or
   so, instead of waiting for the stream of small ones to pause (or for its own timeout).
3. The batch is scored in the model thread with one `score_parts([(query, passages), ...])`
   call (one model batch across requests). What a slice gets is each passage's part, which the
   reranker contract makes independent of batch composition; a passage's final score may depend
   on the whole request (the hybrid normalizes over its query's candidates, scores the first
   stage by position), so once a request's last slice is in, its parts are combined, once, over
   the whole request (`Reranker.combine`). The answer is then exactly `score_batch` of the whole
   request, which is what the library's `rank` gives, however the request was sliced.
4. Isolation: when that model batch raises, each request's chunk is scored again alone, in the
   same thread hop (`score_isolated`), so one request whose text the model cannot take (a
   tokenizer error, say) fails alone with `ScoringFailed`, and the requests that happened to share
   its batch get exactly the parts they would have got alone (batch independence again). The
   retry costs one extra model call per request of a failed batch, and only then. The error is
   marked as the request's input being unusable (`is_input_error`: 4xx) or not (500).

Cost: a request costs the sum over its passages of the tokens of (query, passage), the pair a
cross-encoder reads, counted with the reranker's own tokenizer by the service before the request
is admitted (`cisrank.serving.token_count`: off the event loop and off the model thread, which is
the resource being protected). Where the reranker declares a `pair_token_limit` (a
cross-encoder's `max_length`, the dense encoder's `max_seq_length`), a pair is capped at that
many tokens, since the model never reads more. `pair_tokens` is the one place a pair's cost is
computed from its counts; a request scored without them (a reranker without a tokenizer, a test)
is costed by its UTF-8 bytes, an upper bound of any byte-level tokenizer's count.

Slices are bounded in time as well as in tokens: each model call is timed, and a slice holds at
most the tokens that take `max_slice_s` at the rate measured on this reranker's recent calls
(`slice_tokens`; `max_batch_tokens` while nothing is measured yet, and always at most that).
On a GPU the token bound binds; on a CPU running a causal LM, where 16,384 tokens take a minute,
the time bound does, so that the wait behind one slice, and the work a hang-up or a deadline
leaves running, is about `max_slice_s` (or one passage that takes longer alone).

Admission control: at most `max_queue` unfinished requests per reranker, and at most
`max_inflight_cost` tokens not yet scored (the model work queued ahead of a newcomer,
so a bound on its wait); the next request over either gets `QueueFullError` (503 + Retry-After).
A request arriving when nothing is in flight is always admitted, so one request under the
per-request budget can never be refused forever. A request that is not done after its timeout
gets `ScoringTimeout` and its remaining chunks are dropped, so a timed-out request costs no more
work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from cisrank.rerank.base import Part, Reranker
from cisrank.serving.config import BatchingConfig
from cisrank.serving.token_count import utf8_bytes

log = logging.getLogger(__name__)
T = TypeVar("T")


class QueueFullError(Exception):
    """Too many requests are waiting for this reranker: answer 503 with Retry-After."""


class ScoringTimeout(Exception):
    """The request was not scored within its timeout."""


# What Hugging Face fast tokenizers raise (a TypeError) on a str they cannot hand to Rust, such
# as one holding a lone surrogate.
_TOKENIZER_INPUT_ERRORS = ("TextEncodeInput", "TextInputSequence", "InputSequence")


def is_input_error(exc: BaseException) -> bool:
    """Whether a model's exception reads as its input text being unusable: `ValueError`
    (`UnicodeError` included), or the TypeError of a fast tokenizer refusing a str."""
    if isinstance(exc, ValueError):
        return True
    return isinstance(exc, TypeError) and any(m in str(exc) for m in _TOKENIZER_INPUT_ERRORS)


class ScoringFailed(Exception):
    """The reranker raised on this request's chunk scored alone: only this request fails.

    `input_error` is True when the failure reads as the request's own text being unusable
    (`is_input_error`), so the caller can answer 4xx; anything else is a server fault (500).
    The original exception is `__cause__`."""

    def __init__(self, cause: Exception) -> None:
        self.input_error = is_input_error(cause)
        super().__init__(f"{type(cause).__name__}: {str(cause)[:200]}")
        self.__cause__ = cause


MIN_RATED_TOKENS = 256
"""A model call is rated as at least this many tokens (see `BatchScorer.observe_work`)."""


def timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    """`fn(*args)` and the seconds it ran (in the thread that runs it: a call queued behind
    other model work is not charged for the wait)."""
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


def pair_tokens(
    query_tokens: int, passage_tokens: Sequence[int], cap: int | None = None
) -> list[int]:
    """Tokens of each (query, passage) pair from the counts of its parts (a passage already
    cut to `max_tokens_per_doc` where the request asks), capped at the model's `cap`."""
    out = []
    for p in passage_tokens:
        out.append(min(query_tokens + p, cap) if cap is not None else query_tokens + p)
    return out


def byte_pair_tokens(query: str, passages: Sequence[str], cap: int | None = None) -> list[int]:
    """`pair_tokens` with every text costed by its UTF-8 bytes (`utf8_bytes`): for pairs whose
    counts were not given."""
    return pair_tokens(utf8_bytes(query), [utf8_bytes(p) for p in passages], cap)


class BatchObserver(Protocol):
    """What the batcher reports (implemented by `cisrank.serving.metrics.Metrics`)."""

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
    tokens: list[int]  # tokens of each (query, passage) pair
    cost_left: int  # tokens not yet scored (counted in the scorer's in-flight cost)
    parts: list[Part] = field(default_factory=list)  # `score_parts` of the passages before `next`
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
) -> list[list[Part]]:
    """The parts of (query, passages) chunks (`Reranker.score_parts`), scored in the calling
    thread as one model batch."""
    out = reranker.score_parts(chunks)
    for (_, passages), parts in zip(chunks, out, strict=True):
        if len(parts) != len(passages):
            raise RuntimeError(f"reranker returned {len(parts)} parts for {len(passages)} passages")
    return [list(parts) for parts in out]


def combined(
    reranker: Reranker, query: str, passages: Sequence[str], parts: Sequence[Part]
) -> list[float]:
    """One whole request's final scores from its parts (`Reranker.combine`), as floats."""
    scores = reranker.combine(query, passages, parts)
    if len(scores) != len(passages):
        raise RuntimeError(f"reranker combined {len(scores)} scores for {len(passages)} passages")
    return [float(s) for s in scores]


def score_isolated(
    reranker: Reranker, chunks: Sequence[tuple[str, Sequence[str]]], name: str = ""
) -> list[list[Part] | Exception]:
    """`score_chunks`, but a failure of the shared batch is retried chunk by chunk, so that each
    chunk gets its scores or its own error (runs in the model thread, like `score_chunks`)."""
    try:
        return list(score_chunks(reranker, chunks))
    except Exception as exc:
        if len(chunks) == 1:
            log.warning("reranker %s failed on a request: %s: %s", name, type(exc).__name__, exc)
            return [exc]
        log.warning(
            "reranker %s failed on a batch of %d requests (%s: %s); scoring each alone",
            name,
            len(chunks),
            type(exc).__name__,
            exc,
        )
    out: list[list[Part] | Exception] = []
    for chunk in chunks:
        try:
            out.append(score_chunks(reranker, [chunk])[0])
        except Exception as exc:
            log.warning("reranker %s failed on a request: %s: %s", name, type(exc).__name__, exc)
            out.append(exc)
    return out


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
        self._inflight_cost = 0
        self._closed = False
        self.token_cap = reranker.pair_token_limit
        self._seconds_per_token: float | None = None  # measured on this reranker's calls

    # ------------------------------------------------------------------ public

    @property
    def depth(self) -> int:
        """Requests accepted and not yet answered."""
        return self._unfinished

    @property
    def inflight_cost(self) -> int:
        """Tokens accepted and not yet scored."""
        return self._inflight_cost

    def slice_tokens(self) -> int:
        """Tokens one model call (a slice) may hold: `max_batch_tokens`, and no more than take
        `max_slice_s` at the rate measured on this reranker's calls (see the module doc)."""
        bound = self.config.max_batch_tokens
        if self._seconds_per_token:
            bound = min(bound, max(1, int(self.config.max_slice_s / self._seconds_per_token)))
        return bound

    def observe_work(self, tokens: int, seconds: float) -> None:
        """A model call of `tokens` tokens ran `seconds` in the model thread: the rate that
        sizes later slices (a moving average, so that one slow call does not shrink every slice
        after it; a call counts as at least `MIN_RATED_TOKENS`, so that a small call's fixed
        cost does not make the model look slow per token)."""
        if tokens <= 0 or seconds <= 0:
            return
        rate = seconds / max(tokens, MIN_RATED_TOKENS)
        old = self._seconds_per_token
        self._seconds_per_token = rate if old is None else 0.7 * old + 0.3 * rate

    async def score(
        self,
        query: str,
        passages: Sequence[str],
        timeout: float | None = None,
        tokens: Sequence[int] | None = None,
    ) -> list[float]:
        """Scores in input order; raises QueueFullError, ScoringTimeout or the reranker's error.
        `tokens` are each pair's tokens (`pair_tokens`), by UTF-8 bytes when not given."""
        if not passages:
            return []
        self._check_queue()
        if tokens is None:
            tokens = byte_pair_tokens(query, passages, self.token_cap)
        tokens = list(tokens)
        if len(tokens) != len(passages):
            raise ValueError(f"{len(tokens)} token counts for {len(passages)} passages")
        cost = sum(tokens)
        self._admit(cost)
        assert self._loop is not None and self._queue is not None
        job = _Job(query, passages, self._loop.create_future(), self._loop.time(), tokens, cost)
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

    def _check_queue(self) -> None:
        """The first rule of admission, before a request's cost is known: the scorer is open and
        fewer than `max_queue` requests are unanswered (else `QueueFullError`)."""
        if self._closed:
            raise QueueFullError(f"reranker '{self.name}' is shutting down")
        self._ensure_started()
        if self._unfinished >= self.config.max_queue:
            raise QueueFullError(
                f"{self._unfinished} requests are already waiting for reranker '{self.name}'"
            )

    def _admit(self, cost: int) -> None:
        """Count one more request of `cost` tokens, unless it would take the work queued over
        `max_inflight_cost` (`QueueFullError`; a request alone is always let in)."""
        budget = self.config.max_inflight_cost
        if self._inflight_cost and self._inflight_cost + cost > budget:
            raise QueueFullError(
                f"reranker '{self.name}' has {self._inflight_cost} tokens of work queued; this "
                f"request's {cost} would exceed its budget of {budget}"
            )
        self._unfinished += 1
        self._inflight_cost += cost
        self._report_depth()

    @contextlib.asynccontextmanager
    async def reserve(self, cost: int) -> AsyncIterator[None]:
        """Admit work that runs in this model's thread through `call` instead of the batch
        queue (`cisrank.serving.model_thread.ModelThread.admitted`: the `max_tokens_per_doc` cut,
        RAG context assembly with prompts of their own shape, scored in slices), under the
        rules of `score`: inside the block it counts as one request toward `max_queue` and as
        `cost` tokens toward `max_inflight_cost`; `QueueFullError` when either is
        full or the scorer is shutting down. Its model calls go through the same one-thread
        executor as the batches, so they never run concurrently with this reranker's scoring,
        and a batch waiting behind it waits for at most the one call (slice) running."""
        self._check_queue()
        self._admit(cost)
        loop = self._loop
        try:
            yield
        finally:
            if self._loop is loop:  # a new loop restarted the counts
                self._inflight_cost -= cost
                self._unfinished -= 1
                self._report_depth()

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
        self._inflight_cost = 0
        self._worker = loop.create_task(self._run(), name=f"cisrank-batcher-{self.name}")

    def _report_depth(self) -> None:
        if self.observer is not None:
            self.observer.set_queue_depth(self.name, self._unfinished)

    def _release(self, job: _Job) -> None:
        self._inflight_cost -= job.cost_left
        job.cost_left = 0
        self._unfinished -= 1
        self._report_depth()

    def _cancel(self, job: _Job) -> None:
        if not job.cancelled and not job.future.done():
            job.cancelled = True
            job.future.cancel()
            self._release(job)

    def _finish(self, job: _Job, result: list[float] | None, error: BaseException | None) -> None:
        if job.cancelled or job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result or [])
        self._release(job)

    def _combine(self, job: _Job) -> None:
        """Answer a job whose every passage has its part: the whole request combined once."""
        try:
            scores = combined(self.reranker, job.query, job.passages, job.parts)
        except Exception as exc:  # answered as the model's failure on this request
            log.warning(
                "reranker %s failed to combine a request: %s: %s",
                self.name,
                type(exc).__name__,
                exc,
            )
            self._finish(job, None, ScoringFailed(exc))
            return
        self._finish(job, scores, None)

    def _take_waiting(self) -> None:
        assert self._queue is not None
        while not self._queue.empty():
            self._active.append(self._queue.get_nowait())

    def _plan(self, now: float) -> list[tuple[_Job, int, int]]:
        """Chunks for the next model batch: jobs starved for `max_age_ms` first (oldest first),
        then shortest remaining first, FIFO among equals; at most `max_batch_passages` passages
        and `slice_tokens` tokens in all (a single passage over the token bound goes alone: it
        must be scored some time, and the model truncates it anyway)."""
        passages_left = self.config.max_batch_passages
        tokens_left = self.slice_tokens()
        oldest = now - self.config.max_age_ms / 1000.0
        aged = sorted((j for j in self._active if j.waiting_since <= oldest), key=_waited)
        fresh = sorted((j for j in self._active if j.waiting_since > oldest), key=_remaining)
        plan: list[tuple[_Job, int, int]] = []
        for job in aged + fresh:
            end, used = job.next, 0
            stop = min(len(job.passages), job.next + passages_left)
            while end < stop:
                cost = job.tokens[end]
                if used + cost > tokens_left and (plan or end > job.next):
                    break
                used += cost
                end += 1
            if end == job.next:
                break  # the batch is full
            plan.append((job, job.next, end))
            passages_left -= end - job.next
            tokens_left -= used
            if passages_left <= 0 or tokens_left <= 0:
                break
        return plan

    def _waiting_work(self) -> tuple[int, int]:
        """Passages and tokens waiting in the active jobs."""
        return (
            sum(j.remaining for j in self._active),
            sum(j.cost_left for j in self._active),
        )

    async def _run(self) -> None:
        assert self._queue is not None and self._loop is not None
        loop = self._loop
        wait_s = self.config.max_wait_ms / 1000.0
        while True:
            if not self._active:
                self._active.append(await self._queue.get())
                deadline = loop.time() + wait_s
                while True:
                    passages, tokens = self._waiting_work()
                    if (
                        passages >= self.config.max_batch_passages
                        or tokens >= self.config.max_batch_tokens
                    ):
                        break  # a full batch is waiting: no reason to wait for more
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
            try:
                results, seconds = await loop.run_in_executor(
                    self._executor, timed, score_isolated, self.reranker, chunks, self.name
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # not the model (the executor is gone): never the worker
                log.exception("reranker %s failed on a batch of %d requests", self.name, len(plan))
                for job, _, _ in plan:
                    self._finish(job, None, exc)
                failed = {id(job) for job, _, _ in plan}
                self._active = [j for j in self._active if id(j) not in failed]
                continue
            self.observe_work(sum(sum(job.tokens[a:b]) for job, a, b in plan), seconds)
            if self.observer is not None:
                self.observer.observe_batch(
                    self.name, sum(b - a for _, a, b in plan), len(plan), seconds
                )
            scored_at = loop.time()
            for (job, a, b), parts in zip(plan, results, strict=True):
                if isinstance(parts, Exception):
                    self._finish(job, None, ScoringFailed(parts))
                    continue
                if job.cancelled:
                    continue
                done = sum(job.tokens[a:b])
                job.cost_left -= done
                self._inflight_cost -= done
                job.parts.extend(parts)
                job.next = b
                job.waiting_since = scored_at
                if job.remaining == 0:
                    self._combine(job)
            self._active = [
                j
                for j in self._active
                if j.remaining > 0 and not j.cancelled and not j.future.done()
            ]
