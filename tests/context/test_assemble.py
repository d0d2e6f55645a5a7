"""Gauges, rotations, shuffles and curvature against a brute-force float64 forward of each
rendered prompt, on tiny GPT-2 and Llama; arrangement orders checked by hand."""

from __future__ import annotations

import numpy as np
import pytest
from context.helpers import QUESTION, passages

from cisrank.context import (
    Arrangement,
    ContextAssembler,
    curvature_scores,
    edges_order,
    rotations,
    search_orders,
    shuffles,
)
from cisrank.errors import CisrankError

TOL = 1e-4


def brute_prompt(tiny, assembler, docs):
    """Render `docs` in order and score the question by brute force; also check the prompt's
    ids are the whole rendered text tokenized, and the span holds the question."""
    prompt = assembler.render(QUESTION, docs)
    if not assembler.chat:
        assert prompt.ids == tiny.prompt_ids(prompt.text)
    assert prompt.question == tiny.tokenizer(QUESTION, add_special_tokens=False)["input_ids"]
    return tiny.brute_mean(prompt.ids, prompt.span)


@pytest.mark.parametrize(
    "template",
    ["qa", "noise", "kv", "entropy", "Context:\n{documents}\n{note} Q: {question} A:"],
)
def test_gauge_and_pmi_match_brute_force(tiny, template):
    asm = ContextAssembler(tiny.engine, template, fields={"note": "read this"})
    docs = passages(4)
    prompt = asm.render(QUESTION, docs)
    got = asm.gauge(QUESTION, prompt, pmi=True)
    want = brute_prompt(tiny, asm, docs)
    want0 = brute_prompt(tiny, asm, [])
    assert got.num_tokens == prompt.span[1] - prompt.span[0] == 8
    assert abs(got.mean_logprob - want) <= TOL
    assert abs(got.logprob - want * got.num_tokens) <= TOL * got.num_tokens
    assert abs(got.mean_logprob_no_context - want0) <= TOL
    assert abs(got.pmi - (want - want0)) <= TOL


def test_rotation_scores_match_brute_force_and_best_is_chosen(tiny):
    asm = ContextAssembler(tiny.engine, "qa")
    docs = passages(5)
    res = asm.arrange(QUESTION, docs, "pmi_rotation")
    # the rotations written out by hand, not by `rotations()`
    by_hand = [docs[r:] + docs[:r] for r in range(5)]
    want = [brute_prompt(tiny, asm, d) for d in by_hand]
    got = [c.mean_logprob for c in res.candidates]
    assert [c.order for c in res.candidates] == [[(i + r) % 5 for i in range(5)] for r in range(5)]
    assert np.abs(np.array(got) - want).max() <= TOL
    best = int(np.argmax(want))
    assert res.order == res.candidates[best].order
    assert res.passages == by_hand[best]
    assert abs(res.gauge.mean_logprob - want[best]) <= TOL
    assert res.scores is None
    # positions change the score by more than twice the tolerance: the argmax is meaningful
    assert np.diff(np.sort(want)).min() > 2 * TOL


def test_curvature_equals_the_formula_over_rotations(tiny):
    asm = ContextAssembler(tiny.engine, "qa")
    docs = passages(5)
    res = asm.arrange(QUESTION, docs, "curvature")
    rots = [docs[r:] + docs[:r] for r in range(5)]
    ell = [brute_prompt(tiny, asm, d) for d in rots]
    # PMI gauge Eq. 15 / likelihood gauge ConvexScore: l(rotation, d first) + l(rotation, d last)
    want = []
    for d in docs:
        first = next(i for i, r in enumerate(rots) if r[0] == d)
        last = next(i for i, r in enumerate(rots) if r[-1] == d)
        want.append(ell[first] + ell[last])
    assert np.abs(np.array(res.scores) - want).max() <= TOL
    assert np.diff(np.sort(want)).min() > 2 * TOL
    assert res.order == sorted(range(5), key=lambda i: -want[i])
    assert res.passages == [docs[i] for i in res.order]
    assert abs(res.gauge.mean_logprob - brute_prompt(tiny, asm, res.passages)) <= TOL
    assert np.allclose(asm.curvature(QUESTION, docs), res.scores)
    # ConvexScore (likelihood gauge, Eq. 3) ranks the same under rotations: 2 (l_1 + l_K - middle)
    convex = []
    for d in docs:
        pos = [next(i for i, r in enumerate(rots) if r[p] == d) for p in range(5)]
        convex.append(2 * (ell[pos[0]] + ell[pos[-1]] - sum(ell[i] for i in pos[1:-1])))
    assert sorted(range(5), key=lambda i: -convex[i]) == res.order


@pytest.mark.parametrize("method", list(Arrangement))
def test_order_is_arrange_without_scoring_the_final_prompt(tiny, method):
    """`order` gives arrange's order, scores and candidates from the search's prompts alone;
    `arrange` scores the final prompt for its gauge on top (a prefill that a caller who only
    generates from the order, or reads the scores, must not pay)."""
    docs = passages(5)
    asm = ContextAssembler(tiny.engine, "qa")
    got = asm.order(QUESTION, docs, method, shuffles_n=3, seed=2)
    searched = {tuple(o) for o in search_orders(method, 5, 3, 2)}
    assert asm.scored_prompts == len(searched)
    want = ContextAssembler(tiny.engine, "qa").arrange(QUESTION, docs, method, shuffles_n=3, seed=2)
    assert got.method == method
    assert (got.order, got.scores, got.candidates) == (want.order, want.scores, want.candidates)
    asm.arrange(QUESTION, docs, method, shuffles_n=3, seed=2)
    assert asm.scored_prompts == len(searched | {tuple(want.order)})
    if method == "curvature":  # its order is no rotation here: arrange costs one prefill more
        assert tuple(want.order) not in searched


def test_likelihood_select_scores_the_input_and_seeded_shuffles(tiny):
    asm = ContextAssembler(tiny.engine, "qa")
    docs = passages(4)
    res = asm.arrange(QUESTION, docs, "likelihood_select", shuffles_n=4, seed=7)
    orders = [c.order for c in res.candidates]
    assert orders[0] == [0, 1, 2, 3] and len(orders) == 5
    assert orders == shuffles(4, 4, 7)
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
    want = [brute_prompt(tiny, asm, [docs[i] for i in o]) for o in orders]
    assert np.abs(np.array([c.mean_logprob for c in res.candidates]) - want).max() <= TOL
    assert res.order == orders[int(np.argmax(want))]
    again = asm.arrange(QUESTION, docs, "likelihood_select", shuffles_n=4, seed=7)
    assert [c.order for c in again.candidates] == orders
    other = asm.arrange(QUESTION, docs, "likelihood_select", shuffles_n=4, seed=8)
    assert [c.order for c in other.candidates] != orders
    default = asm.arrange(QUESTION, docs, "likelihood_select")
    assert len(default.candidates) == 4  # K prompts: the input order and K - 1 shuffles


def test_chat_template_gauge_matches_brute_force(tiny):
    tok = tiny.tokenizer
    saved = getattr(tok, "chat_template", None)
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </s>"
        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    try:
        asm = ContextAssembler(tiny.engine, "qa", chat=True)
        docs = passages(3)
        prompt = asm.render(QUESTION, docs)
        assert prompt.text.startswith("<bos><user> Write")
        assert prompt.text.endswith("Answer: </s><assistant>")
        assert prompt.ids == tiny.prompt_ids(prompt.text[len("<bos>") :])
        got = asm.gauge(QUESTION, prompt).mean_logprob
        assert abs(got - brute_prompt(tiny, asm, docs)) <= TOL
    finally:
        tok.chat_template = saved


def test_simple_orders_by_hand():
    assert rotations(3) == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert edges_order(1) == [0]
    assert edges_order(4) == [0, 2, 3, 1]
    assert edges_order(5) == [0, 2, 4, 3, 1]
    # passage 0 is first in rotation 0 and last in rotation 1; 2 first in r2, last in r0
    assert curvature_scores([1.0, 10.0, 100.0]) == [11.0, 110.0, 101.0]
    assert shuffles(3, 0, 0) == [[0, 1, 2]]


def test_ranked_reverse_edges_orders_and_prompts(tiny):
    asm = ContextAssembler(tiny.engine, "qa")
    docs = passages(5)
    for method, order in [
        ("ranked", [0, 1, 2, 3, 4]),
        ("reverse", [4, 3, 2, 1, 0]),
        ("edges", [0, 2, 4, 3, 1]),
    ]:
        res = asm.arrange(QUESTION, docs, method)
        assert res.order == order and res.passages == [docs[i] for i in order]
        assert res.scores is None and res.candidates == []
        lines = [ln for ln in res.prompt.text.splitlines() if ln.startswith("Document [")]
        assert lines == [
            f"Document [{n}](Title: {docs[i].title}) {docs[i].text}" for n, i in enumerate(order, 1)
        ]
        assert abs(res.gauge.mean_logprob - brute_prompt(tiny, asm, res.passages)) <= TOL


def test_bad_input_is_a_clear_error(tiny):
    asm = ContextAssembler(tiny.engine, "qa")
    with pytest.raises(CisrankError, match="no passages"):
        asm.arrange(QUESTION, [], "curvature")
    with pytest.raises(CisrankError, match="unknown arrangement"):
        asm.arrange(QUESTION, passages(2), "sideways")
    limit = tiny.engine.max_positions
    try:
        tiny.engine.max_positions = 60
        with pytest.raises(CisrankError, match=r"5 passages make a prompt of \d+ tokens, more"):
            asm.arrange(QUESTION, passages(5), "ranked")
    finally:
        tiny.engine.max_positions = limit
