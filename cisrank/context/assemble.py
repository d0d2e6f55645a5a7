"""Assembling a RAG context: arrange a query's top-K passages, pad with noise, render, gauge.

Every likelihood here is the *question likelihood* of "Likelihood as a Performance Gauge for
Retrieval-Augmented Generation" (Liu et al.; §4.1 there): the mean per-token log-probability of
the question span given the prompt before it,

    l(c) = (1 / |q|) * sum_{n = q_start}^{q_end} log p_LM(w_n | w_<n)

where c is the instruction followed by the ordered passages. "Pointwise Mutual Information as a
Performance Gauge for Retrieval-Augmented Generation" (the same authors) calls it PMI(q, c) =
log p(q | c) - log p(q) (its Eq. 3): for one question p(q) does not depend on the order, so every
arrangement below ranks by l(c) alone. It runs through the one causal-LM engine
(`CausalLMEngine.score_spans`: one (context, question) row per prompt, the LM head only at the
question's positions), so K prompts cost K prefill passes and nothing else.

Arrangements of the top-K passages (`Arrangement`; input order = the reranker's, best first):

- `ranked`: as given; `reverse`: best last, next to the question (the "near" placement of "The
  Power of Noise: Redefining Retrieval for RAG Systems", §5.2); `edges`: best at both ends,
  alternating inward (1st, 3rd, 5th, ..., 6th, 4th, 2nd);
- `pmi_rotation` (Pointwise Mutual Information as a Performance Gauge, Method 1, Eq. 10-11): the K
  rotations pi_k(i) = (i + k - 1) mod K of the input order (its Eq. 7); the one with the highest l
  is chosen, k* = argmax_k l(c(pi_k));
- `likelihood_select` (Likelihood as a Performance Gauge, Method 1, §5.1): the input order and n
  random shuffles (seeded); the one with the highest l is chosen;
- `curvature` (Pointwise Mutual Information as a Performance Gauge, Method 2, §4.2, Eq. 12-15;
  Likelihood as a Performance Gauge, ConvexScore, §5.2.2, Eq. 3, under rotations): per passage d,
  score(d) = l(rotation where d is first) + l(rotation where d is last); passages are sorted by
  it, descending, best first. Under the rotation design d_j is first in rotation j and last in
  rotation j+1 (mod K), and ConvexScore_d = 2 (2 (l_{d,1} + l_{d,K}) - S), with S = sum_i l_{d,i}
  the same for every d (each rotation counts once for every passage), ranks the same. The score
  is returned per passage: a position-aware listwise relevance signal.

The gauge of the final prompt (both gauge papers: an answer-free confidence signal) comes with
every assembled context: l(c), and on request PMI = l(c) - l(c0), where c0 is the same prompt with
no passages (the template's own tokens held fixed; a choice, stated: the PMI paper's p(q) is the
prefix probability of q, which the instruction and "Question:" label make ill-defined for a
templated prompt).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from cisrank.context.config import ArrangeConfig, Arrangement, AssemblerConfig
from cisrank.context.noise import pad_with_noise
from cisrank.context.templates import ContextTemplate, chat_wrap, resolve_template
from cisrank.data.types import Passage
from cisrank.errors import CisrankError
from cisrank.lm.engine import CausalLMEngine


# ---------------------------------------------------------------------------- orders
def rotations(k: int) -> list[list[int]]:
    """The K rotations of the input order: rotation r puts passage r first (Pointwise Mutual
    Information as a Performance Gauge, Eq. 7: pi_{r+1}(i) = (i + r) mod K)."""
    return [[(i + r) % k for i in range(k)] for r in range(k)]


def edges_order(k: int) -> list[int]:
    """Best at both ends, alternating inward: ranks 0, 2, 4, ... from the front and 1, 3, 5, ...
    from the back (the weakest in the middle, where the U-shape is lowest)."""
    front = list(range(0, k, 2))
    back = list(range(1, k, 2))
    return front + back[::-1]


def shuffles(k: int, n: int, seed: int) -> list[list[int]]:
    """The input order followed by `n` random shuffles from `random.Random(seed)` (Likelihood as
    a Performance Gauge, §4.3.2 and §5.1: the first prompt is the unshuffled one)."""
    if n < 0:
        raise CisrankError(f"the number of shuffles must be >= 0, got {n}")
    rng = random.Random(seed)
    out = [list(range(k))]
    for _ in range(n):
        order = list(range(k))
        rng.shuffle(order)
        out.append(order)
    return out


def curvature_scores(rotation_scores: Sequence[float]) -> list[float]:
    """Per passage j: l(rotation j, where j is first) + l(rotation j+1 mod K, where j is last)
    (Pointwise Mutual Information as a Performance Gauge, Eq. 15, as its code and the ConvexScore
    of Likelihood as a Performance Gauge, Eq. 3, apply it)."""
    k = len(rotation_scores)
    return [float(rotation_scores[j]) + float(rotation_scores[(j + 1) % k]) for j in range(k)]


def _settings(
    method: Arrangement | str | None, shuffles_n: int | None, seed: int | None
) -> ArrangeConfig:
    """The arrangement settings of a call: `ArrangeConfig`'s defaults where an argument is None
    (an unknown method is an error naming the valid ones)."""
    return ArrangeConfig().replace(arrange=method, shuffles=shuffles_n, seed=seed)


def search_orders(
    method: Arrangement | str, k: int, shuffles_n: int | None = None, seed: int | None = None
) -> list[list[int]]:
    """The orders a scored arrangement evaluates, one prompt each: the K rotations
    (`pmi_rotation`, `curvature`) or the input order and `shuffles_n` shuffles
    (`likelihood_select`, default K - 1); none for the fixed arrangements."""
    settings = _settings(method, shuffles_n, seed)
    if not settings.arrange.scored:
        return []
    if settings.arrange is Arrangement.LIKELIHOOD_SELECT:
        n = k - 1 if settings.shuffles is None else settings.shuffles
        return shuffles(k, n, settings.seed)
    return rotations(k)


def sort_desc(scores: Sequence[float]) -> list[int]:
    """Indices by score, highest first; ties keep input order."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Prompt:
    """A rendered prompt: its text, its ids (`[BOS] + T(before) + T(question) + T(after)`) and
    the question's token span `[start, end)` in the ids. The text is what follows BOS (with a
    chat template, it starts with the BOS text, as the template renders it)."""

    text: str
    ids: list[int]
    span: tuple[int, int]

    @property
    def context(self) -> list[int]:
        return self.ids[: self.span[0]]

    @property
    def question(self) -> list[int]:
        return self.ids[self.span[0] : self.span[1]]


@dataclass(frozen=True)
class Gauge:
    """Question likelihood of a prompt: mean and summed log p(q | prompt before it), and on
    request PMI = mean - mean with no passages."""

    mean_logprob: float
    logprob: float
    num_tokens: int
    pmi: float | None = None
    mean_logprob_no_context: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mean_logprob": self.mean_logprob,
            "logprob": self.logprob,
            "num_tokens": self.num_tokens,
        }
        if self.pmi is not None:
            out["pmi"] = self.pmi
            out["mean_logprob_no_context"] = self.mean_logprob_no_context
        return out


@dataclass(frozen=True)
class Candidate:
    """One scored prompt of a search (a rotation or a shuffle): its order and its l."""

    order: list[int]
    mean_logprob: float


@dataclass(frozen=True)
class Ordering:
    """An order of the input passages and what chose it: `order` (input indices in prompt order),
    per-passage `scores` (curvature) or None, and the scored `candidates` (rotations, shuffles) or
    empty. What `ContextAssembler.order` returns: no prompt is rendered or gauged for it."""

    method: Arrangement
    order: list[int]
    scores: list[float] | None
    candidates: list[Candidate]


@dataclass(frozen=True)
class AssembledContext:
    """An arranged context: `order` (indices of the input passages in prompt order), per-passage
    `scores` (curvature) or None, the scored `candidates` (rotations, shuffles) or empty, the
    final `passages` (noise first, if any) and `noise` count, the `prompt` and its `gauge`."""

    method: Arrangement
    order: list[int]
    scores: list[float] | None
    candidates: list[Candidate]
    passages: list[Passage]
    noise: int
    prompt: Prompt
    gauge: Gauge
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "arrange": self.method,
            "order": self.order,
            "ids": [p.docid for p in self.passages],
            "noise": self.noise,
            "scores": self.scores,
            "candidates": [
                {"order": c.order, "mean_logprob": c.mean_logprob} for c in self.candidates
            ],
            "gauge": self.gauge.to_json(),
            "prompt": self.prompt.text,
            "prompt_tokens": len(self.prompt.ids),
            **self.extra,
        }


# ---------------------------------------------------------------------------- assembler
class SearchOptions(TypedDict, total=False):
    """How `ContextAssembler.order` searches a scored arrangement, as `arrange` passes it on:
    `shuffles_n` random shuffles (likelihood_select), drawn with `seed`; None: the defaults."""

    shuffles_n: int | None
    seed: int | None


class ContextAssembler:
    """Render, gauge and arrange RAG contexts with one causal LM.

    Args:
        engine: the causal-LM engine (or a model name/folder, loaded with `engine_options`).
        template: a named template (qa, noise, kv, entropy), a custom string with `{documents}`
            and `{question}`, or a `ContextTemplate`.
        fields: values of the template's other named fields.
        document: the passage format (default the template's).
        chat: wrap the prompt in the tokenizer's chat template (user turn, assistant opened).
        config: the settings these arguments override where given (default `AssemblerConfig`).
    """

    def __init__(
        self,
        engine: CausalLMEngine | str,
        template: str | ContextTemplate | None = None,
        *,
        fields: Mapping[str, str] | None = None,
        document: str | None = None,
        chat: bool | None = None,
        config: AssemblerConfig | None = None,
        **engine_options: Any,
    ) -> None:
        settings = (config or AssemblerConfig()).replace(
            template=template if isinstance(template, str) else None,
            fields=fields,
            document=document,
            chat=chat,
        )
        self.template = resolve_template(
            template if isinstance(template, ContextTemplate) else settings.template,
            settings.fields,
            settings.document,
        )
        self.engine = (
            engine
            if isinstance(engine, CausalLMEngine)
            else CausalLMEngine(engine, **engine_options)
        )
        self.chat = settings.chat
        if self.chat:  # fail at construction, not at the first prompt
            chat_wrap(self.engine.tokenizer, "", "q", "")
        self._memo: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, int]] = {}

    # ------------------------------------------------------------------ prompts
    def render(
        self,
        question: str,
        passages: Sequence[Passage],
        template: ContextTemplate | None = None,
    ) -> Prompt:
        """The prompt for `passages` in the given order (by this assembler's template, or
        `template`), with the question span located."""
        if not question.strip():
            raise CisrankError("the question is empty")
        before, q, after = (template or self.template).render(question, passages)
        if self.chat:
            before, q, after = chat_wrap(self.engine.tokenizer, before, q, after)
        head = [self.engine.bos_id, *self.engine.encode(before)]
        q_ids = self.engine.encode(q)
        if not q_ids:
            raise CisrankError(f"the question {question!r} has no tokens")
        ids = [*head, *q_ids, *self.engine.encode(after)]
        limit = self.engine.max_positions
        if limit is not None and len(ids) > limit:
            raise CisrankError(
                f"{len(passages)} passages make a prompt of {len(ids)} tokens, more than the "
                f"context of '{self.engine.model_name}' ({limit} tokens): pass fewer passages "
                "(a smaller K or --noise) or shorter ones"
            )
        text = (self.engine.tokenizer.bos_token or "") if self.chat else ""
        return Prompt(text + before + q + after, ids, (len(head), len(head) + len(q_ids)))

    def question_logprobs(self, prompts: Sequence[Prompt]) -> list[tuple[float, int]]:
        """(summed log p(question | prompt before it), question tokens) of each prompt, in one
        engine call; prompts already scored by this assembler are not scored again."""
        keys = [(tuple(p.context), tuple(p.question)) for p in prompts]
        todo = list(dict.fromkeys(k for k in keys if k not in self._memo))
        if todo:
            got = self.engine.score_spans(todo)
            for key, lp, n in zip(todo, got.logprobs, got.num_tokens, strict=True):
                self._memo[key] = (lp, n)
        return [self._memo[k] for k in keys]

    def mean_logprobs(self, prompts: Sequence[Prompt]) -> list[float]:
        """l(c) of each prompt: the mean per-token log p(question | prompt before it)."""
        return [lp / n for lp, n in self.question_logprobs(prompts)]

    def gauge(self, question: str, prompt: Prompt, pmi: bool = False) -> Gauge:
        """The question likelihood of a final prompt, and on request its PMI against the same
        template with no passages (Pointwise Mutual Information as a Performance Gauge, Eq. 3,
        per token)."""
        todo = [prompt]
        if pmi:
            todo.append(self.render(question, []))
        scored = self.question_logprobs(todo)
        lp, n = scored[0]
        if not pmi:
            return Gauge(lp / n, lp, n)
        lp0, n0 = scored[1]
        return Gauge(lp / n, lp, n, lp / n - lp0 / n0, lp0 / n0)

    @property
    def scored_prompts(self) -> int:
        """Distinct prompts this assembler has scored (since `clear`)."""
        return len(self._memo)

    def clear(self) -> None:
        """Forget the scored prompts (the memo grows with every distinct prompt)."""
        self._memo.clear()

    # ------------------------------------------------------------------ arrangements
    def order(
        self,
        question: str,
        passages: Sequence[Passage],
        method: Arrangement | str | None = None,
        *,
        shuffles_n: int | None = None,
        seed: int | None = None,
    ) -> Ordering:
        """The order `method` gives `passages` (best first), without the final prompt; None
        arguments take `ArrangeConfig`'s defaults.

        A scored method costs its search's prefills (K rotations, or the input order and
        `shuffles_n` shuffles) and nothing more. `arrange` adds the final prompt and its gauge,
        one more prefill when the chosen order is not among the scored ones (curvature's usually
        is not); a caller that only generates from the order (`answer_question`) or reads the
        scores would pay it for nothing.
        """
        settings = _settings(method, shuffles_n, seed)
        method = settings.arrange
        k = len(passages)
        if k == 0:
            raise CisrankError("no passages to arrange: give at least one")
        if method is Arrangement.RANKED:
            return Ordering(method, list(range(k)), None, [])
        if method is Arrangement.REVERSE:
            return Ordering(method, list(range(k))[::-1], None, [])
        if method is Arrangement.EDGES:
            return Ordering(method, edges_order(k), None, [])
        orders = search_orders(method, k, settings.shuffles, settings.seed)
        ls = self.mean_logprobs(self.search_prompts(question, passages, orders))
        candidates = [Candidate(o, s) for o, s in zip(orders, ls, strict=True)]
        if method is Arrangement.CURVATURE:
            scores = curvature_scores(ls)
            return Ordering(method, sort_desc(scores), scores, candidates)
        return Ordering(method, orders[sort_desc(ls)[0]], None, candidates)

    def arrange(
        self,
        question: str,
        passages: Sequence[Passage],
        method: Arrangement | str | None = None,
        *,
        noise: Sequence[Passage] = (),
        pmi: bool = False,
        **search: Unpack[SearchOptions],
    ) -> AssembledContext:
        """Arrange `passages` (best first) by `method`, put `noise` before them, render and gauge.

        The scored methods search over orders of the retrieved passages alone; the noise
        passages, if any, go first in the final prompt ([I, noise..., arranged..., Q]).
        `search` is `order`'s: `shuffles_n`, the number of random shuffles of
        `likelihood_select` (default K - 1, so K prompts as the paper's code), drawn with `seed`.
        """
        passages = list(passages)
        chosen = self.order(question, passages, method, **search)
        final = pad_with_noise([passages[i] for i in chosen.order], noise)
        prompt = self.render(question, final)
        return AssembledContext(
            method=chosen.method,
            order=chosen.order,
            scores=chosen.scores,
            candidates=chosen.candidates,
            passages=final,
            noise=len(noise),
            prompt=prompt,
            gauge=self.gauge(question, prompt, pmi=pmi),
        )

    def search_prompts(
        self, question: str, passages: Sequence[Passage], orders: Sequence[Sequence[int]]
    ) -> list[Prompt]:
        """The prompt of each order of `passages` (see `search_orders`). Scoring them first
        (`question_logprobs`, in slices if wanted) leaves `order` nothing to score and
        `arrange` only the final prompt: their search finds them in this assembler's memo."""
        return [self.render(question, [passages[i] for i in o]) for o in orders]

    def curvature(self, question: str, passages: Sequence[Passage]) -> list[float]:
        """The per-passage curvature score alone (K prefill passes): a position-aware listwise
        relevance signal, higher = more likely the passage the question needs."""
        if not passages:
            raise CisrankError("no passages to score: give at least one")
        scores = self.order(question, passages, Arrangement.CURVATURE).scores
        assert scores is not None  # curvature always scores its passages
        return scores
