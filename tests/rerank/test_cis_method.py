"""The method: CIS finds the passage that answers, where term matching (BM25) finds the echo.

The paper's example: for "When was the author of Hamlet born?", a passage that repeats the
question's words wins on BM25, while the passage that answers it ("Shakespeare was born in 1564.")
shares only "was" and "born". A tiny causal LM trained here on a synthetic corpus of facts learns
that the question makes the answer likely; CIS = log p(K|Q) - log p(K) then ranks the answer first,
and a same-shaped passage about another author below it.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest
import torch

from cisrank import testing
from cisrank.rerank import CISReranker

AUTHORS = [
    ("shakespeare", "hamlet", "1564"),
    ("dickens", "oliver", "1812"),
    ("austen", "emma", "1775"),
    ("tolstoy", "anna", "1828"),
    ("homer", "iliad", "750"),
    ("dante", "inferno", "1265"),
    ("cervantes", "quixote", "1547"),
    ("goethe", "faust", "1749"),
    ("melville", "moby", "1819"),
    ("orwell", "animal", "1903"),
    ("kafka", "trial", "1883"),
    ("joyce", "ulysses", "1882"),
]
QUERY = "When was the author of Hamlet born?"
ANSWER = "Shakespeare was born in 1564."
WRONG = "Dickens was born in 1812."
ECHO = "When was the author of Hamlet born? The author of Hamlet was born."


def corpus() -> list[str]:
    out = []
    for author, work, year in AUTHORS:
        out += [
            f"Question: When was the author of {work} born? Answer: {author} was born in {year}.",
            f"{author} was born in {year}.",
            f"{author} wrote {work}.",
            f"When was {work} written? Ask about the author of {work}.",
        ]
    return out


def bm25(query: str, docs: list[str], k1: float = 0.9, b: float = 0.4) -> list[float]:
    """Exact Lucene BM25 (idf = ln(1 + (N - df + 0.5) / (df + 0.5))) over `docs`."""
    toks = [re.findall(r"\w+", d.lower()) for d in docs]
    avg = sum(map(len, toks)) / len(toks)
    df = Counter(t for d in toks for t in set(d))
    out = []
    for d in toks:
        tf = Counter(d)
        s = 0.0
        for t in set(re.findall(r"\w+", query.lower())):
            if tf[t]:
                idf = math.log(1 + (len(toks) - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * tf[t] * (k1 + 1) / (tf[t] + k1 * (1 - b + b * len(d) / avg))
        out.append(s)
    return out


def test_bm25_by_hand():
    # two docs, query "a": df=1, idf=ln(1+1.5/1.5)=ln 2; doc0 len 1, avg 1.5
    got = bm25("a", ["a", "b c"])
    assert got[1] == 0.0
    assert got[0] == pytest.approx(math.log(2) * 1.9 / (1 + 0.9 * (0.6 + 0.4 / 1.5)), abs=1e-12)


@pytest.fixture(scope="module")
def trained_lm(tmp_path_factory):
    texts = corpus()
    tok = testing.word_level_tokenizer(testing.words([*texts, QUERY, ECHO]))
    path = testing.build_causal_lm(tmp_path_factory.mktemp("fact-lm"), tok, "gpt2", seed=0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    torch.manual_seed(0)
    seqs = [[tok.bos_token_id, *tok(t, add_special_tokens=False)["input_ids"]] for t in texts]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(s)] = torch.tensor(s)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: threading only adds contention on a shared CPU
    for _ in range(250):
        loss = model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(path)
    return path, float(loss.detach())


def test_cis_ranks_the_answer_bm25_ranks_the_echo(trained_lm):
    path, final_loss = trained_lm
    assert final_loss < 0.6  # the facts were learned
    passages = [ECHO, WRONG, ANSWER]
    lexical = bm25(QUERY, [*passages, *corpus()])[:3]
    assert lexical[0] > lexical[2] and lexical[0] > lexical[1]  # BM25: the echo first
    cis = CISReranker(str(path), template="qa", estimator="forward").score(QUERY, passages)
    assert cis[2] > cis[0] and cis[2] > cis[1], cis  # CIS: the answer first
    assert cis[2] > 0  # the question makes the answer more likely than it is alone
