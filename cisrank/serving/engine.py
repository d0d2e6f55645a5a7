"""What the services of one server share: the loaded rerankers and their batchers, the indexes,
the configuration, the metrics, readiness, the checks every request gets, and the redaction of
server paths.

Why apart: the ranking service (`cisrank.serving.ranking`) and the context service
(`cisrank.serving.assembly`) are both composed from these parts, so neither reaches into the other.
`cisrank.api.app` builds one `Serving` per app and both services over it. No web framework here
(an import-linter contract).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from cisrank.errors import CisrankError
from cisrank.rerank.base import Reranker, fast_only
from cisrank.rerank.chunking import (
    Chunking,
    ChunkPlan,
    Splitter,
    WindowsOverBudget,
    plan_request,
)
from cisrank.retrieval.base import Retriever
from cisrank.serving.batching import BatchScorer, pair_tokens
from cisrank.serving.checks import PreflightError, preflight
from cisrank.serving.config import ServerConfig
from cisrank.serving.errors import InvalidField, LoadFailed, NotReady, TimedOut
from cisrank.serving.metrics import Metrics
from cisrank.serving.model_thread import ModelThread
from cisrank.serving.token_count import OverBudget, TokenCounter
from cisrank.serving.types import BLANK, is_blank

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- model loading


def open_retriever(path: os.PathLike[str] | str) -> Retriever:
    """Open an index folder with `cisrank.indexes.kinds.open_index` (imported when first used)."""
    from cisrank.indexes.kinds import open_index

    return open_index(os.fspath(path))


def text_embedder(reranker: Reranker) -> Callable[[Sequence[str]], np.ndarray] | None:
    """The bi-encoder a reranker declares (`Reranker.embedder`: unit-length embeddings of
    texts, no prefix), or None where it has none: what `/v1/embeddings` serves."""
    embedder = reranker.embedder
    return None if embedder is None else embedder.embed


def processes(reranker: Reranker) -> int:
    """The processes a reranker's model work runs on: its workers in a pool, else this one."""
    return reranker.processes


def embedding_dimensions(reranker: Reranker) -> int | None:
    """The length of the vectors `text_embedder` gives (None where unknown or none): checked
    against a request's `dimensions` before anything is embedded."""
    embedder = reranker.embedder
    return None if embedder is None else embedder.dimensions


def public_model_id(model: str | None) -> str | None:
    """The model id as `/v1/models` shows it: a Hugging Face id as is, a local folder by its
    name only (a server path is nobody's business outside it)."""
    if model is None:
        return None
    if os.path.isabs(model) or model.startswith(("~", "./", "../")):
        return os.path.basename(os.path.normpath(os.path.expanduser(model))) or model
    return model


def model_ids(model: str | None) -> set[str]:
    """The names clients send for `model`, casefolded: as configured, its public id (a local
    folder by its name), a hub id without its owner (OpenAI and TEI clients send
    `all-MiniLM-L6-v2` for `sentence-transformers/all-MiniLM-L6-v2`), and a catalogue model's
    upstream id and catalogue name for each other."""
    if not model:
        return set()
    from cisrank.models.catalogue import for_source_model, lookup
    from cisrank.models.resolve import MINILM_ID

    forms = {model, public_model_id(model) or model}
    if model.casefold() in {MINILM_ID.casefold(), MINILM_ID.rsplit("/", 1)[1].casefold()}:
        forms.add(MINILM_ID)
    if (entry := lookup(model)) is not None:
        forms |= {entry.name, entry.source_model}
    if (entry := for_source_model(model)) is not None:
        forms.add(entry.name)
    for form in list(forms):
        owner, slash, name = form.partition("/")
        if slash and owner and name and "/" not in name and not os.path.exists(form):
            forms.add(name)  # a hub id's own name, without its owner
    return {f.casefold() for f in forms}


# ------------------------------------------------------------------------------- serving


class Serving:
    """Rerankers, their batchers, indexes and readiness, for every service of one app."""

    def __init__(
        self,
        config: ServerConfig,
        metrics: Metrics | None = None,
        rerankers: Mapping[str, Reranker] | None = None,
        retrievers: Mapping[str, Retriever] | None = None,
        on_loaded: Callable[[str | None], None] | None = None,
        preflight: bool = True,
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else Metrics(lambda: self.rerankers)
        """Default: the engine's own, whose prior-store and passage-cache figures are those of
        its loaded rerankers."""
        self.preflight = preflight
        """Whether loading starts with the pre-start checks (`cisrank.serving.preflight`);
        False where they have run already (`cisrank serve` runs them before it binds its port)."""
        self.on_loaded = on_loaded
        """Called once loading has ended, from the loader thread: None when everything loaded,
        else one line saying what failed and why (with the exception's text: for the operator
        who started the server, never for clients). `cisrank serve` stops on a failure."""
        self.rerankers: dict[str, Reranker] = {}
        self.scorers: dict[str, BatchScorer] = {}
        self.counters: dict[str, TokenCounter] = {}
        """Each reranker's token counter: its requests' costs in its own tokens."""
        self._splitters: dict[str, Splitter] = {}
        self.lm_counters: dict[str, TokenCounter] = {}
        """The same for the prompts of its causal LM (context, generation)."""
        self.retrievers: dict[str, Retriever] = dict(retrievers or {})
        self.error: str | None = None
        """Why loading failed, naming the component only (it is shown to clients)."""
        self._ready = threading.Event()
        self._loader: threading.Thread | None = None
        if rerankers is not None:
            self._install(dict(rerankers))
            if retrievers is None and config.indexes:
                self.retrievers = {n: open_retriever(s.path) for n, s in config.indexes.items()}
            self._ready.set()

    # ---- readiness and loading

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.error is None

    def _install(self, rerankers: dict[str, Reranker]) -> None:
        for name, reranker in rerankers.items():
            self.scorers[name] = BatchScorer(reranker, name, self.config.batching, self.metrics)
            self.counters[name] = TokenCounter(reranker.fast_tokenizer, name)
            lm = reranker.causal_lm
            lm_tokenizer = fast_only(lm.tokenizer) if lm is not None else None
            self.lm_counters[name] = (
                self.counters[name]
                if lm_tokenizer is None or lm_tokenizer is reranker.fast_tokenizer
                else TokenCounter(lm_tokenizer, f"{name}-lm")
            )
        self.rerankers = rerankers

    def start_loading(self) -> None:
        """Load models in a thread so that /healthz answers while they load."""
        if self._ready.is_set() or self._loader is not None:
            return
        self._loader = threading.Thread(target=self._load, name="cisrank-loader", daemon=True)
        self._loader.start()

    def _load(self) -> None:
        component = "the server"
        failure: str | None = None
        try:
            if self.preflight:
                preflight(self.config)
            loaded: dict[str, Reranker] = {}
            for name, spec in self.config.rerankers.items():
                component = f"reranker '{name}'"
                started = time.perf_counter()
                reranker = loaded[name] = spec.build(serving=True)
                runs_on = " ".join(filter(None, (reranker.runtime, reranker.compute_type)))
                log.info(
                    "loaded reranker %s (%s, %s on %s) in %.1f s",
                    name,
                    spec.kind,
                    public_model_id(spec.model or reranker.model_name),
                    runs_on or "its own runtime",
                    time.perf_counter() - started,
                )
            retrievers = {}
            for name, index in self.config.indexes.items():
                component = f"index '{name}'"
                retrievers[name] = open_retriever(index.path)
                log.info("opened index %s", name)
            self._install(loaded)
            self.retrievers = retrievers
        except PreflightError as exc:
            self.error = (
                f"{exc.component} failed its pre-start check; details are in the server log"
            )
            log.error("pre-start check failed: %s", exc)
            failure = str(exc)
        except Exception as exc:
            # The exception's text (paths, file names) goes to the log; clients see the component.
            self.error = f"{component} failed to load; details are in the server log"
            log.error("loading %s failed: %s: %s", component, type(exc).__name__, exc)
            cause = str(exc) if isinstance(exc, CisrankError) else f"{type(exc).__name__}: {exc}"
            failure = f"{component} failed to load: {cause}"
        finally:
            self._ready.set()
            if self.on_loaded is not None:
                self.on_loaded(failure)

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout) and self.error is None

    def wait_loaded(self, timeout: float) -> bool:
        """Whether loading has ended (well or not) within `timeout` seconds."""
        return self._ready.wait(timeout)

    def open(self) -> None:
        """Accept requests again (an app whose lifespan runs more than once)."""
        for scorer in self.scorers.values():
            scorer.open()

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in self.scorers.values()))
        for counter in [*self.counters.values(), *self.lm_counters.values()]:
            counter.close()
        for reranker in self.rerankers.values():
            reranker.close()  # worker processes go with the server

    # ---- lookups and the checks every route makes

    def check_ready(self) -> None:
        """`LoadFailed` if loading failed, `NotReady` while the models load."""
        if self.error is not None:
            raise LoadFailed(self.error)
        if not self.ready:
            raise NotReady("models are still loading: retry shortly")

    def scorer(self, name: str) -> BatchScorer:
        self.check_ready()
        return self.scorers[name]

    def counter(self, name: str, lm: bool = False) -> TokenCounter:
        """Reranker `name`'s token counter (`lm`: its causal LM's, for prompts)."""
        self.check_ready()
        return (self.lm_counters if lm else self.counters)[name]

    async def pair_costs(
        self,
        name: str,
        query: str,
        texts: list[str],
        field: str,
        per_doc: int | None = None,
        what: str = "document",
    ) -> tuple[list[str], list[int], int]:
        """What ranking `texts` for `query` with reranker `name` costs, before any model work:
        (the texts to score, cut to `per_doc` tokens where asked; each (query, text) pair's
        tokens, capped at the model's length; how many texts were cut), counted with the
        reranker's own tokenizer off the event loop and the model thread
        (`cisrank.serving.token_count`). Refused as soon as the pairs pass
        `limits.max_request_cost` (422 naming `field`), or not counted within the request
        timeout (503). `what` is what a text is, for the message (a document, a window)."""
        budget = self.config.limits.max_request_cost
        cap = self.scorer(name).token_cap
        counter = self.counter(name)
        timeout = self.config.batching.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                query_tokens = (await counter.measure([query])).counts[0]
                limit = per_doc
                if cap is not None:  # a passage is read up to what the pair leaves of the cap
                    room = max(1, cap - query_tokens)
                    limit = room if limit is None else min(limit, room)

                def pair(_: int, n: int) -> int:
                    return min(query_tokens + n, cap) if cap is not None else query_tokens + n

                measured = await counter.measure(
                    texts, limit=limit, cut=per_doc, cost=pair, budget=budget
                )
        except OverBudget as exc:
            raise InvalidField(
                field,
                f"cost {'at least ' if exc.at_least else ''}{exc.cost} {counter.unit} (those "
                f"of (query, {what}) summed over the {what}s, each pair capped at the "
                f"model's length) is over the limit of {budget}: send fewer or shorter "
                "documents, or set max_tokens_per_doc"
                + (" or max_chunks_per_doc" if what == "window" else ""),
            ) from None
        except TimeoutError:
            raise TimedOut(
                f"not counted within {timeout:g} s: the server is overloaded, retry later"
            ) from None
        return measured.texts, pair_tokens(query_tokens, measured.counts, cap), measured.cut

    def splitter(self, name: str) -> Splitter:
        """Reranker `name`'s window splitter: a private copy of the tokenizer its
        `passage_window` counts in (made once; never the model thread's own tokenizer)."""
        made = self._splitters.get(name)
        if made is None:
            window = self.rerankers[name].passage_window
            made = Splitter(window.tokenizer if window is not None else None)
            self._splitters[name] = made
        return made

    async def window_costs(
        self, name: str, query: str, texts: list[str], field: str, chunking: Chunking
    ) -> tuple[ChunkPlan, list[int]]:
        """The windows of `texts` for `query` (`cisrank.rerank.chunking.plan_request`, as the
        library plans them, on the counting thread) and each (query, window) pair's tokens,
        counted as `pair_costs` counts documents: refused (422 naming `field`) when the pairs
        of every window pass `limits.max_request_cost`, before any model work. The planning
        itself stops once the windows planned pass the budget, counted low (a window's own
        tokens less 2, the most its re-tokenized text can gain at its two cuts), so a request
        that the exact count admits is never refused by it."""
        counter = self.counter(name)
        timeout = self.config.batching.request_timeout_s
        budget = self.config.limits.max_request_cost
        cap = self.scorer(name).token_cap
        passage = self.rerankers[name].passage_window
        splitter = self.splitter(name)
        try:
            async with asyncio.timeout(timeout):
                query_tokens = (await counter.measure([query])).counts[0]

                def low(n: int) -> int:
                    pair = query_tokens + max(0, n - 2)
                    return min(pair, cap) if cap is not None else pair

                plan = await counter.run(
                    plan_request, splitter, passage, query, texts, chunking, low, budget
                )
        except WindowsOverBudget as exc:
            raise InvalidField(
                field,
                f"cost at least {exc.cost} {counter.unit} (those of (query, window) summed over "
                f"the windows, each pair capped at the model's length) is over the limit of "
                f"{budget}: send fewer or shorter documents, or set max_tokens_per_doc or "
                "max_chunks_per_doc",
            ) from None
        except TimeoutError:
            raise TimedOut(
                f"not counted within {timeout:g} s: the server is overloaded, retry later"
            ) from None
        _, tokens, _ = await self.pair_costs(name, query, plan.texts(texts), field, what="window")
        return plan, tokens

    def model_thread(self, name: str, cancel: threading.Event | None = None) -> ModelThread:
        """Reranker `name`'s model thread, for one request's model work; `cancel`, once set
        (its client hung up), stops that work at its next step."""
        return ModelThread(
            self.scorer(name), self.config.batching.request_timeout_s, self.redact, cancel
        )

    def served_model(self, name: str) -> str | None:
        """The model reranker `name` serves: as configured, else (the kind's default) the loaded
        reranker's, else None while it loads."""
        spec = self.config.rerankers[name]
        loaded = self.rerankers.get(name)
        return spec.model or (loaded.model_name if loaded is not None else None)

    def resolve_reranker(
        self, requested: str | None, field: str = "model", among: Sequence[str] | None = None
    ) -> str:
        """A configured reranker name from a request's `model`: a reranker's name, else the id
        of the model it serves in any of the forms clients send (`model_ids`), the first such
        reranker of `among` (default: all) in config order."""
        if requested is None:
            return self.config.default_reranker_name
        if requested in self.config.rerankers:
            return requested
        wanted = requested.casefold()
        for name in among if among is not None else self.config.rerankers:
            if wanted in model_ids(self.served_model(name)):
                return name
        choices = ", ".join(
            f"{n} ({public_model_id(m)})" if (m := self.served_model(n)) else n
            for n in self.config.rerankers
        )
        raise InvalidField(
            field, f"'{requested[:100]}' is not served here: choose one of {choices}"
        )

    def check_query(self, query: str) -> None:
        """The query's length, against `limits.max_query_chars` (every route takes a query),
        and that it holds a visible character (`is_blank`)."""
        max_chars = self.config.limits.max_query_chars
        if len(query) > max_chars:
            raise InvalidField("query", f"{len(query)} characters, over the limit of {max_chars}")
        if is_blank(query):
            raise InvalidField("query", BLANK)

    def redact(self, text: str) -> str:
        """`text` with the configured server paths (index folders, local model folders, path
        options) replaced by the component's name, for a message that goes to a client."""
        paths: dict[str, str] = {}
        for name, index in self.config.indexes.items():
            for form in (str(index.path), str(index.path.expanduser().resolve())):
                paths[form] = f"<index {name}>"
        for name, spec in self.config.rerankers.items():
            values = [spec.model, *spec.options.values()]
            for value in values:
                if isinstance(value, str) and public_model_id(value) != value:
                    for form in (value, os.path.realpath(os.path.expanduser(value))):
                        paths[form] = f"<{name} file {public_model_id(value)}>"
        for path in sorted(paths, key=len, reverse=True):
            if len(path) > 1:
                text = text.replace(path, paths[path])
        return text
