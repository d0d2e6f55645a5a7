"""Noise padding (Cuconasu et al. 2024, "The Power of Noise: Redefining Retrieval for RAG
Systems").

The paper adds random passages to the retrieved ones and finds that, placed far from the question,
they help accuracy (§5.4, Table 3: 4 retrieved + 15 random beats 4 retrieved alone by +35% with
Contriever). Its "RAG in practice" layout is [I, random..., retrieved in reverse score order, Q]:
the code (`MixedDocumentsDataset._mix_documents`, `put_retrieved_first=False`) builds
`random[:n_rand] + retrieved[:n_ret][::-1]`, so the top-1 passage sits next to the question.

Here noise comes from a pool of passages (a corpus file, a list) or is made of random words
(§5.4.2, Table 4, "random words"). Sampling is seeded (`random.Random(seed)`), and never yields a
passage twice: the pool is deduplicated by the SHA-256 of its text (as the paper's code removes
duplicates by hash), and passages whose text equals a retrieved one are excluded.

`pad_with_noise` only lays passages out: [noise..., arranged...]. With the retrieved passages
arranged `reverse` (best last) that is the paper's layout exactly.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from cisrank.data.types import Passage
from cisrank.errors import CisrankError

RANDOM_WORDS = "words"


def text_key(text: str) -> str:
    """The identity of a passage's text: SHA-256 of its whitespace-normalized form."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


def sample_noise(
    pool: Iterable[Passage], n: int, seed: int, exclude: Sequence[Passage] = ()
) -> list[Passage]:
    """`n` distinct passages drawn uniformly without replacement from `pool`, none with the text
    of a passage in `exclude` (the retrieved ones); reproducible by `seed`."""
    if n < 0:
        raise CisrankError(f"the number of noise passages must be >= 0, got {n}")
    seen = {text_key(p.text) for p in exclude}
    distinct: list[Passage] = []
    for p in pool:
        key = text_key(p.text)
        if key not in seen and p.text.strip():
            seen.add(key)
            distinct.append(p)
    if n > len(distinct):
        raise CisrankError(
            f"noise: {n} random passages asked for, but the pool holds only {len(distinct)} "
            "distinct passages not among the retrieved ones: lower --noise or give a bigger pool"
        )
    return random.Random(seed).sample(distinct, n)


class PassageStore(Protocol):
    """What noise needs of an index's document store (`cisrank.retrieval.docstore.DocStore`):
    its size and (docid, text) by row number."""

    def __len__(self) -> int: ...

    def get(self, indices: Sequence[int]) -> list[tuple[str, str]]: ...


def sample_store_noise(
    store: PassageStore, n: int, seed: int, exclude: Sequence[Passage] = ()
) -> list[Passage]:
    """`n` distinct passages drawn uniformly without replacement from the rows of an index's
    document store, none with the text of a passage in `exclude`; reproducible by `seed`.

    Rows are drawn in one seeded sample a little larger than `n` (duplicates and excluded texts
    are skipped), then, if that was not enough, from the rest of the store in the same seeded
    order: an index of millions of passages is never read whole for a few noise passages."""
    if n < 0:
        raise CisrankError(f"the number of noise passages must be >= 0, got {n}")
    size = len(store)
    rng = random.Random(seed)
    first = min(size, 2 * n + len(exclude) + 8)
    rows = rng.sample(range(size), first)
    seen = {text_key(p.text) for p in exclude}
    out: list[Passage] = []
    start = 0
    while len(out) < n and start < len(rows):
        batch = rows[start : start + max(first, 1)]
        start += len(batch)
        for docid, text in store.get(batch):
            key = text_key(text)
            if key in seen or not text.strip():
                continue
            seen.add(key)
            out.append(Passage(str(docid), text))
            if len(out) == n:
                break
        if len(out) < n and start == len(rows) and len(rows) < size:
            drawn = set(rows)
            rest = [i for i in range(size) if i not in drawn]
            rng.shuffle(rest)
            rows += rest
    if len(out) < n:
        raise CisrankError(
            f"noise: {n} random passages asked for, but the index holds only {len(out)} "
            "distinct passages not among the retrieved ones: ask for fewer"
        )
    return out


def vocabulary_words(tokenizer: Any, min_chars: int = 3) -> list[str]:
    """Whole alphabetic words of a tokenizer's vocabulary (sorted, so seeds reproduce), the
    material of random-word noise."""
    vocab = sorted(tokenizer.get_vocab())
    special = set(getattr(tokenizer, "all_special_tokens", []))
    words: set[str] = set()
    for tok in vocab:
        if tok in special:
            continue
        word = tokenizer.convert_tokens_to_string([tok]).strip()
        if len(word) >= min_chars and word.isalpha() and word.isascii():
            words.add(word.lower())
    return sorted(words)


def random_word_passages(
    words: Sequence[str], n: int, seed: int, length: int = 100, title_words: int = 2
) -> list[Passage]:
    """`n` passages of `length` words drawn at random from `words` (The Power of Noise, §5.4.2,
    Table 4, random words; 100 words as its DPR passages), each with a title of `title_words`
    random words; reproducible by `seed`, never two alike."""
    if n < 0:
        raise CisrankError(f"the number of noise passages must be >= 0, got {n}")
    if n and len(set(words)) < 2:
        raise CisrankError("random-word noise needs a vocabulary of at least 2 words")
    rng = random.Random(seed)
    out: list[Passage] = []
    seen: set[str] = set()
    for _ in range(100 * n + 100):
        if len(out) == n:
            return out
        title = " ".join(rng.choices(words, k=title_words)).title()
        text = " ".join(rng.choices(words, k=length))
        if (key := text_key(text)) in seen:
            continue
        seen.add(key)
        out.append(Passage(f"noise-{len(out)}", text, title))
    if len(out) < n:
        raise CisrankError(f"random-word noise: cannot make {n} distinct passages")
    return out


def pad_with_noise(arranged: Sequence[Passage], noise: Sequence[Passage]) -> list[Passage]:
    """The prompt's passage list with noise first: [noise..., arranged...] (The Power of Noise,
    §5.4, [I, random..., retrieved..., Q]; the paper's layout when `arranged` is the retrieved list
    reversed, best passage last)."""
    return [*noise, *arranged]
