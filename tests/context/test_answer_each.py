"""Prompts decoded side by side (`decode_rows`, `EnsembleDecoder.generate_each`, `answer_each`):
each row's every token is the float64 from-scratch argmax of its own prompt and tokens so far,
rows end on their own, and an answer is the one `answer_question` gives alone."""

from __future__ import annotations

import pytest
import torch
from context.helpers import QUESTION, passages
from context.test_decoding import reference_step

from cisrank.context import ArrangeConfig, ContextAssembler, answer_each, answer_question
from cisrank.context.decoding import EnsembleDecoder
from cisrank.errors import CisrankError

TOL = 1e-4
STEPS = 4


def _prompts():
    """Prompts of very different lengths (0 to 5 passages), so rows sit behind padding."""
    docs = passages(5)
    return [(QUESTION, docs[:k]) for k in (3, 0, 5, 1)] + [("who wrote hamlet ?", docs[1:3])]


def test_each_row_decodes_its_own_prompt_as_a_float64_recomputation(tiny):
    asm = ContextAssembler(tiny.engine, "qa")
    dec = EnsembleDecoder(asm)
    prompts = _prompts()
    got = dec.generate_each(prompts, max_new_tokens=STEPS, stop_at_eos=False)
    assert [len(g.tokens) for g in got] == [STEPS] * len(prompts)
    for (question, docs), gen in zip(prompts, got, strict=True):
        row = asm.render(question, docs).ids
        for t in range(STEPS):
            lp, _ = reference_step(tiny, [row], gen.tokens[:t], [])
            # the chosen token is the reference's best, up to float32 rounding
            assert float(lp[0].max() - lp[0, gen.tokens[t]]) <= TOL, (question, len(docs), t)
        alone = dec.generate(question, docs, "naive", max_new_tokens=STEPS, stop_at_eos=False)
        assert gen.tokens == alone.tokens and gen.text == alone.text
        assert [s.token for s in gen.steps] == gen.tokens


def test_a_row_that_stops_leaves_the_others_unchanged(tiny):
    asm = ContextAssembler(tiny.engine, "qa")
    rows = [asm.render(q, d).ids for q, d in _prompts()]
    state = tiny.engine.prefill_lockstep(rows, max_new_tokens=STEPS)

    def greedy(row: int, logits: torch.Tensor) -> int:
        return int(torch.argmax(logits))

    free = tiny.engine.decode_rows(state, greedy, STEPS)
    stop = next(t for t in range(1000) if all(t not in row for row in free))
    calls = [0] * len(rows)

    def row_2_ends_at_its_second_token(row: int, logits: torch.Tensor) -> int:
        calls[row] += 1
        return stop if row == 2 and calls[row] == 2 else greedy(row, logits)

    ended = tiny.engine.decode_rows(state, row_2_ends_at_its_second_token, STEPS, stop_ids=[stop])
    assert ended[2] == [free[2][0], stop] and calls[2] == 2  # not asked again once ended
    assert [b for r, b in enumerate(ended) if r != 2] == [a for r, a in enumerate(free) if r != 2]
    # the prefill is left as it was: decoding from it again gives the same
    assert tiny.engine.decode_rows(state, greedy, STEPS) == free


def test_answer_each_is_answer_question_for_every_item(tiny):
    dec = EnsembleDecoder(ContextAssembler(tiny.engine, "qa"), max_new_tokens=STEPS)
    items = _prompts()
    for arrange in ("reverse", "ranked", "edges"):
        setting = ArrangeConfig().replace(arrange=arrange)
        got = answer_each(dec, items, setting)
        for (question, docs), answer in zip(items, got, strict=True):
            # alone, a prompt without passages is answered closed-book, nothing to arrange
            alone = answer_question(dec, question, docs, setting if docs else ArrangeConfig())
            assert answer.order == alone.order, arrange
            assert [p.docid for p in answer.passages] == [p.docid for p in alone.passages]
            assert answer.generation.tokens == alone.generation.tokens, arrange
    assert got[1].order == [] and sorted(got[2].order) == [0, 1, 2, 3, 4]  # closed book; all 5


def test_answer_each_decodes_naive_answers_only(tiny):
    dec = EnsembleDecoder(ContextAssembler(tiny.engine, "qa"), decoding="leens")
    with pytest.raises(CisrankError, match="naive"):
        answer_each(dec, _prompts())
    assert EnsembleDecoder(ContextAssembler(tiny.engine, "qa")).generate_each([]) == []
