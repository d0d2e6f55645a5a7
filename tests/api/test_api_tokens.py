"""Budgets in the model's own tokens: a request costs what its reranker's tokenizer makes of it,
whatever the script (characters / 4 let text from U+10000 up, 4 tokens a character, cost 16x its
estimate); counting is bounded (a lower bound refuses gross requests without counting, counting
stops at the budget, a cut document is read in a window of its start); embeddings check `dimensions`
before embedding; and model work is sliced by time as well as tokens. Brute-force references: the
tokenizer run on the whole texts."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from api_fakes import MultiOverlapReranker, config_for, overlap
from transformers import AutoTokenizer

from cisrank import testing
from cisrank.api.app import create_app
from cisrank.serving.batching import BatchScorer
from cisrank.serving.config import BatchingConfig, Limits
from cisrank.serving.token_count import (
    SLICE_CHARS,
    OverBudget,
    TokenCounter,
    word_runs,
)

QUESTION = "when was the author of hamlet born ?"
rng = random.Random(48)
ENGLISH = " ".join(rng.choice(testing.SAMPLE_SENTENCES) for _ in range(400))
CJK = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(4000))
EMOJI = "".join(chr(rng.randrange(0x1F600, 0x1F64F)) for _ in range(4000))
ASTRAL = "".join(chr(rng.randrange(0x10000, 0x10FFF)) for _ in range(4000))
SCRIPTS = {"english": ENGLISH, "cjk": CJK, "emoji": EMOJI, "u10000": ASTRAL}


@pytest.fixture(scope="module")
def bpe(tiny_gpt2_bpe_dir):
    """The byte-level BPE tokenizer of the tiny GPT-2 (GPT-2 style, as SmolLM2's)."""
    return AutoTokenizer.from_pretrained(str(tiny_gpt2_bpe_dir))


@pytest.fixture(scope="module")
def cis(tiny_gpt2_bpe_dir):
    from cisrank.rerank.cis import CISReranker

    return CISReranker(model=str(tiny_gpt2_bpe_dir), template="qa")


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _client(reranker, name: str = "cis", **limits):
    from fastapi.testclient import TestClient

    budget = limits.get("max_request_cost", 1 << 20)
    cfg = config_for(
        [name], limits=Limits(**limits), batching=BatchingConfig(max_inflight_cost=budget)
    )
    return TestClient(create_app(cfg, rerankers={name: reranker}), raise_server_exceptions=False)


# ------------------------------------------------------------------ the counter alone


def test_counts_are_the_tokenizers_whatever_the_script(bpe):
    counter = TokenCounter(bpe, "t")
    texts = [ENGLISH[:700], CJK[:200], EMOJI[:200], ASTRAL[:200], "", " a  b "]
    got = counter.measure_slice(texts).counts
    assert got == [max(1, _tokens(bpe, t)) for t in texts]
    assert got[3] == 800  # characters / 4 said 50: from U+10000 up, a character is 4 bytes


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("cut", [1, 7, 100])
def test_a_cut_in_a_window_is_the_cut_of_the_whole_text(bpe, script, cut):
    """`max_tokens_per_doc` reads a window of the document's start, not the document: the
    prefix kept ends where token `cut` of the whole text ends (the offsets of a full
    tokenization, the reference), and no more than a few windows were tokenized."""
    counter = TokenCounter(bpe, "t")
    text = (SCRIPTS[script] + " ") * 8 + "tail"  # 32,000-38,000 characters
    seen: list[int] = []
    encode = counter._tok.encode

    def spy(sequence, *args, **kwargs):
        seen.append(len(sequence))
        return encode(sequence, *args, **kwargs)

    counter._tok.encode = spy
    got = counter.measure_slice([text], cut=cut)
    offsets = bpe(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert got.texts == [text[: offsets[cut - 1][1]]] and got.cut == 1
    assert got.counts == [cut]
    assert sum(seen) <= 4 * (cut * 8 + 256) < len(text), seen


def test_the_lower_bound_never_exceeds_the_count(bpe, tiny_bert_dir):
    bert = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    for tokenizer in (bpe, bert):
        counter = TokenCounter(tokenizer, "t")
        texts = [*SCRIPTS.values(), "a b\tc\n d", "x" * 5000, "  ", "é é"]
        bounds = counter.lower_bounds(texts)
        counts = counter.measure_slice(texts).counts
        assert all(b <= c for b, c in zip(bounds, counts, strict=True)), (bounds, counts)
    assert word_runs(" a  bc\td é ") == 4 and word_runs("") == 0


def test_a_gross_request_is_refused_by_its_lower_bound_without_counting(bpe):
    counter = TokenCounter(bpe, "t")
    calls: list[int] = []
    real = counter.measure_slice
    counter.measure_slice = lambda texts, *a: calls.append(len(texts)) or real(texts, *a)

    async def run():
        try:
            return await counter.measure([ENGLISH] * 50, budget=10_000)
        finally:
            counter.close()

    with pytest.raises(OverBudget) as info:
        asyncio.run(run())
    assert info.value.at_least and info.value.cost > 10_000 and calls == []


def test_counting_stops_once_the_budget_is_passed(bpe):
    """CJK text, whose lower bound is weak (a character can be a token of its own or several):
    counted in slices, and the count stops at the slice that passes the budget."""
    counter = TokenCounter(bpe, "t")
    calls: list[int] = []
    real = counter.measure_slice
    counter.measure_slice = lambda texts, *a: calls.append(len(texts)) or real(texts, *a)
    texts = [CJK * 8] * 40  # 32,000 characters each, 8 a slice: 5 slices
    per_text = _tokens(bpe, texts[0])

    async def run():
        try:
            return await counter.measure(texts, budget=int(per_text * 12))
        finally:
            counter.close()

    with pytest.raises(OverBudget) as info:
        asyncio.run(run())
    assert SLICE_CHARS // 32_000 == 8 and calls == [8, 8]
    assert info.value.cost == 16 * per_text and info.value.at_least


def test_without_a_tokenizer_a_text_costs_its_utf8_bytes():
    counter = TokenCounter(None, "t")
    got = counter.measure_slice(["abc", "é", "中", "😀", ""])
    assert got.counts == [3, 2, 3, 4, 1]
    assert counter.measure_slice(["a  b c d"], cut=2).texts == ["a  b"]


# ------------------------------------------------------------------ through the API


def test_a_rerank_costs_its_tokens_not_its_characters(cis, bpe):
    """200 characters from U+10000 up are 800 tokens (characters / 4 said 50): with a budget
    of 2,000, four such documents are refused naming `documents` and the exact count of the
    model's tokenizer; English documents of the same length pass."""
    client = _client(cis, max_request_cost=2000)
    english = [ENGLISH[i * 200 : (i + 1) * 200] for i in range(4)]
    astral = [ASTRAL[i * 200 : (i + 1) * 200] for i in range(4)]
    ok = client.post("/v1/rerank", json={"query": QUESTION, "documents": english})
    assert ok.status_code == 200, ok.text
    r = client.post("/v1/rerank", json={"query": QUESTION, "documents": astral})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "documents", r.text
    q = _tokens(bpe, QUESTION)
    expected = sum(q + _tokens(bpe, d) for d in astral)  # 4 x (14 + 800)
    assert f"cost {expected} tokens" in r.json()["message"], r.text


def test_max_tokens_per_doc_reads_a_window_and_leaves_the_model_thread_alone(cis, bpe):
    """Finding 4: `max_tokens_per_doc: 1` over large documents tokenized every document whole,
    in one call of the model thread (15 MB: 8.9 s, a small request behind it waited 6.1 s).
    Now the cut is made while counting, in a window of each document's start, and the model's
    tokenizer reads only the cut documents; the scores are those of the reference cut."""
    docs = [(s + " ") * 8 for s in (ENGLISH[:4000], CJK, ASTRAL)]  # 32,000-38,000 characters
    seen: list[int] = []
    tokenizer = cis.fast_tokenizer
    real_call = type(tokenizer).__call__

    def spy(self, text, *args, **kwargs):
        if self is tokenizer:
            seen.extend(len(t) for t in ([text] if isinstance(text, str) else text))
        return real_call(self, text, *args, **kwargs)

    client = _client(cis)
    body = {"query": QUESTION, "documents": docs, "max_tokens_per_doc": 3}
    type(tokenizer).__call__ = spy
    try:
        r = client.post("/v1/rerank", json=body)
    finally:
        type(tokenizer).__call__ = real_call
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["truncated_documents"] == 3
    assert max(seen) < 100, seen  # the cut documents and the query, never a whole one
    cuts = []
    for doc in docs:
        offsets = bpe(doc, add_special_tokens=False, return_offsets_mapping=True)
        cuts.append(doc[: offsets["offset_mapping"][2][1]])
    expected = cis.score(QUESTION, cuts)
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert [got[i] for i in range(3)] == pytest.approx(expected, abs=1e-4)


def test_embeddings_check_dimensions_before_embedding(tiny_dense):
    """Finding 4: 100 texts with a wrong `dimensions` were embedded (11.2 s) before the 422."""
    embedded: list[int] = []
    real = tiny_dense.embed
    tiny_dense.embed = lambda texts, *a: embedded.append(len(texts)) or real(texts, *a)
    try:
        client = _client(tiny_dense, "dense")
        body = {"input": [s * 20 for s in testing.SAMPLE_SENTENCES] * 10}
        r = client.post("/v1/embeddings", json={**body, "dimensions": 7})
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == "dimensions", r.text
        assert embedded == []
        width = tiny_dense.runner.dimensions
        assert client.post("/v1/embeddings", json={**body, "dimensions": width}).status_code == 200
        assert sum(embedded) == 100
    finally:
        tiny_dense.embed = real


def test_a_context_costs_its_prompts_tokens(cis, bpe):
    """The reported `/v1/context` with `arrange: curvature` over 4 documents of 200 characters
    from U+10000 up: estimated at characters / 4 like English (and held the model thread 58.8
    s); its prompts are counted in tokens now: refused under a budget that English of the same
    length passes, naming `documents`."""
    from cisrank.context.templates import resolve_template
    from cisrank.data.types import Passage
    from cisrank.serving.assembly import prompt_size

    client = _client(cis, max_request_cost=8000)
    english = [ENGLISH[i * 200 : (i + 1) * 200] for i in range(4)]
    astral = [ASTRAL[i * 200 : (i + 1) * 200] for i in range(4)]
    body = {"query": QUESTION, "arrange": "curvature"}
    assert client.post("/v1/context", json={**body, "documents": english}).status_code == 200
    r = client.post("/v1/context", json={**body, "documents": astral})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "documents", r.text
    assert "(of the 5 prompts this arrangement scores" in r.text
    # the estimate of a prompt is within a few tokens of the rendered prompt's count
    template = resolve_template("qa", {})
    passages = [Passage(str(i), t, "") for i, t in enumerate(astral)]
    counts = {t: _tokens(bpe, t) for t in [QUESTION, *astral, template.separator]}
    size = prompt_size(
        template, QUESTION, passages, False, lambda t: counts.get(t) or _tokens(bpe, t)
    )
    before, question, after = template.render(QUESTION, passages)
    rendered = _tokens(bpe, before) + _tokens(bpe, question) + _tokens(bpe, after)
    assert abs(size.chars - rendered) <= 8, (size.chars, rendered)


def test_a_hang_up_while_counting_stops_the_request_before_model_work(cis):
    from cisrank.api.schemas import ContextRequest
    from cisrank.api.shapes import native
    from cisrank.serving.assembly import ContextService
    from cisrank.serving.errors import ClientGone

    app = create_app(config_for(["cis"]), rerankers={"cis": cis})
    service: ContextService = app.state.context
    gone = threading.Event()
    gone.set()
    body = ContextRequest(query=QUESTION, documents=[ENGLISH[:500]] * 3, arrange="curvature")
    scorer = app.state.serving.scorers["cis"]

    async def run():
        try:
            await native.context(service, body, gone)
        finally:
            await app.state.serving.aclose()

    with pytest.raises(ClientGone):
        asyncio.run(run())
    assert scorer.depth == 0 and scorer.inflight_cost == 0


def test_slices_are_bounded_in_time_at_the_measured_rate():
    """A model whose time is proportional to its tokens (0.2 ms a token): once one call is
    measured, a slice holds about what takes `max_slice_s` (0.05 s: 250 tokens; a call is rated
    as at least 256 tokens, so small ones err long), where the token bound alone (16,384) put
    the whole request in one 0.85 s call."""
    reranker = MultiOverlapReranker()
    reranker.seconds_per_char = 2e-4
    cfg = BatchingConfig(max_wait_ms=0, max_slice_s=0.05)
    scorer = BatchScorer(reranker, "r", cfg)
    heavy = [f"{i:03d} " + "lorem ipsum " * 8 for i in range(40)]  # 100 bytes each

    async def run():
        try:
            await scorer.score("warm", ["x" * 1000])  # one call measured: ~0.2 ms a token
            return await scorer.score("q", heavy)
        finally:
            await scorer.aclose()

    assert asyncio.run(run()) == [overlap("q", p) for p in heavy]
    assert 200 <= scorer.slice_tokens() <= 400, scorer.slice_tokens()
    sliced = reranker.batches[1:]
    assert len(sliced) >= 10 and sum(len(ps) for b in sliced for _, ps in b) == 40
    assert all(sum(len(p) + 1 for _, ps in b for p in ps) <= 400 for b in sliced), sliced
