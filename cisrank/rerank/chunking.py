"""Long documents: cut into token windows, each scored as a passage, pooled per document.

Why: every model reads a passage up to its own window (the cross-encoder's pair limit less the
query, the bi-encoder's sequence length, CIS's `max_doc_tokens`) and drops the rest, so a long
document whose answer is at its end ranked as its beginning did, silently. Here a document longer
than the window is split into windows of `window_tokens` tokens that overlap by `overlap_tokens`,
each window is scored as a passage of its own, and the document's score is pooled from its
windows' scores: `max` (its best window, Cohere's and Elastic's rule), `mean`, or `first` (only
the first window is scored: today's truncation, for comparison). A document that fits in one
window is one window holding its whole text unchanged, so short documents score exactly as
without chunking.

Windows are character spans `(start, end)` into the document as it was given, from the token
offsets of the reranker's own tokenizer (no special tokens), so the span of the best window can be
handed to a RAG prompt as it stands. Without a tokenizer, windows are of whitespace-separated
words. A window's text, tokenized again on its own, can differ from its slice of ids by a token at
a cut word (a WordPiece continuation, a BPE merge): the model truncates such a window as it would
any passage.

Scoring goes through `Reranker.score` of all the windows of a request as one list of passages,
so every kind scores a window as it scores a passage: CIS takes a window's log p(K) from its prior
store, keyed by the window's content; a bi-encoder embeds the query once. For a reranker whose
scores depend on the whole list (`combines_request`: the hybrid's per-request normalization, the
identity's positions), combine runs over the request's windows, then windows are pooled per
document: the hybrid normalizes each component over every window sent, and the identity numbers
windows in order, so pooling its scores keeps the documents' order (each document's windows are
consecutive, so max, mean and first all fall with the document's position).

`max_chunks_per_doc` keeps a document's first K windows; the windows dropped are counted, as are
the documents chunked and the windows scored (`ChunkUsage`): no cut is silent. The server
(`cisrank.serving.ranking`) plans and pools with the same functions as `rank_chunked`, so a
served ranking equals the library's.

This module stays light: no torch at import.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import Field, model_validator

from cisrank.config import ComponentConfig
from cisrank.data.types import BestChunk, RankedPassage, check_top_n, top_order

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

Pooling = Literal["max", "mean", "first"]

DEFAULT_OVERLAP_TOKENS = 32
"""Chosen on DL21 (bench/RESULTS.md, "Long documents"; all-MiniLM-L6-v2, each candidate padded
to 1,000-5,000 words with the judged text at the end, BM25 top 20): max-pooled nDCG@10 0.4977 at
32 tokens against 0.4541 at 0 (the answer cut at a window's edge; p = 0.0001) and 0.4749 at 64
(more windows of filler to win with, 1.16x the windows; p = 0.013)."""

_WORD = re.compile(r"\S+")

Span = tuple[int, int]


@dataclass(frozen=True)
class PassageWindow:
    """What a model reads of one passage: `tokens` of `tokenizer` (whitespace words where it is
    None), less the query's own tokens where `less_query` (a cross-encoder reads them in the
    same sequence)."""

    tokens: int
    tokenizer: PreTrainedTokenizerFast | None
    less_query: bool = False

    def for_query(self, query_tokens: int) -> int:
        """The window for a query of `query_tokens` tokens (at least one token)."""
        return max(1, self.tokens - query_tokens if self.less_query else self.tokens)


class WindowedScorer(Protocol):
    """What chunking needs of a reranker (`cisrank.rerank.base.Reranker` has it): its window
    and its scores of passages."""

    @property
    def passage_window(self) -> PassageWindow | None: ...

    def score(self, query: str, passages: Sequence[str]) -> list[float]: ...


class Chunking(ComponentConfig):
    """How long documents are cut and pooled (module docstring). `window_tokens` None is the
    model's own window for the query at hand; where it is given it is used as it is, even over
    the model's (the model then truncates each window)."""

    label: ClassVar[str] = "chunking"

    window_tokens: int | None = Field(
        default=None, ge=1, description="Tokens a window holds (None: the model's own window)."
    )
    overlap_tokens: int = Field(
        default=DEFAULT_OVERLAP_TOKENS,
        ge=0,
        description="Tokens consecutive windows share (under the window; with the model's own "
        "window, at most half of it).",
    )
    pooling: Pooling = Field(
        default="max", description="A document's score from its windows': max, mean or first."
    )
    max_chunks_per_doc: int | None = Field(
        default=None, ge=1, description="Windows scored per document at most (its first ones)."
    )

    @model_validator(mode="after")
    def _overlap_under_window(self) -> Chunking:
        if self.window_tokens is not None and self.overlap_tokens >= self.window_tokens:
            raise ValueError(
                f"overlap_tokens {self.overlap_tokens} must be under window_tokens "
                f"{self.window_tokens}"
            )
        return self

    def overlap_for(self, window: int) -> int:
        """The overlap used with a window of `window` tokens: as given for a given window; with
        the model's, at most half of it, so that windows always advance."""
        if self.window_tokens is not None:
            return self.overlap_tokens
        return min(self.overlap_tokens, window // 2)


@dataclass
class ChunkUsage:
    """What chunking did to one request: documents cut into more than one window, windows
    scored, windows dropped by `max_chunks_per_doc` (and by `first` pooling)."""

    chunked_documents: int = 0
    windows_scored: int = 0
    windows_dropped: int = 0


@dataclass
class ChunkPlan:
    """Every document's windows to score (after the cap), each window's tokens, and the usage."""

    spans: list[list[Span]]
    tokens: list[list[int]]
    usage: ChunkUsage = field(default_factory=ChunkUsage)
    windows: list[int] = field(default_factory=list)
    """Each document's windows before any cap: 1 where it fits the window whole."""
    window: int | None = None
    """The window's tokens (None: documents read whole, a reranker without a window)."""

    def too_long(self) -> int | None:
        """The first document that does not fit in one window, None where every one does."""
        return next((i for i, n in enumerate(self.windows) if n > 1), None)

    def texts(self, documents: Sequence[str]) -> list[str]:
        """The windows' texts, document after document: the passages to score."""
        return [
            doc[a:b] for doc, spans in zip(documents, self.spans, strict=True) for a, b in spans
        ]

    @property
    def flat_tokens(self) -> list[int]:
        return [n for per_doc in self.tokens for n in per_doc]


class RankedList(list[RankedPassage]):
    """`Reranker.rank`'s answer: the ranked passages, and what chunking did (`chunks`, None
    where nothing was chunked because no chunking was asked)."""

    chunks: ChunkUsage | None = None


# ------------------------------------------------------------------------ splitting


class Splitter:
    """Token offsets of texts in a tokenizer's tokens, without special tokens: a private copy of
    a Hugging Face fast tokenizer's backend (no truncation, no padding: a fast tokenizer must
    not be shared between threads, and its truncation settings are state), or whitespace words
    where there is none."""

    def __init__(self, tokenizer: Any | None) -> None:
        self._tok: Any | None = None
        if tokenizer is not None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            tok.no_truncation()
            tok.no_padding()
            self._tok = tok

    def offsets(self, text: str) -> list[Span]:
        """The character span of each token (each word, without a tokenizer) of `text`."""
        if self._tok is None:
            return [m.span() for m in _WORD.finditer(text)]
        enc = self._tok.encode(text, add_special_tokens=False)
        return [(int(a), int(b)) for a, b in enc.offsets]


def window_starts(n_tokens: int, window: int, overlap: int) -> list[int]:
    """The first token of each window: every `window - overlap` tokens, until a window reaches
    the last token; one window where the text fits."""
    starts, start = [], 0
    while True:
        starts.append(start)
        if start + window >= n_tokens:
            return starts
        start += window - overlap


def split_spans(
    text: str, offsets: Sequence[Span], window: int, overlap: int
) -> tuple[list[Span], list[int]]:
    """(each window's character span in `text`, its tokens) from the tokens' `offsets`; one
    window of the whole text where it fits."""
    n = len(offsets)
    if n <= window:
        return [(0, len(text))], [n]
    spans, tokens = [], []
    for start in window_starts(n, window, overlap):
        stop = min(start + window, n)
        spans.append((offsets[start][0], offsets[stop - 1][1]))
        tokens.append(stop - start)
    return spans, tokens


def plan_windows(
    documents: Sequence[str],
    offsets: Sequence[Sequence[Span]],
    window: int | None,
    chunking: Chunking,
) -> ChunkPlan:
    """Every document's windows, capped (`max_chunks_per_doc`, and one for `first` pooling),
    from its tokens' offsets; with no window (a reranker without one), each document whole."""
    plan = ChunkPlan([], [], window=window)
    usage = plan.usage
    cap = 1 if chunking.pooling == "first" else chunking.max_chunks_per_doc
    if chunking.max_chunks_per_doc is not None:
        cap = min(cap or chunking.max_chunks_per_doc, chunking.max_chunks_per_doc)
    for doc, offs in zip(documents, offsets, strict=True):
        if window is None:
            spans, tokens = [(0, len(doc))], [len(offs)]
        else:
            spans, tokens = split_spans(doc, offs, window, chunking.overlap_for(window))
        plan.windows.append(len(spans))
        if len(spans) > 1:
            usage.chunked_documents += 1
        if cap is not None and len(spans) > cap:
            usage.windows_dropped += len(spans) - cap
            spans, tokens = spans[:cap], tokens[:cap]
        usage.windows_scored += len(spans)
        plan.spans.append(spans)
        plan.tokens.append([max(1, t) for t in tokens])
    return plan


# ------------------------------------------------------------------------ pooling


def pool(
    plan: ChunkPlan, scores: Sequence[float], pooling: Pooling
) -> list[tuple[float, BestChunk]]:
    """Per document, (its score pooled from its windows' `scores`, in plan order; its best
    window, the first of equal bests, as `BestChunk(start, end, score)`)."""
    out: list[tuple[float, BestChunk]] = []
    at = 0
    for spans in plan.spans:
        own = [float(s) for s in scores[at : at + len(spans)]]
        at += len(spans)
        best = max(range(len(own)), key=lambda i: (own[i], -i))
        if pooling == "mean":
            pooled = sum(own) / len(own)
        elif pooling == "first":
            pooled = own[0]
        else:
            pooled = own[best]
        a, b = spans[best]
        out.append((pooled, BestChunk(a, b, own[best])))
    if at != len(scores):
        raise ValueError(f"{len(scores)} window scores for a plan of {at} windows")
    return out


class WindowsOverBudget(Exception):
    """The windows planned so far already cost `cost`, over `budget`: the request is refused
    without tokenizing the rest of its documents."""

    def __init__(self, cost: int, budget: int) -> None:
        super().__init__(f"windows cost at least {cost}, over {budget}")
        self.cost = cost
        self.budget = budget


def plan_request(
    splitter: Splitter,
    passage: PassageWindow | None,
    query: str,
    documents: Sequence[str],
    chunking: Chunking,
    cost: Callable[[int], int] | None = None,
    budget: int | None = None,
) -> ChunkPlan:
    """One request's windows: the window for `query` (the options', else the model's `passage`
    window less the query's tokens where it reads them too), then every document's, one document
    at a time. The library and the server plan with this one function (`splitter` over
    `passage.tokenizer`). With `budget`, the running sum of `cost(tokens)` over the windows
    planned stops the planning as soon as it passes `budget` (`WindowsOverBudget`): refusing a
    request costs the tokenizing of one budget's worth of documents, not of all of them."""
    window = chunking.window_tokens
    if passage is not None and window is None:
        window = passage.for_query(len(splitter.offsets(query)))
    plan = ChunkPlan([], [], window=window)
    spent = 0
    for doc in documents:
        offsets = [splitter.offsets(doc) if window is not None else []]
        one = plan_windows([doc], offsets, window, chunking)
        plan.spans += one.spans
        plan.tokens += one.tokens
        plan.windows += one.windows
        plan.usage.chunked_documents += one.usage.chunked_documents
        plan.usage.windows_scored += one.usage.windows_scored
        plan.usage.windows_dropped += one.usage.windows_dropped
        if budget is not None and cost is not None:
            spent += sum(cost(n) for n in one.tokens[0])
            if spent > budget:
                raise WindowsOverBudget(spent, budget)
    return plan


def rank_chunked(
    reranker: WindowedScorer,
    query: str,
    documents: Sequence[str],
    top_n: int | None,
    chunking: Chunking,
) -> RankedList:
    """`Reranker.rank` with chunking: windows planned, scored as one request, pooled, ranked."""
    if isinstance(documents, str):
        raise TypeError("documents must be a list of strings, not one string")
    check_top_n(top_n)
    docs = list(documents)
    passage = reranker.passage_window
    splitter = Splitter(passage.tokenizer if passage is not None else None)
    plan = plan_request(splitter, passage, query, docs, chunking)
    texts = plan.texts(docs)
    scores = reranker.score(query, texts) if texts else []
    best = pool(plan, scores, chunking.pooling)
    order = top_order([score for score, _ in best], top_n)
    out = RankedList(RankedPassage(i, best[i][0], docs[i], best_chunk=best[i][1]) for i in order)
    out.chunks = plan.usage
    return out
