"""`max_tokens_per_doc` for a reranker without a tokenizer: documents cut to N words.

A reranker with a fast tokenizer has its documents cut to N of its own tokens while they are
counted (`cisrank.serving.token_count`, at the character offset where token N ends, so the reranker
scores the exact prefix the user sent); one without falls back to whitespace-separated words as
tokens, here.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\S+")


def truncate_words(text: str, max_tokens: int) -> str:
    """The prefix of `text` ending with its `max_tokens`-th whitespace-separated word."""
    for i, m in enumerate(_WORD.finditer(text), 1):
        if i == max_tokens:
            return text[: m.end()]
    return text
