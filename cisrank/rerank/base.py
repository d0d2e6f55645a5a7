"""The one interface every reranker implements.

The API, eval and distillation code take any reranker through `Reranker`. Its one primitive is
`score_batch`: many (query, passages) requests at once, so that a reranker with a model can pack
passages of different queries into shared batches, and every caller (API batcher, eval,
distillation) gets that without asking whether the reranker can. `score` and `rank` derive from
it. Ranking is derived from scores in one place (`rank_order`) so that every caller breaks ties
the same deterministic way.

Parts and combine. Callers split requests: the API batcher scores a large request in slices, a
worker pool deals a request's passages to several processes. That is sound only for what a
passage's score owes to the passage alone. Some final scores depend on the whole candidate list:
the hybrid normalizes each component's scores over the request's passages (min-max, z-score or
ranks) and scores the first stage by position (n - i of n), as does the identity reranker. So the
contract has two steps: `score_parts(requests)` gives, per passage, what does not depend on the
other passages or requests (a model's score), and `combine(query, passages, parts)` turns the
parts of one whole request into its final scores. `score_batch` is `combine` of `score_parts` for
every request. A caller that splits a request scores parts piece by piece, in any grouping, and
combines each whole request exactly once: it then gets what `score_batch` of the whole request
gives. Most rerankers need nothing of this (a passage's part is its score, `combine` the identity:
`BaseReranker`'s defaults); one whose scores depend on the list derives from `CombiningReranker`
and says so with `combines_request`.

Besides scores, a reranker declares its capabilities: what a caller may use of it, typed, `None`
where it has none (`BaseReranker` gives those empty defaults, each reranker sets its own):

- `fast_tokenizer`: the Hugging Face fast tokenizer its model reads with (character offsets: the
  API cuts documents to `max_tokens_per_doc` tokens with it);
- `pair_token_limit`: the most tokens its model reads of one (query, passage) pair (the API caps
  a pair's estimated cost at it);
- `causal_lm`: its causal-LM engine (RAG context assembly and generation run on it);
- `prior_store`: where it keeps log p(K) (the API reports its hit rate);
- `passage_cache`: where it keeps passage embeddings by content (`cisrank.rerank.passage_cache`:
  a bi-encoder's; the API reports its hits, misses, evictions and bytes);
- `compute_type`: the number format its model computes in (`float32`, `bfloat16`, `int8`...,
  as the runtime names it: the API's TEI-shaped `/info` reports it as `model_dtype`);
- `runtime`: the runtime of the table its model runs on (`torch`, `onnx`, `ctranslate2`: what
  `--backend auto` chose, never `auto`; `/info` reports it as `model_runtime`, eval records it);
- `embedder`: the bi-encoder it scores with, as a `TextEmbedder` (the API's `/v1/embeddings`
  embeds with it; a cross-encoder or a causal LM has none);
- `processes`: the processes its model work runs on (1, or a worker pool's size: TEI's `/info`
  reports it as `tokenization_workers`);
- `passage_window`: what its model reads of one passage, as a `PassageWindow` (tokens, the fast
  tokenizer they are counted in, and whether the query's tokens come off them; None where it
  reads every passage whole): long documents are cut into windows of that many tokens
  (`cisrank.rerank.chunking`). A cross-encoder's is its pair limit less the pair's special
  tokens and the query, a bi-encoder's its sequence length less its special tokens and passage
  prefix, CIS's `max_doc_tokens` (the templated query is not cut, and a passage never is by the
  LM's context: the engine refuses a pair over it), the hybrid's its most constrained
  component's. It is declared, not computed per query, because a caller counts the query's
  tokens itself (the server, off the model thread, which owns the reranker's tokenizer).

Callers read these; they never probe a reranker for attributes. This module stays light (no torch
or transformers at import): the types are imported for type checkers only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from cisrank.data.types import RankedPassage, check_top_n, top_order
from cisrank.rerank.chunking import Chunking, PassageWindow, RankedList, rank_chunked
from cisrank.rerank.fields import render_all

if TYPE_CHECKING:
    import numpy as np
    from transformers import PreTrainedTokenizerFast

    from cisrank.lm.engine import CausalLMEngine
    from cisrank.rerank.passage_cache import EmbeddingCache
    from cisrank.rerank.prior_table import Priors

Request = tuple[str, Sequence[str]]

Part = Any
"""What `score_parts` gives for one passage: its score for most rerankers, a tuple of its
components' parts for the hybrid, None for the identity (which needs only positions). It must
pickle: parts come back from worker processes."""


def fast_only(tokenizer: Any) -> PreTrainedTokenizerFast | None:
    """`tokenizer` where it is a Hugging Face fast tokenizer (one that reports character
    offsets), else None: what a reranker declares as its `fast_tokenizer`."""
    return tokenizer if tokenizer is not None and getattr(tokenizer, "is_fast", False) else None


def ranked_texts(
    documents: Sequence[str] | Sequence[str | Mapping[str, Any]], rank_fields: Sequence[str] | None
) -> list[str]:
    """The texts `rank` ranks: the documents, or with `rank_fields` their fields' lines."""
    if rank_fields is not None:
        return render_all(documents, rank_fields)
    for i, d in enumerate(documents):
        if not isinstance(d, str):
            raise TypeError(f"documents[{i}] is a {type(d).__name__}: records need rank_fields")
    return [d for d in documents if isinstance(d, str)]


class TextEmbedder(Protocol):
    """A bi-encoder's embeddings of texts, as a reranker that has one declares them."""

    @property
    def dimensions(self) -> int | None:
        """The length of its vectors (None where the model does not say)."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length float32 embeddings of `texts`, one row each, with no prefix."""
        ...


@runtime_checkable
class Reranker(Protocol):
    """Scores passages against queries; higher means more relevant."""

    name: str
    model_name: str
    # True only for a reranker whose scores restate the input order (`IdentityReranker`):
    # callers may then skip it, as eval does, and report the first stage alone.
    keeps_order: bool

    # Capabilities (see the module docstring); None where the reranker has none.
    @property
    def fast_tokenizer(self) -> PreTrainedTokenizerFast | None:
        """The fast tokenizer the model reads with."""
        ...

    @property
    def pair_token_limit(self) -> int | None:
        """The most tokens the model reads of one (query, passage) pair."""
        ...

    @property
    def causal_lm(self) -> CausalLMEngine | None:
        """The causal-LM engine the reranker scores with."""
        ...

    @property
    def prior_store(self) -> Priors | None:
        """Where the reranker keeps log p(K)."""
        ...

    @property
    def passage_cache(self) -> EmbeddingCache | None:
        """Where the reranker keeps passage embeddings by content."""
        ...

    @property
    def compute_type(self) -> str | None:
        """The number format its model computes in, as its runtime names it."""
        ...

    @property
    def runtime(self) -> str | None:
        """The runtime its model runs on, as the runtime table names it."""
        ...

    @property
    def embedder(self) -> TextEmbedder | None:
        """The bi-encoder it scores with."""
        ...

    @property
    def processes(self) -> int:
        """The processes its model work runs on."""
        ...

    @property
    def passage_major(self) -> bool:
        """Whether scoring a passage's queries together saves work (a bi-encoder embeds the
        passage once; the reverse CIS estimator runs its context once): jobs that score a pool
        then group pairs by passage."""
        ...

    @property
    def combines_request(self) -> bool:
        """Whether a passage's final score depends on the other passages of its request (the
        hybrid's per-query normalization, the identity's positions): a caller that splits a
        request must then go through `score_parts` and `combine`, and a job that cuts a
        query's passages apart (passage-major shards) must not use `score_batch` on the
        pieces."""
        ...

    @property
    def passage_window(self) -> PassageWindow | None:
        """What the model reads of one passage (None: every passage whole)."""
        ...

    def score_batch(self, requests: Sequence[Request]) -> list[list[float]]:
        """One list of floats per (query, passages) request, in input order, one float per
        passage in input order: `combine` of `score_parts` for each request. A passage's score
        must not depend on the other requests."""
        ...

    def score_parts(self, requests: Sequence[Request]) -> list[list[Part]]:
        """One part per passage, in input order: what a passage's score owes to (query,
        passage) alone. It must not depend on the other passages or requests of the call, so
        a request may be scored in any slices, on any process, and its parts joined."""
        ...

    def combine(self, query: str, passages: Sequence[str], parts: Sequence[Part]) -> list[float]:
        """The final scores of one whole request from the parts of all its passages, in input
        order. No model work (it runs where a request's parts are gathered: the API's event
        loop, the process that dealt a batch to workers)."""
        ...

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One float per passage, in input order."""
        ...

    def rank(
        self,
        query: str,
        documents: Sequence[str] | Sequence[str | Mapping[str, Any]],
        top_n: int | None = None,
        *,
        chunking: Chunking | None = None,
        rank_fields: Sequence[str] | None = None,
    ) -> RankedList:
        """Documents most relevant first, at most `top_n` of them, each with its `index` in
        `documents`, its `score` and the `document`. With `chunking`, long documents are cut
        into windows and pooled (`cisrank.rerank.chunking`): each result carries its
        `best_chunk`, and the answer (a `RankedList`) the counts in `chunks`. With
        `rank_fields`, documents may be records (mappings, or strings holding JSON or YAML)
        and are ranked by those fields as `field: value` lines (`cisrank.rerank.fields`): the
        text ranked, and that `best_chunk` spans, is that rendering."""
        ...

    def close(self) -> None:
        """Release worker processes or other resources (`BaseReranker`: nothing to release)."""
        ...


class BaseReranker(ABC):
    """Derives `score` and `rank` from `score_batch`; subclasses only say how to score."""

    name: str = "base"
    model_name: str = ""
    keeps_order: bool = False
    # The capabilities a reranker without them declares; a reranker sets its own in __init__.
    fast_tokenizer: PreTrainedTokenizerFast | None = None
    pair_token_limit: int | None = None
    causal_lm: CausalLMEngine | None = None
    prior_store: Priors | None = None
    passage_cache: EmbeddingCache | None = None
    compute_type: str | None = None
    runtime: str | None = None
    embedder: TextEmbedder | None = None
    processes: int = 1
    passage_window: PassageWindow | None = None
    passage_major: bool = False
    combines_request: bool = False

    @abstractmethod
    def score_batch(self, requests: Sequence[Request]) -> list[list[float]]: ...

    def score_parts(self, requests: Sequence[Request]) -> list[list[Part]]:
        """A reranker whose scores depend on nothing but (query, passage): its scores."""
        return self.score_batch(requests)

    def combine(self, query: str, passages: Sequence[str], parts: Sequence[Part]) -> list[float]:
        return [float(p) for p in parts]

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        return self.score_batch([(query, passages)])[0]

    def rank(
        self,
        query: str,
        documents: Sequence[str] | Sequence[str | Mapping[str, Any]],
        top_n: int | None = None,
        *,
        chunking: Chunking | None = None,
        rank_fields: Sequence[str] | None = None,
    ) -> RankedList:
        if isinstance(documents, str):  # a str is a Sequence[str]: each character a document
            raise TypeError("documents must be a list of strings, not one string")
        texts = ranked_texts(documents, rank_fields)
        if chunking is not None:
            return rank_chunked(self, query, texts, top_n, chunking)
        check_top_n(top_n)  # before any model work
        scores = self.score(query, texts) if texts else []
        return RankedList(
            RankedPassage(i, float(scores[i]), texts[i]) for i in top_order(scores, top_n)
        )

    def close(self) -> None:  # noqa: B027 - a hook, deliberately empty by default
        """Release what the reranker holds beyond its memory (worker processes); a no-op for
        one that holds nothing more."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model_name!r})"


class CombiningReranker(BaseReranker):
    """A reranker whose final scores depend on the whole candidate list: it says what a passage
    owes to itself (`score_parts`) and how one request's parts become its scores (`combine`);
    `score_batch` is the one derived from them, so every caller that splits requests gets the
    scores of the whole."""

    combines_request = True

    @abstractmethod
    def score_parts(self, requests: Sequence[Request]) -> list[list[Part]]: ...

    @abstractmethod
    def combine(
        self, query: str, passages: Sequence[str], parts: Sequence[Part]
    ) -> list[float]: ...

    def score_batch(self, requests: Sequence[Request]) -> list[list[float]]:
        lists = [(q, list(ps)) for q, ps in requests]
        parts = self.score_parts(lists)
        return [
            self.combine(q, ps, p) if ps else [] for (q, ps), p in zip(lists, parts, strict=True)
        ]


class IdentityReranker(CombiningReranker):
    """No reranking (`--reranker none`): keeps the input order.

    Scores fall strictly with input position (n - i for n passages), so ranking by them gives the
    input order back; `keeps_order` tells callers that they may skip it altogether. A position is
    the request's, not a slice's: the parts are empty and `combine` numbers the whole list."""

    name = "none"
    model_name = ""
    keeps_order = True

    def __init__(self, model: str | None = None, *, config: Any = None, **options: Any) -> None:
        """The one constructor shape of the registry's kinds; there is no model, and the options
        the CLI passes to whichever reranker is chosen are ignored."""

    def score_parts(self, requests: Sequence[Request]) -> list[list[Part]]:
        return [[None] * len(p) for _, p in requests]

    def combine(self, query: str, passages: Sequence[str], parts: Sequence[Part]) -> list[float]:
        return [float(len(parts) - i) for i in range(len(parts))]
