"""Answering a question over passages: order -> reorder -> generate, as `cisrank generate` and
`/v1/generate` do it.

A naive decoding reads every passage in one prompt, so their order matters: the arrangement
orders them first (`ContextAssembler.order`: the search's prefills and no gauge of the result,
which generation would not read). The document-parallel decodings read each passage in a prompt
of its own, so they keep the input order. The reranker scores (`replug`'s weights) and the
attribution follow the passages into the order the prompt has them in.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cisrank.context.config import ArrangeConfig, Arrangement, Decoding
from cisrank.context.decoding import EnsembleDecoder, Generation
from cisrank.data.types import Passage
from cisrank.errors import CisrankError


@dataclass(frozen=True)
class Answer:
    """A generation and the order it read the passages in: `order` (input indices in prompt
    order), the `passages` and their `scores` (or None) in that order, and the `generation`,
    whose attribution indexes `passages`."""

    order: list[int]
    passages: list[Passage]
    scores: list[float] | None
    generation: Generation

    def to_json(self) -> dict[str, Any]:
        """`order`, then the generation's fields, its attribution by passage id."""
        return {"order": self.order, **self.generation.to_json(self.passages)}


def answer_question(
    decoder: EnsembleDecoder,
    question: str,
    passages: Sequence[Passage],
    arrangement: ArrangeConfig | None = None,
    *,
    scores: Sequence[float] | None = None,
    deadline: float | None = None,
    cancel: threading.Event | None = None,
) -> Answer:
    """Order `passages` (best first) by `arrangement` when the decoder's decoding is naive,
    reorder them and their `scores` (one reranker score per passage, or None), and generate
    with `decoder` (its config's decoding and `max_new_tokens`; `deadline` and `cancel` as
    `EnsembleDecoder.generate`)."""
    passages = list(passages)
    order = _order(decoder, question, passages, arrangement or ArrangeConfig())
    ordered = [passages[i] for i in order]
    ordered_scores = [scores[i] for i in order] if scores is not None else None
    generation = decoder.generate(
        question, ordered, scores=ordered_scores, deadline=deadline, cancel=cancel
    )
    return Answer(order, ordered, ordered_scores, generation)


def answer_each(
    decoder: EnsembleDecoder,
    items: Sequence[tuple[str, Sequence[Passage]]],
    arrangement: ArrangeConfig | None = None,
) -> list[Answer]:
    """`answer_question` of each (question, passages best first) item by naive decoding, the
    prompts decoded side by side (`EnsembleDecoder.generate_each`); an item without passages is
    answered closed-book."""
    if decoder.config.decoding is not Decoding.NAIVE:
        raise CisrankError(
            f"answers decoded side by side are naive ones; {decoder.config.decoding} reads "
            "each passage in a prompt of its own: answer_question answers one question"
        )
    settings = arrangement or ArrangeConfig()
    orders = [_order(decoder, q, list(ps), settings) if ps else [] for q, ps in items]
    ordered = [[ps[i] for i in o] for (_, ps), o in zip(items, orders, strict=True)]
    generations = decoder.generate_each(
        [(q, ps) for (q, _), ps in zip(items, ordered, strict=True)]
    )
    return [Answer(o, ps, None, g) for o, ps, g in zip(orders, ordered, generations, strict=True)]


def _order(
    decoder: EnsembleDecoder, question: str, passages: list[Passage], settings: ArrangeConfig
) -> list[int]:
    """The prompt order of `passages` (input indices): the arrangement's for a naive decoding,
    the input order for the document-parallel ones and for `ranked`."""
    if decoder.config.decoding is not Decoding.NAIVE or settings.arrange is Arrangement.RANKED:
        return list(range(len(passages)))
    return decoder.assembler.order(
        question, passages, settings.arrange, shuffles_n=settings.shuffles, seed=settings.seed
    ).order
