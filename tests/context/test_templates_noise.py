"""Templates as data (named, custom, their errors) and seeded noise padding (The Power of Noise)."""

from __future__ import annotations

import pytest
from context.helpers import QUESTION, passages

from cisrank.context import (
    TEMPLATES,
    ContextAssembler,
    ContextTemplate,
    pad_with_noise,
    random_word_passages,
    resolve_template,
    sample_noise,
)
from cisrank.context.noise import vocabulary_words
from cisrank.data.types import Passage
from cisrank.errors import CisrankError


def test_named_templates_render_the_papers_prompts():
    docs = [Passage("a", "Text one.", "T1"), Passage("b", "Text two.", "T2")]
    before, q, after = TEMPLATES["qa"].render("who?", docs)
    assert before + q + after == (
        "Write a high-quality answer for the given question using only the provided search "
        "results (some of which might be irrelevant).\n\n"
        "Document [1](Title: T1) Text one.\nDocument [2](Title: T2) Text two.\n\n"
        "Question: who?\nAnswer:"
    )
    assert q == " who?" and before.endswith("Question:")  # the space moves into the question
    kv = TEMPLATES["kv"].render("k2", [Passage("0", "v1", "k1"), Passage("1", "v2", "k2")])
    assert "".join(kv) == (
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        'JSON data:\n{"k1": "v1",\n "k2": "v2"}\n\nKey: "k2"\nCorresponding value:'
    )
    noise = "".join(TEMPLATES["noise"].render("q?", docs[:1]))
    assert noise.startswith("You are given a question and you MUST respond by EXTRACTING")
    assert noise.endswith("Documents:\nDocument [1](Title: T1) Text one.\nQuestion: q?\nAnswer:")


def test_custom_template_fields_and_their_errors():
    t = resolve_template("{lead}\n{documents}\nQ: {question}", {"lead": "Read."}, "[{id}] {text}")
    assert (
        "".join(t.render("x", passages(1))) == "Read.\n[p0] William Shakespeare wrote Hamlet.\nQ: x"
    )
    with pytest.raises(CisrankError, match=r"unknown field '\{lead\}'.*--field lead=VALUE"):
        resolve_template("{lead}\n{documents}\n{question}")
    with pytest.raises(CisrankError, match=r"unknown field '\{url\}'"):
        resolve_template("qa", document="{url} {text}")
    with pytest.raises(CisrankError, match="must come before"):
        ContextTemplate("c", "{question}\n{documents}")
    with pytest.raises(CisrankError, match="exactly once"):
        ContextTemplate("c", "{documents} {question} {question}")
    with pytest.raises(CisrankError, match="neither a named one"):
        resolve_template("Question: {question}")
    with pytest.raises(CisrankError, match="literal braces"):
        resolve_template("{documents} {question} {")


def test_noise_sampling_is_seeded_and_never_repeats():
    retrieved = passages(2)
    pool = [
        *[Passage(f"n{i}", f"noise passage number {i}", "") for i in range(8)],
        Passage("dup", "noise passage   number 3", ""),  # the text of n3 (whitespace aside)
        Passage("ret", retrieved[0].text, "copy"),  # the text of a retrieved passage
    ]
    a = sample_noise(pool, 8, seed=3, exclude=retrieved)
    assert a == sample_noise(pool, 8, seed=3, exclude=retrieved)
    texts = [" ".join(p.text.split()) for p in a]
    assert len(set(texts)) == 8 and retrieved[0].text not in texts
    assert {p.docid for p in a} <= {f"n{i}" for i in range(8)} | {"dup"}
    assert [p.docid for p in sample_noise(pool, 3, seed=4)] != [
        p.docid for p in sample_noise(pool, 3, seed=3)
    ]
    with pytest.raises(CisrankError, match="only 8 distinct passages"):
        sample_noise(pool, 9, seed=0, exclude=retrieved)


def test_random_word_noise_is_seeded_and_distinct(tiny):
    words = vocabulary_words(tiny.tokenizer)
    assert "shakespeare" in words and "<pad>" not in words and "." not in words
    a = random_word_passages(words, 5, seed=1, length=6)
    assert a == random_word_passages(words, 5, seed=1, length=6)
    assert a != random_word_passages(words, 5, seed=2, length=6)
    assert len({p.text for p in a}) == 5
    assert all(len(p.text.split()) == 6 and set(p.text.split()) <= set(words) for p in a)
    with pytest.raises(CisrankError, match="cannot make 5 distinct"):
        random_word_passages(["ab", "cd"], 5, seed=0, length=1, title_words=0)


def test_noise_layout_is_the_papers(tiny):
    """[I, random..., retrieved in reverse score order, Q] = `reverse` with noise (The Power of
    Noise, §5.4)."""
    asm = ContextAssembler(tiny.engine, "noise")
    docs = passages(3)
    noise = [Passage(f"n{i}", t, "") for i, t in enumerate(["fleas can live", "paris is big"])]
    assert pad_with_noise(docs, noise) == [*noise, *docs]
    res = asm.arrange(QUESTION, docs, "reverse", noise=noise)
    assert res.passages == [*noise, *docs[::-1]] and res.noise == 2
    assert res.order == [2, 1, 0]
    # the arrangement is searched on the retrieved passages alone
    cur = asm.arrange(QUESTION, docs, "curvature", noise=noise)
    assert cur.order == asm.arrange(QUESTION, docs, "curvature").order
    assert cur.passages[:2] == noise
    p = cur.prompt
    assert abs(cur.gauge.mean_logprob - tiny.brute_mean(p.ids, p.span)) <= 1e-4


def test_bpe_prompt_ids_are_the_whole_text_and_the_span_is_the_question(tiny_gpt2_bpe_dir):
    """Pieces tokenized on their own join to the whole prompt's tokens for a byte-level BPE (the
    space before the question moved into it), and the gauge scores exactly the question."""
    import torch
    from transformers import AutoModelForCausalLM

    asm = ContextAssembler(str(tiny_gpt2_bpe_dir), "qa")
    ref = AutoModelForCausalLM.from_pretrained(tiny_gpt2_bpe_dir, dtype=torch.float64).eval()
    question = "When was the author of Hamlet born?"
    for name in ("qa", "noise", "kv", "entropy"):
        asm.template = resolve_template(name)
        p = asm.render(question, passages(3))
        assert p.ids == [asm.engine.bos_id, *asm.engine.encode(p.text)], name
        decoded = asm.engine.tokenizer.decode(p.question)
        assert decoded == (question if name == "kv" else " " + question), name
        with torch.no_grad():
            lp = torch.log_softmax(ref(torch.tensor([p.ids])).logits[0], dim=-1)
        want = float(sum(lp[i - 1, p.ids[i]] for i in range(*p.span))) / len(p.question)
        assert abs(asm.gauge(question, p).mean_logprob - want) <= 1e-4, name


class _Store:
    """An index's document store: (docid, text) by row; records the rows read."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.texts)

    def get(self, indices):
        self.read += list(indices)
        return [(f"r{i}", self.texts[i]) for i in indices]


def test_index_noise_is_seeded_distinct_and_reads_few_rows():
    from cisrank.context import sample_store_noise

    texts = [f"passage number {i}" for i in range(1000)] + ["passage number 7"] * 50
    retrieved = [Passage("x", "passage number 3")]
    store = _Store(texts)
    got = sample_store_noise(store, 5, seed=1, exclude=retrieved)
    assert got == sample_store_noise(_Store(texts), 5, seed=1, exclude=retrieved)
    assert got != sample_store_noise(_Store(texts), 5, seed=2, exclude=retrieved)
    assert len({p.text for p in got}) == 5 and "passage number 3" not in {p.text for p in got}
    assert len(store.read) < 30  # a sample, not the whole store
    # a small store whose rows are mostly duplicates: drawn until done, then an error
    dup = _Store(["a b"] * 20 + ["c d", "e f"])
    assert {p.text for p in sample_store_noise(dup, 3, seed=0)} == {"a b", "c d", "e f"}
    with pytest.raises(CisrankError, match="holds only 3 distinct"):
        sample_store_noise(dup, 4, seed=0)
