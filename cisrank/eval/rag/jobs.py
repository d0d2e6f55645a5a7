"""The model work of `cisrank eval rag`, one job per model, run in this process or on a worker
per core (`cisrank.jobs.pool`: each worker loads the model once).

Work is dealt out by whole questions: a worker scores a chunk of questions with all their
candidates (`RankJob`; `PartsJob`, one side of CIS's model sums), or answers a chunk of prompts
(`AnswerJob`). So a reranker that fuses over the
candidate list (the hybrid) sees each list whole, whatever the number of workers, and the scores
are those one process gives (rerankers do not depend on the batch a query shares).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cisrank.data.types import Passage
from cisrank.jobs.pool import WorkerJob, WorkerOptions, run_local_shards, set_threads
from cisrank.rerank.base import Reranker
from cisrank.rerank.spec import RerankerSpec

Request = tuple[str, list[str]]


@dataclass(frozen=True)
class RankJob:
    """Scores chunks of (question, candidate texts) requests with one reranker."""

    spec: RerankerSpec
    threads: int = 1

    def load(self) -> Reranker:
        return self.spec.build(WorkerOptions(workers=1, threads_per_worker=self.threads))

    def score(self, reranker: Reranker, requests: list[Request]) -> tuple[list[list[float]], float]:
        """The scores of every request and the seconds they took."""
        started = time.perf_counter()
        scores = reranker.score_batch(requests)
        return [[float(s) for s in row] for row in scores], time.perf_counter() - started


@dataclass(frozen=True)
class PartsJob:
    """Computes one side of a CIS setting's model sums (`CISReranker.parts_batch`) over
    chunks of (question, candidate texts) requests."""

    spec: RerankerSpec
    side: str
    threads: int = 1

    def load(self) -> Reranker:
        return self.spec.build(WorkerOptions(workers=1, threads_per_worker=self.threads))

    def score(
        self, reranker: Any, requests: list[Request]
    ) -> tuple[list[list[dict[str, float]]], float]:
        """Every request's parts of this side and the seconds they took."""
        started = time.perf_counter()
        parts = reranker.parts_batch(requests, [self.side])
        return parts, time.perf_counter() - started


@dataclass(frozen=True)
class GeneratorSetting:
    """How the answers are generated: what the generation cache is keyed by."""

    generator: str
    template: str
    chat: bool | None
    """None: when the generator's tokenizer has a chat template (an instruct model)."""
    arrange: str
    max_new_tokens: int
    device: str | None = None
    dtype: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "generator": self.generator,
            "template": self.template,
            "chat": self.chat,
            "arrange": self.arrange,
            "max_new_tokens": self.max_new_tokens,
            "device": self.device,
            "dtype": self.dtype,
            "decoding": "naive greedy",
        }


@dataclass
class Answerer:
    """A loaded generator: the assembler (template, chat) and the greedy naive decoder."""

    decoder: Any
    arrange: Any
    chat: bool
    compute_type: str
    load_seconds: float


@dataclass(frozen=True)
class AnswerJob:
    """Answers chunks of (question, passages best first) prompts with one generator, greedy,
    the passages in each prompt as `setting.arrange` orders them (`answer_each`: a chunk's
    prompts are decoded side by side, each as `answer_question` answers it alone)."""

    setting: GeneratorSetting

    def load(self) -> Answerer:
        from cisrank.context import ArrangeConfig, ContextAssembler, EnsembleDecoder
        from cisrank.lm.engine import CausalLMEngine

        started = time.perf_counter()
        s = self.setting
        engine = CausalLMEngine(s.generator, device=s.device, dtype=s.dtype)
        chat = s.chat if s.chat is not None else bool(engine.tokenizer.chat_template)
        assembler = ContextAssembler(engine, s.template, chat=chat)
        decoder = EnsembleDecoder(assembler, max_new_tokens=s.max_new_tokens)
        arrange = ArrangeConfig().replace(arrange=s.arrange)
        elapsed = time.perf_counter() - started
        return Answerer(decoder, arrange, chat, str(engine.compute_type), elapsed)

    def score(
        self, state: Answerer, items: list[tuple[str, list[Passage]]]
    ) -> list[dict[str, Any]]:
        """The answer to each prompt of a chunk: its text, tokens, the order the passages
        were read in (indexes of the given passages) and its share of the chunk's seconds."""
        from cisrank.context import answer_each

        started = time.perf_counter()
        state.decoder.assembler.clear()
        answers = answer_each(state.decoder, items, state.arrange)
        each = (time.perf_counter() - started) / max(len(items), 1)
        return [
            {
                "answer": a.generation.text,
                "tokens": a.generation.tokens,
                "order": a.order,
                "seconds": each,
            }
            for a in answers
        ]


def run_items(
    job: WorkerJob,
    items: Sequence[Any],
    workers: WorkerOptions,
    on_done: Callable[[int, Any], None],
) -> None:
    """`job.score` of every item, in this process (one worker) or on a pool of workers; each
    result handed to `on_done(index, result)` as it completes (the caller stores it at once, so
    a run killed midway keeps what finished)."""
    if not items:
        return
    processes = min(workers.count, len(items))
    if processes <= 1:
        import torch

        before = torch.get_num_threads()
        set_threads(workers.threads_per_worker)
        try:
            state = job.load()
            for i, item in enumerate(items):
                on_done(i, job.score(state, item))
        finally:
            torch.set_num_threads(before)
        return
    run_local_shards(list(enumerate(items)), job, workers, on_done)
