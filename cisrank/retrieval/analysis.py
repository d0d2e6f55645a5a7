"""Lucene-like text analysis for the embedded BM25, so that bm25s and Lucene index the same terms.

It mirrors Anserini's `DefaultEnglishAnalyzer` (what pyserini uses for MS MARCO) as closely as a
regular expression can mirror Lucene's `StandardTokenizer` (Unicode UAX#29 word breaks):

1. tokens are runs of word characters; `.`, `'`, `’` and `:` join two letters ("u.s", "don't",
   "a:b"), `.`, `,`, `;`, `'` and `’` join two digits ("1,000", "3.14"), `_` joins anything ("foo_bar"); single characters
   are tokens; pictographic symbols such as `™` are one-character tokens (Lucene's emoji type),
2. a trailing possessive `'s` is removed (EnglishPossessiveFilter),
3. lowercase,
4. Lucene's default English stop set (33 words; `EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`),
5. Porter stemming (PyStemmer `porter`) with the two departures of Lucene's `PorterStemmer` (a port
   of Porter's own C code) that matter: words of one or two characters are not stemmed ("us",
   "vs"), and a final "logi" becomes "log" ("entomology" -> "entomolog").

Known differences to Lucene: tokens over 255 characters are not split; UAX#29 corner cases (a
letter next to a digit across a `.`, rare numeric symbols) may break differently.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from functools import cached_property

from cisrank.errors import CisrankError, require

LUCENE_STOPWORDS: frozenset[str] = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    ]
)

_PICTO = (
    "\u00a9\u00ae\u203c\u2049\u2122\u2139\u2194-\u2199\u21a9\u21aa\u231a\u231b\u2328\u23cf"
    "\u23e9-\u23f3\u23f8-\u23fa\u24c2\u25aa\u25ab\u25b6\u25c0\u25fb-\u25fe\u2600-\u27bf"
    "\u2934\u2935\u2b05-\u2b07\u2b1b\u2b1c\u2b50\u2b55\u3030\u303d\u3297\u3299"
    "\U0001f000-\U0001faff"
)
_LETTER = r"[^\W\d_]"
_TOKEN_RE = re.compile(
    rf"\w+(?:(?:(?<={_LETTER})[.'\u2019:\u00b7](?={_LETTER})|(?<=\d)[.,;'\u2019](?=\d))\w+)*"
    rf"|[{_PICTO}]",
    re.UNICODE,
)
# Numeric symbols that Python's \w accepts but UAX#29 does not (superscripts, vulgar fractions).
_NOT_WORD = str.maketrans({c: " " for c in "\u00b2\u00b3\u00b9\u00bc\u00bd\u00be"})
_POSSESSIVE = ("'s", "\u2019s", "\uff07s")
STEMMERS = ("porter", "english", "none")


@dataclass(frozen=True)
class AnalyzerConfig:
    """What the manifest records, so that queries are analyzed exactly as the corpus was."""

    lowercase: bool = True
    stopwords: str = "lucene"  # "lucene" or "none"
    stemmer: str = "porter"  # "porter" (Lucene's), "english" (Snowball porter2), "none"

    def to_json(self) -> dict:
        return asdict(self)


def _measure(stem: str) -> int:
    """Porter's m: the number of vowel-consonant sequences (y is a vowel after a consonant)."""
    m, prev_vowel = 0, False
    for i, ch in enumerate(stem):
        vowel = ch in "aeiou" or (ch == "y" and i > 0 and not prev_vowel)
        if prev_vowel and not vowel:
            m += 1
        prev_vowel = vowel
    return m


def _lucene_porter_fix(word: str, stem: str) -> str:
    """Apply Lucene's PorterStemmer departures to a Snowball-porter stem (see module doc)."""
    if len(word) <= 2:
        return word
    if stem.endswith("logi") and _measure(stem[:-4]) > 0:  # step 2: logi -> log
        return stem[:-1]
    if stem.endswith("bli") and not stem.endswith("abli") and _measure(stem[:-3]) > 0:
        base = stem[:-3]  # step 2: bli -> ble, then steps 4 (ible) and 5 (final e)
        if base.endswith("i") and _measure(base[:-1]) > 1:
            return base[:-1]
        return base + "bl" if _measure(base + "bl") > 1 else base + "ble"
    return stem


class Analyzer:
    """Turns text into index terms (`analyze`), the same way at index and at query time."""

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config or AnalyzerConfig()
        if self.config.stopwords not in ("lucene", "none"):
            raise CisrankError(f"unknown stop word set '{self.config.stopwords}': lucene or none")
        if self.config.stemmer not in STEMMERS:
            raise CisrankError(f"unknown stemmer '{self.config.stemmer}': one of {STEMMERS}")
        self._stop = LUCENE_STOPWORDS if self.config.stopwords == "lucene" else frozenset()

    @cached_property
    def _stem(self):
        if self.config.stemmer == "none":
            return None
        stemmer_mod = require("Stemmer", "dense", "Porter stemming for BM25 (PyStemmer)")
        return stemmer_mod.Stemmer(self.config.stemmer).stemWords

    def analyze(self, text: str) -> list[str]:
        terms = []
        for tok in _TOKEN_RE.findall(text.translate(_NOT_WORD)):
            if not tok.strip("_"):
                continue  # a run of underscores is no word to UAX#29
            if tok.endswith(_POSSESSIVE) and len(tok) > 2:
                tok = tok[:-2]
            if self.config.lowercase:
                tok = tok.lower()
            if tok not in self._stop:
                terms.append(tok)
        stem = self._stem
        if stem is None or not terms:
            return terms
        stemmed = stem(terms)
        if self.config.stemmer == "porter":
            stemmed = [_lucene_porter_fix(t, s) for t, s in zip(terms, stemmed, strict=True)]
        return stemmed
