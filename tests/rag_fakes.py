"""Stand-ins for the models of `cisrank eval rag`, simple enough to compute its figures by hand:
a reranker that prefers longer passages, and a generator that answers with the titles of the
passages in its prompt, in prompt order (so the arrangement shows in the answer)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cisrank.context.config import ArrangeConfig, DecoderConfig
from cisrank.data.types import Passage
from cisrank.eval.rag.jobs import Answerer, AnswerJob
from cisrank.rerank.base import BaseReranker

CALLS: list[tuple[str, tuple[str, ...]]] = []
"""Every (query, passages) the word-count reranker scored, in this process."""
ANSWERED: list[tuple[str, tuple[str, ...]]] = []
"""Every (question, prompt titles) the title generator answered, in this process."""


class WordCountReranker(BaseReranker):
    """Scores a passage by its number of words (`\\w+`): longer first."""

    name = "words"
    model_name = "word-count"

    def score_batch(self, requests):
        out = []
        for query, passages in requests:
            CALLS.append((query, tuple(passages)))
            out.append([float(len(re.findall(r"\w+", p))) for p in passages])
        return out


def word_count_reranker(model: str | None = None, **options) -> WordCountReranker:
    """The `module:factory` of a rerankers file: `rag_fakes:word_count_reranker`."""
    return WordCountReranker()


class _FixedOrders:
    """The assembler's side of `answer_question` for the fixed arrangements (ranked, reverse,
    edges), which read no model: `ContextAssembler.order` itself."""

    def order(self, question: str, passages: Sequence[Passage], method, **search):
        from cisrank.context import ContextAssembler

        return ContextAssembler.order(self, question, passages, method, **search)  # type: ignore[arg-type]

    def clear(self) -> None:
        pass


class TitleDecoder:
    """Answers with the titles of its prompt's passages, in prompt order ("I do not know" with
    none): a naive greedy decoder as `answer_question` and `answer_each` drive it."""

    config = DecoderConfig()
    assembler = _FixedOrders()

    def generate(self, question: str, passages: Sequence[Passage], **options: Any) -> Any:
        from cisrank.context.config import Decoding
        from cisrank.context.decoding import Generation

        ANSWERED.append((question, tuple(p.title for p in passages)))
        text = " ".join(p.title for p in passages) or "I do not know"
        return Generation(Decoding.NAIVE, text, [], [])

    def generate_each(self, prompts: Sequence[tuple[str, Sequence[Passage]]]) -> list[Any]:
        """`generate` of each prompt, as `answer_each` drives it."""
        return [self.generate(question, passages) for question, passages in prompts]


def title_answerer(job: AnswerJob) -> Answerer:
    """`AnswerJob.load` with the title decoder instead of a language model."""
    arrange = ArrangeConfig().replace(arrange=job.setting.arrange)
    return Answerer(TitleDecoder(), arrange, chat=False, compute_type="none", load_seconds=0.0)
