"""`max_tokens_per_doc`: cut documents to N tokens of the reranker's own tokenizer.

The cut is made in the original text at the end offset of token N, so the reranker scores the
exact prefix the user sent (not a detokenized, lower-cased or re-spaced version of it). The
tokenizer is the one the reranker declares (`Reranker.fast_tokenizer`); rerankers without one fall
back to whitespace-separated words as tokens. Runs in the model's thread (`ModelThread.run`): a
Hugging Face fast tokenizer must not be used from two threads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_WORD = re.compile(r"\S+")


def truncate_words(text: str, max_tokens: int) -> str:
    """The prefix of `text` ending with its `max_tokens`-th whitespace-separated word."""
    for i, m in enumerate(_WORD.finditer(text), 1):
        if i == max_tokens:
            return text[: m.end()]
    return text


def truncate_texts(
    tokenizer: Any | None, texts: Sequence[str], max_tokens: int
) -> tuple[list[str], int]:
    """Each text cut to at most `max_tokens` tokens; returns (texts, how many were cut)."""
    if tokenizer is None:
        out = [truncate_words(t, max_tokens) for t in texts]
    else:
        enc = tokenizer(
            list(texts),
            add_special_tokens=False,
            return_offsets_mapping=True,
            truncation=False,
            verbose=False,
        )
        out = []
        for text, offsets in zip(texts, enc["offset_mapping"], strict=True):
            out.append(text[: offsets[max_tokens - 1][1]] if len(offsets) > max_tokens else text)
    return out, sum(a != b for a, b in zip(out, texts, strict=True))
