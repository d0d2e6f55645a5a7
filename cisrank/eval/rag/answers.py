"""Is a generated answer right? Accuracy, exact match and F1 against a question's gold answers.

The normalization is SQuAD's `normalize_answer` (Rajpurkar et al. 2016, the v1.1 evaluation
script), which the lost-in-the-middle and Power-of-Noise code also use for NQ-Open: lower case, no
punctuation, no articles (a, an, the), single spaces. Over the normalized texts:

- accuracy: any gold answer is a substring of the answer (lost in the middle's
  `best_subspan_em`; the "Acc" of the CIS paper, "whether the predicted answer contains the
  ground truth", its §5.1);
- exact match (EM): the answer equals a gold answer;
- F1: the harmonic mean of token precision and recall (bag of words) against the best gold
  answer (SQuAD's `f1_score`, maximized over the gold answers).

A gold answer that normalizes to nothing ("the") matches nothing. The answer is scored whole, as
generated (at most `max_new_tokens`), as `bench/rag_nq.py` scores it.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD's `normalize_answer`)."""
    text = text.lower().translate(_NO_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def has_answer(text: str, answers: Sequence[str], normalized: bool = False) -> bool:
    """Whether any normalized answer is a substring of the normalized text (`normalized`: the
    text is normalized already)."""
    norm = text if normalized else normalize_answer(text)
    return any((a := normalize_answer(ans)) and a in norm for ans in answers)


def exact_match(text: str, answers: Sequence[str]) -> bool:
    """Whether the normalized text equals a normalized gold answer (one that is not empty)."""
    norm = normalize_answer(text)
    return any((a := normalize_answer(ans)) and a == norm for ans in answers)


def f1(text: str, answers: Sequence[str]) -> float:
    """Token F1 of the text against its best gold answer (SQuAD's `f1_score`, max over golds)."""
    mine = normalize_answer(text).split()
    best = 0.0
    for ans in answers:
        gold = normalize_answer(ans).split()
        same = sum((Counter(mine) & Counter(gold)).values())
        if same:
            precision, recall = same / len(mine), same / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


@dataclass(frozen=True)
class Verdict:
    """How right one answer is: accuracy (a gold answer inside it), EM and F1."""

    accuracy: bool
    em: bool
    f1: float

    def to_json(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "em": self.em, "f1": self.f1}


def judge(text: str, answers: Sequence[str]) -> Verdict:
    """The verdict on `text` against the gold `answers`."""
    return Verdict(has_answer(text, answers), exact_match(text, answers), f1(text, answers))
