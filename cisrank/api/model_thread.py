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
  blame (an input error, `cisrank.api.batching.is_input_error`, or a `FieldFault`), and anything
  else goes on as it is (a server fault: 500, logged, or a `DataError` for a damaged file).

No web framework here (an import-linter contract).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from cisrank.api.batching import (
    BatchScorer,
    QueueFullError,
    ScoringFailed,
    ScoringTimeout,
    is_input_error,
)
from cisrank.api.service_errors import InvalidField, Overloaded, TimedOut
from cisrank.errors import CisrankError, DataError

T = TypeVar("T")


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

    def __init__(self, scorer: BatchScorer, timeout_s: float, redact: Callable[[str], str]) -> None:
        self.scorer = scorer
        self.timeout_s = timeout_s
        self.redact = redact
        self._late_errors: tuple[type[Exception], ...] | None = None  # set while admitted

    async def score(
        self, query: str, passages: Sequence[str], field: str = "documents"
    ) -> list[float]:
        """Scores through the batch queue, in input order. The model failing on this request's
        own text (scored alone, so no other request is to blame) is `InvalidField` naming
        `field` when it is an input error, else the original error (500, logged). In a search,
        `field` is `query`: the only text of the request the client sent."""
        with _admission_errors():
            try:
                return await self.scorer.score(query, passages)
            except ScoringFailed as exc:
                if exc.input_error:
                    raise InvalidField(
                        field, f"the reranker cannot read this request's text: {exc}"
                    ) from None
                assert exc.__cause__ is not None
                raise exc.__cause__ from None

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
            raise TimedOut(late) from None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the model thread, inside `admitted`; its failures on the request's
        input name the field to blame (`documents` unless a `FieldFault` says otherwise)."""
        late_errors = self._late_errors
        if late_errors is None:
            raise RuntimeError("ModelThread.run outside ModelThread.admitted")
        try:
            return await self.scorer.call(fn, *args)
        except late_errors:
            raise
        except FieldFault as exc:
            raise InvalidField(exc.field, self.redact(str(exc))) from None
        except DataError:
            raise
        except CisrankError as exc:
            raise InvalidField("documents", self.redact(str(exc))) from None
        except Exception as exc:
            if is_input_error(exc):
                raise InvalidField(
                    "documents", f"the model cannot read this request's text: {str(exc)[:200]}"
                ) from None
            raise
