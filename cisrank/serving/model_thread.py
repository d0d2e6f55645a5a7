"""Model work of one request on its reranker's model thread, answered as service errors.

A model is not thread-safe and is busy with rerank batches, so all its work runs in the one thread
of its `BatchScorer`. Every route that does model work goes through `ModelThread`, so it is
admitted, bounded in time and has its failures named the same way:

- scoring (`score`: rerank, reranked search) goes through the batch queue, which admits the
  request (`max_queue`, `batching.max_inflight_cost`) and bounds it by
  `batching.request_timeout_s` itself;
- any other model work (`admitted`, then `run`: the `max_tokens_per_doc` cut, RAG context
  assembly, generation) is admitted like a rerank request (`BatchScorer.reserve`: one request
  toward `max_queue`, its estimated cost toward `max_inflight_cost`) and bounded, as a whole, by
  `batching.request_timeout_s`; each `run` is one call in the model thread, so a batch waiting
  behind it waits for that one call (slice), never for the whole request;
- a full queue or cost budget is `Overloaded` (503 + Retry-After), a request past its deadline
  `TimedOut`; the model failing on the request's own text is `InvalidField` naming the field to
  blame (an input error, `cisrank.serving.batching.is_input_error`, or a `FieldFault`); a damaged file
  the reranker reads (its prior store: a `DataError`) is `BackendFailed` naming the reranker and
  the file (500, never a generic one); anything else goes on as it is (a server fault: 500,
  logged);
- a request whose client hung up (`cancel` set by the route) is `ClientGone`: a step not yet
  started is skipped, and a step that checks the flag itself (the decoding loop of
  `/v1/generate`) stops at its next token, so an abandoned request frees the model thread.

No web framework here (an import-linter contract).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from cisrank.errors import CisrankError, DamagedFileError, DataError
from cisrank.serving.batching import (
    BatchScorer,
    QueueFullError,
    ScoringFailed,
    ScoringTimeout,
    is_input_error,
    timed,
)
from cisrank.serving.errors import (
    BackendFailed,
    ClientGone,
    InvalidField,
    Overloaded,
    TimedOut,
)

T = TypeVar("T")
log = logging.getLogger(__name__)


def _backend_failed(reranker: str, exc: DataError) -> BackendFailed:
    """A damaged or unreadable file of a reranker (its prior store) as the 500 that names the
    reranker and the file by its name (no server path leaves the server); details to the log."""
    log.error("reranker %s failed on a damaged file: %s", reranker, exc)
    what = f" '{Path(exc.path).name}'" if isinstance(exc, DamagedFileError) else ""
    return BackendFailed(
        f"reranker '{reranker}' cannot read its file{what}: it is damaged; details are in the "
        "server log"
    )


class FieldFault(CisrankError):
    """Raised in the model thread by a step that knows which request field is to blame."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@contextmanager
def _admission_errors() -> Iterator[None]:
    """The batcher's refusals as service errors (one place for every route)."""
    try:
        yield
    except QueueFullError as exc:
        raise Overloaded(f"{exc}: retry later") from None
    except ScoringTimeout as exc:
        raise TimedOut(str(exc)) from None


class ModelThread:
    """One reranker's model thread as one request uses it (`Serving.model_thread`)."""

    def __init__(
        self,
        scorer: BatchScorer,
        timeout_s: float,
        redact: Callable[[str], str],
        cancel: threading.Event | None = None,
    ) -> None:
        self.scorer = scorer
        self.timeout_s = timeout_s
        self.redact = redact
        self.cancel = cancel
        self._late_errors: tuple[type[Exception], ...] | None = None  # set while admitted

    @property
    def cancelled(self) -> bool:
        """Whether the request's client hung up."""
        return self.cancel is not None and self.cancel.is_set()

    def _gone(self) -> ClientGone:
        return ClientGone("the client closed the connection before the answer")

    async def score(
        self,
        query: str,
        passages: Sequence[str],
        field: str = "documents",
        tokens: Sequence[int] | None = None,
    ) -> list[float]:
        """Scores through the batch queue, in input order; `tokens` are each pair's (counted by
        the service). The model failing on this request's own text (scored alone, so no other
        request is to blame) is `InvalidField` naming `field` when it is an input error, else
        the original error (500, logged). In a search, `field` is `query`: the only text of
        the request the client sent."""
        with _admission_errors():
            try:
                return await self.scorer.score(query, passages, tokens=tokens)
            except ScoringFailed as exc:
                if exc.input_error:
                    raise InvalidField(
                        field, f"the reranker cannot read this request's text: {exc}"
                    ) from None
                cause = exc.__cause__
                assert cause is not None
                if isinstance(cause, DataError):
                    raise _backend_failed(self.scorer.name, cause) from None
                raise cause from None

    @asynccontextmanager
    async def admitted(
        self, cost: int, late: str, late_errors: tuple[type[Exception], ...] = ()
    ) -> AsyncIterator[None]:
        """Admit `cost` estimated tokens of model work for the block, which `run`s it, all of it
        within the request timeout: past it (or on one of `late_errors`, a step's own deadline
        raised in the model thread) the request is `TimedOut` with the message `late`, and the
        steps left are dropped."""
        deadline_errors: tuple[type[Exception], ...] = (TimeoutError, *late_errors)
        try:
            with _admission_errors():
                async with asyncio.timeout(self.timeout_s):
                    async with self.scorer.reserve(cost):
                        self._late_errors = late_errors
                        try:
                            yield
                        finally:
                            self._late_errors = None
        except deadline_errors:
            if self.cancelled:
                raise self._gone() from None
            raise TimedOut(late) from None

    def _unless_cancelled(self, fn: Callable[..., T], *args: Any) -> T:
        """In the model thread: `fn(*args)`, unless the client hung up while it waited."""
        if self.cancelled:
            raise self._gone()
        return fn(*args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the model thread, inside `admitted`; its failures on the request's
        input name the field to blame (`documents` unless a `FieldFault` says otherwise). A
        step of a request whose client hung up is not run (`ClientGone`), and any failure of a
        step once it has hung up is that (the decoding loop stops on the flag)."""
        late_errors = self._late_errors
        if late_errors is None:
            raise RuntimeError("ModelThread.run outside ModelThread.admitted")
        if self.cancelled:
            raise self._gone()
        try:
            result = await self.scorer.call(self._unless_cancelled, fn, *args)
        except ClientGone:
            raise
        except Exception as exc:
            if self.cancelled:
                raise self._gone() from None
            raise self._named(exc) from None
        if self.cancelled:
            raise self._gone()
        return result

    def slice_tokens(self) -> int:
        """Tokens one call of this model may hold (`BatchScorer.slice_tokens`)."""
        return self.scorer.slice_tokens()

    async def run_slice(self, tokens: int, fn: Callable[..., T], *args: Any) -> T:
        """`run`, for one slice of `tokens` tokens of model work: timed in the model thread, so
        that the rate that sizes slices counts it (`BatchScorer.observe_work`)."""
        result, seconds = await self.run(timed, fn, *args)
        self.scorer.observe_work(tokens, seconds)
        return result

    def _named(self, exc: Exception) -> Exception:
        """A step's failure as the service error that names what to blame (or itself)."""
        late_errors = self._late_errors or ()
        if isinstance(exc, late_errors):
            return exc
        if isinstance(exc, FieldFault):
            return InvalidField(exc.field, self.redact(str(exc)))
        if isinstance(exc, DataError):
            return _backend_failed(self.scorer.name, exc)
        if isinstance(exc, CisrankError):
            return InvalidField("documents", self.redact(str(exc)))
        if is_input_error(exc):
            return InvalidField(
                "documents", f"the model cannot read this request's text: {str(exc)[:200]}"
            )
        return exc
