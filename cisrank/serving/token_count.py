"""What a request costs, in its reranker's own tokens, before any model work (docs/reliability.md,
"Costs known before the work").

Why not characters / 4, as before: the model thread's time follows tokens, and tokens per
character vary 25-fold with the script. SmolLM2 reads English at about 0.16-0.25 tokens a
character, CJK at 2.7, emoji at 3 and characters from U+10000 up at 4 (one per UTF-8 byte).
Budgets estimated at a quarter of a token a character let a `/v1/context` of 800 such characters,
estimated like English that takes 3.5 s, hold the model thread 58.8 s.

So every text of a request is counted with the reranker's own tokenizer (`Reranker.fast_tokenizer`,
the causal LM's for context and generation), on a thread of its own, never the model thread
(the resource the counts protect) nor the event loop:

- a private copy of the tokenizer (`tokenizers.Tokenizer`, no truncation, no padding, no special
  tokens), since a fast tokenizer must not be used from two threads at once;
- in slices of at most `SLICE_CHARS` characters per call (0.05-0.3 s here), so a huge request
  shares the thread with small ones, and a hang-up or the deadline stops it between slices;
- a text that only matters up to a number of tokens (a pair capped at the model's length, a
  document cut to `max_tokens_per_doc`) is tokenized in a window of its start that grows until it
  holds that many and `WINDOW_MARGIN` more (the cut is made there, at the character offset of
  the last token kept): the work is bounded by the tokens used, not by the document's length;
- before counting, a lower bound of every text's tokens (below) refuses a request that is over
  its budget whatever the exact count, at about 10 ms per MB; while counting, the running total
  stops the count as soon as it passes the budget. Refusing costs at most the count of one
  budget's worth of tokens, linear in the request.

The lower bound: a token never spans two words (checked once per tokenizer, over its whole
vocabulary), so a text has at least as many tokens as runs of characters between ASCII
whitespace (and control characters, which normalizers drop); and no token is longer than the
vocabulary's longest, so a text has at least its characters over that many tokens. The first is
not used where the vocabulary has a token spanning two words, the second where the model has an
unknown token (WordPiece: a whole unknown word, however long, is one `[UNK]`).

A reranker without a fast tokenizer (a custom factory) is costed by an upper bound instead: the
text's UTF-8 bytes, exact for no tokenizer but never below the tokens of a byte-level BPE
(GPT-2, Llama 3, Qwen, SmolLM2: at most one token a byte), a byte-fallback SentencePiece or a
WordPiece (at most one a character); its documents are cut by words (`truncate_words`).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from cisrank.serving.truncate import truncate_words

T = TypeVar("T")

SLICE_CHARS = 1 << 18
"""Characters tokenized per call of the counting thread: 0.05-0.3 s on the CPUs measured."""

WINDOW_MARGIN = 16
"""Tokens a window holds past the last one used, so that the ones used are those of the whole
text: a BPE merge reaches across at most a few tokens of one word (pieces are split at word
boundaries before merging)."""

_WHITESPACE = bytes(0x20 if c < 0x21 or c == 0x7F else 0x78 for c in range(128)) + b"x" * 128
"""A translation table: ASCII whitespace and control characters (which normalizers drop) to
b" ", every other byte to b"x"."""


def utf8_bytes(text: str) -> int:
    """The UTF-8 bytes of `text` (at least 1): the cost of a text without a tokenizer."""
    return max(1, len(text.encode("utf-8", "surrogatepass")))


def word_runs(text: str) -> int:
    """Runs of characters between ASCII whitespace and control characters, at C speed (no list
    of words is built)."""
    marks = text.encode("utf-8", "surrogatepass").translate(_WHITESPACE)
    return marks.count(b" x") + (marks[:1] == b"x")


class CountCancelled(Exception):
    """The request's client hung up while its texts were counted."""


class OverBudget(Exception):
    """A request whose cost passes its budget: `cost` (a lower bound where `at_least`)."""

    def __init__(self, cost: int, budget: int, at_least: bool) -> None:
        super().__init__(f"{'at least ' if at_least else ''}{cost} tokens, over {budget}")
        self.cost = cost
        self.budget = budget
        self.at_least = at_least


@dataclass
class Measured:
    """The tokens of each text (at most the `limit` asked), and, where a cut was asked, the
    texts cut to that many tokens and how many were cut."""

    counts: list[int]
    texts: list[str]
    cut: int = 0


def _vocabulary_facts(tokenizer: Any) -> tuple[int | None, bool]:
    """(the longest token in characters, whether some token spans two words) of a
    `tokenizers.Tokenizer`, from the decoded text of every token of its vocabulary; no longest
    where the model has an unknown token (a whole unknown word of any length is one token)."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    longest, spans = 1, False
    for start in range(0, size, 8192):
        ids = [[i] for i in range(start, min(size, start + 8192))]
        for text in tokenizer.decode_batch(ids, skip_special_tokens=False):
            longest = max(longest, len(text))
            if not spans and len(text.split()) > 1:
                spans = True
    model = tokenizer.model
    if getattr(model, "unk_token", None) is not None or getattr(model, "unk_id", None) is not None:
        return None, spans
    return longest, spans


class TokenCounter:
    """Counts a reranker's request texts in its own tokens (see the module docstring)."""

    def __init__(self, tokenizer: Any | None, name: str) -> None:
        self.name = name
        self._tok: Any | None = None
        self.longest_token: int | None = None
        self._words_bound = False
        if tokenizer is not None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            tok.no_truncation()
            tok.no_padding()
            self._tok = tok
            self.longest_token, spans = _vocabulary_facts(tok)
            self._words_bound = not spans
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def exact(self) -> bool:
        """Whether counts are the model's tokens (else UTF-8 bytes, an upper bound)."""
        return self._tok is not None

    @property
    def unit(self) -> str:
        """What a count counts, for messages."""
        return "tokens" if self.exact else "tokens (UTF-8 bytes: the model declares no tokenizer)"

    # ------------------------------------------------------------------ in the counting thread

    def lower_bounds(self, texts: Sequence[str]) -> list[int]:
        """A lower bound of each text's tokens (see the module docstring), at C speed."""
        if self._tok is None:
            return [utf8_bytes(t) for t in texts]
        longest = self.longest_token
        out = []
        for text in texts:
            bound = math.ceil(len(text) / longest) if longest else 1
            if self._words_bound:
                bound = max(bound, word_runs(text))
            out.append(max(1, bound))
        return out

    def measure_slice(
        self, texts: Sequence[str], limit: int | None = None, cut: int | None = None
    ) -> Measured:
        """One slice: each text's tokens (at most `limit`), and each cut to `cut` tokens."""
        need = max(limit or 0, cut or 0) or None
        if cut is not None:  # a cut text has at most `cut` tokens
            limit = cut if limit is None else min(limit, cut)
        tok = self._tok
        if tok is None:
            out = [truncate_words(t, cut) for t in texts] if cut else list(texts)
            counts = [utf8_bytes(t) for t in out]
            if limit is not None:
                counts = [min(c, limit) for c in counts]
            return Measured(counts, out, sum(a != b for a, b in zip(out, texts, strict=True)))
        if need is None:
            encoded = tok.encode_batch_fast(list(texts), add_special_tokens=False)
            return Measured([max(1, len(e)) for e in encoded], list(texts))
        counts, out, n_cut = [], [], 0
        for text in texts:
            count, kept = self._windowed(text, need, cut)
            counts.append(max(1, min(count, limit) if limit is not None else count))
            n_cut += kept != text
            out.append(kept)
        return Measured(counts, out, n_cut)

    def _windowed(self, text: str, need: int, cut: int | None) -> tuple[int, str]:
        """(tokens of `text`, at least `need` + `WINDOW_MARGIN` where it has that many; `text`
        cut to `cut` tokens), tokenizing a growing window of its start."""
        assert self._tok is not None
        window = min(len(text), need * 8 + 256)
        while True:
            whole = window >= len(text)
            encoding = self._tok.encode(
                text[:window] if not whole else text, add_special_tokens=False
            )
            n = len(encoding)
            if whole or n >= need + WINDOW_MARGIN:
                if cut is not None and n > cut:
                    return n, text[: encoding.offsets[cut - 1][1]]
                return n, text
            window = min(len(text), window * 4)

    # ------------------------------------------------------------------ from the event loop

    def _thread(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    1, thread_name_prefix=f"cisrank-count-{self.name}"
                )
            return self._executor

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread(), fn, *args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the counting thread: other tokenizing work of a request (planning a
        long document's windows), off the event loop and the model thread."""
        return await self._run(fn, *args)

    async def measure(
        self,
        texts: Sequence[str],
        *,
        limit: int | None = None,
        cut: int | None = None,
        cost: Callable[[int, int], int] | None = None,
        budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Measured:
        """Every text's tokens (at most `limit`; texts cut to `cut` tokens where asked), in
        slices on the counting thread. With a `budget`, the request's cost (the sum over texts
        of `cost(i, tokens)`, default the tokens) is checked first against the lower bounds,
        then as the count goes: `OverBudget` as soon as it passes. `CountCancelled` once
        `cancel` is set."""
        cost = cost or _tokens
        if budget is not None:
            floors = await self._run(self.lower_bounds, texts)
            if limit is not None:
                floors = [min(f, limit) for f in floors]
            floor = sum(cost(i, f) for i, f in enumerate(floors))
            if floor > budget:  # without a tokenizer the bound is the cost itself
                raise OverBudget(floor, budget, at_least=self.exact)
        counts: list[int] = []
        out: list[str] = []
        n_cut = total = 0
        for part in _slices(texts, SLICE_CHARS):
            if cancel is not None and cancel.is_set():
                raise CountCancelled
            got = await self._run(self.measure_slice, texts[part.start : part.stop], limit, cut)
            for i, n in zip(part, got.counts, strict=True):
                total += cost(i, n)
            counts += got.counts
            out += got.texts
            n_cut += got.cut
            if budget is not None and total > budget:
                raise OverBudget(total, budget, at_least=part.stop < len(texts))
        return Measured(counts, out, n_cut)

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None


def _tokens(_: int, n: int) -> int:
    return n


def _slices(texts: Sequence[str], max_chars: int) -> list[range]:
    """Consecutive ranges of texts of at most `max_chars` characters in all (a longer text
    alone)."""
    out: list[range] = []
    start = used = 0
    for i, text in enumerate(texts):
        if i > start and used + len(text) > max_chars:
            out.append(range(start, i))
            start, used = i, 0
        used += len(text)
    if start < len(texts):
        out.append(range(start, len(texts)))
    return out
