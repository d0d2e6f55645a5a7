"""Long documents: windows against a brute-force split, pooling against per-window scores."""

from __future__ import annotations

import itertools
import math

import pytest
from pydantic import ValidationError

from cisrank import testing
from cisrank.data.types import BestChunk
from cisrank.fusion import minmax
from cisrank.rerank.base import BaseReranker, CombiningReranker, PassageWindow
from cisrank.rerank.chunking import Chunking, Splitter, plan_windows, split_spans

TEXT = (
    "Hamlet is a tragedy set in Denmark. Shakespeare was born in 1564, à Stratford — "
    "naïve café 😀 résumé. The author of Hamlet is Shakespeare; Paris is the capital of France."
)


@pytest.fixture(scope="module")
def bpe():
    return testing.bpe_tokenizer(testing.SAMPLE_SENTENCES * 3, vocab_size=320)


def brute_windows(tokenizer, text, window, overlap):
    """Tokenize with the Hugging Face call, slice the ids, map each slice back to characters."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    n = len(ids)
    if n <= window:
        return [(0, len(text))], [n]
    stride = window - overlap
    count = math.ceil((n - window) / stride) + 1
    spans, sizes = [], []
    for k in range(count):
        piece = list(range(n))[k * stride : k * stride + window]
        spans.append((offsets[piece[0]][0], offsets[piece[-1]][1]))
        sizes.append(len(piece))
    return spans, sizes


@pytest.mark.parametrize(("window", "overlap"), [(7, 0), (7, 3), (10, 9), (16, 5), (1, 0)])
def test_windows_equal_brute_force_slices_of_ids(bpe, window, overlap):
    offsets = Splitter(bpe).offsets(TEXT)
    got = split_spans(TEXT, offsets, window, overlap)
    assert got == brute_windows(bpe, TEXT, window, overlap)
    spans = got[0]
    assert len(spans) > 1 and spans[0][0] == 0 and spans[-1][1] == len(TEXT)
    if overlap:  # consecutive windows share text
        assert all(b[0] < a[1] for a, b in itertools.pairwise(spans))


def test_a_document_of_exactly_one_window_is_whole_and_unchanged(bpe):
    text = "  Hamlet is a tragedy.  "
    n = len(bpe(text, add_special_tokens=False)["input_ids"])
    offsets = Splitter(bpe).offsets(text)
    assert split_spans(text, offsets, n, 2) == ([(0, len(text))], [n])
    assert split_spans(text, offsets, n - 1, 0)[0] != [(0, len(text))]


def test_without_a_tokenizer_windows_are_of_words():
    text = "one two  three four five six seven"
    offsets = Splitter(None).offsets(text)
    spans, sizes = split_spans(text, offsets, 3, 1)
    assert [text[a:b] for a, b in spans] == ["one two  three", "three four five", "five six seven"]
    assert sizes == [3, 3, 3]


def test_options_are_validated():
    assert Chunking().pooling == "max" and Chunking().window_tokens is None
    for bad in (
        {"window_tokens": 4, "overlap_tokens": 4},
        {"overlap_tokens": -1},
        {"pooling": "sum"},
        {"max_chunks_per_doc": 0},
        {"window_tokens": 0},
    ):
        with pytest.raises(ValidationError):
            Chunking(**bad)
    assert Chunking().overlap_for(10) == 5  # the model's own window: at most half of it


class WordReranker(BaseReranker):
    """Scores a passage by how often it holds the query's words; reads 4 words of a passage."""

    name = "words"
    passage_window = PassageWindow(4, None)

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def score_batch(self, requests):
        self.seen += [list(ps) for _, ps in requests]
        return [
            [float(sum(p.split().count(w) for w in q.split())) for p in ps] for q, ps in requests
        ]


LONG = "filler words here now and more filler text then the answer is paris answer"
SHORT = "answer once"
DOCS = [LONG, SHORT, "nothing at all"]


def brute_windows_of_words(text, window, overlap):
    words = text.split()
    if len(words) <= window:
        return [text]
    stride = window - overlap
    count = math.ceil((len(words) - window) / stride) + 1
    return [" ".join(words[k * stride : k * stride + window]) for k in range(count)]


@pytest.mark.parametrize("pooling", ["max", "mean", "first"])
def test_pooling_equals_brute_force_per_window_scores(pooling):
    r = WordReranker()
    chunking = Chunking(overlap_tokens=1, pooling=pooling)
    ranked = r.rank("answer", DOCS, chunking=chunking)
    per_doc = []
    for doc in DOCS:
        windows = brute_windows_of_words(doc, 4, 1)
        scores = [float(w.split().count("answer")) for w in windows]
        if pooling == "first":
            windows, scores = windows[:1], scores[:1]
        pooled = {"max": max(scores), "mean": sum(scores) / len(scores), "first": scores[0]}
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        per_doc.append((pooled[pooling], windows[best], scores[best]))
    by_index = {p.index: p for p in ranked}
    for i, (score, text, best_score) in enumerate(per_doc):
        p = by_index[i]
        assert p.score == score
        assert p.best_chunk is not None
        assert DOCS[i][p.best_chunk.start : p.best_chunk.end] == text
        assert p.best_chunk.score == best_score
    assert [p.index for p in ranked] == sorted(range(3), key=lambda i: (-per_doc[i][0], i))
    windows = 1 + 1 + 1 if pooling == "first" else len(brute_windows_of_words(LONG, 4, 1)) + 2
    assert ranked.chunks.windows_scored == windows
    assert ranked.chunks.chunked_documents == 1


def test_the_answer_at_a_long_documents_end_wins_with_max_not_first():
    r = WordReranker()
    first = r.rank("answer", DOCS, chunking=Chunking(overlap_tokens=0, pooling="first"))
    best = r.rank("answer", DOCS, chunking=Chunking(overlap_tokens=0, pooling="max"))
    assert [p.index for p in first][:2] == [1, 0]
    assert [p.index for p in best][:2] == [0, 1]
    # "then the answer is" and "paris answer" both score 1: the first of equal bests
    assert best[0].best_chunk == BestChunk(LONG.index("then"), LONG.index(" paris"), 1.0)


def test_the_cap_keeps_the_first_windows_and_counts_the_rest():
    r = WordReranker()
    ranked = r.rank("answer", DOCS, chunking=Chunking(overlap_tokens=0, max_chunks_per_doc=2))
    assert r.seen[-1] == [
        "filler words here now",
        "and more filler text",
        SHORT,
        "nothing at all",
    ]
    assert ranked.chunks.windows_dropped == 2
    assert ranked.chunks.windows_scored == 4
    assert ranked[0].index == 1  # the answer was in the windows dropped


def test_short_documents_score_exactly_as_without_chunking():
    r = WordReranker()
    docs = ["answer once", "no", "answer answer"]
    plain = r.rank("answer", docs)
    chunked = r.rank("answer", docs, chunking=Chunking())
    assert [(p.index, p.score, p.text) for p in chunked] == [
        (p.index, p.score, p.text) for p in plain
    ]
    assert all(p.best_chunk == BestChunk(0, len(p.text), p.score) for p in chunked)
    assert r.seen[-1] == docs


class SpreadReranker(CombiningReranker):
    """A combining reranker: min-max of word counts over the request's passages."""

    name = "spread"
    passage_window = PassageWindow(4, None)

    def score_parts(self, requests):
        return [[float(p.split().count("answer")) for p in ps] for _, ps in requests]

    def combine(self, query, passages, parts):
        return minmax([float(p) for p in parts], constant=1.0)


def test_combine_runs_over_the_requests_windows_then_pools():
    ranked = SpreadReranker().rank("answer", DOCS, chunking=Chunking(overlap_tokens=0))
    windows = [w for d in DOCS for w in brute_windows_of_words(d, 4, 0)]
    normed = minmax([float(w.split().count("answer")) for w in windows], constant=1.0)
    sizes = [len(brute_windows_of_words(d, 4, 0)) for d in DOCS]
    starts = [sum(sizes[:i]) for i in range(len(DOCS))]
    want = [max(normed[s : s + n]) for s, n in zip(starts, sizes, strict=True)]
    assert {p.index: p.score for p in ranked} == dict(enumerate(want))


def test_the_identity_keeps_the_order_under_every_pooling():
    from cisrank.rerank.base import IdentityReranker

    docs = [LONG, SHORT, LONG]
    for pooling in ("max", "mean", "first"):
        ranked = IdentityReranker().rank("q", docs, chunking=Chunking(pooling=pooling))
        assert [p.index for p in ranked] == [0, 1, 2]


def test_a_reranker_without_a_window_reads_documents_whole():
    plan = plan_windows(["a b c d e f"], [[(0, 1)] * 6], None, Chunking())
    assert plan.spans == [[(0, 11)]] and plan.usage.chunked_documents == 0


def test_cross_encoder_windows_scored_as_passages(ce_dir):
    from cisrank.rerank.cross_encoder import CrossEncoderReranker

    r = CrossEncoderReranker(model=str(ce_dir), dtype="float32", max_length=16)
    window = r.passage_window
    assert window is not None and window.less_query and window.tokens == 16 - 3
    query = "who wrote hamlet"
    long_doc = " ".join(testing.SAMPLE_SENTENCES[:6])
    docs = [long_doc, "hamlet is a tragedy set in denmark."]
    ranked = r.rank(query, docs, chunking=Chunking(overlap_tokens=2))
    tok = r.tokenizer
    q_tokens = len(tok(query, add_special_tokens=False)["input_ids"])
    spans, _ = brute_windows(tok, long_doc, 13 - q_tokens, 2)
    scores = r.score(query, [long_doc[a:b] for a, b in spans])
    got = {p.index: p for p in ranked}
    assert got[0].score == pytest.approx(max(scores), abs=1e-6)
    assert got[1].score == pytest.approx(r.score(query, [docs[1]])[0], abs=1e-6)
    assert ranked.chunks.windows_scored == len(spans) + 1


def test_cis_windows_have_their_own_priors_keyed_by_content(tiny_gpt2_dir, tmp_path):
    from cisrank.rerank.cis import CISReranker
    from cisrank.rerank.prior_store import PriorStore, passage_key

    store = PriorStore(tmp_path / "priors.sqlite")
    r = CISReranker(str(tiny_gpt2_dir), prior_store=store, estimator="forward", max_doc_tokens=64)
    assert r.passage_window == PassageWindow(64, r.fast_tokenizer)
    query = "who wrote hamlet"
    doc = " ".join(testing.SAMPLE_SENTENCES[:4]).lower()
    ranked = r.rank(query, [doc], chunking=Chunking(window_tokens=5, overlap_tokens=1))
    spans, _ = brute_windows(r.fast_tokenizer, doc, 5, 1)
    windows = [doc[a:b] for a, b in spans]
    assert ranked[0].score == pytest.approx(max(r.score(query, windows)), abs=1e-4)
    keys = {passage_key(ids) for ids in r.passage_ids(windows)}
    assert len(keys) == len(windows) > 1
    assert set(store.get_many(r.store_fingerprint, sorted(keys))) == keys
    assert store.count(r.store_fingerprint) == len(keys)  # one prior a window, none for the doc


def test_dense_window_is_its_length_less_its_special_tokens(tiny_bert_dir):
    from cisrank.rerank.dense import DenseReranker

    r = DenseReranker(model=str(tiny_bert_dir), max_seq_length=12)
    assert r.passage_window == PassageWindow(12 - 2, r.fast_tokenizer)
    doc = " ".join(testing.SAMPLE_SENTENCES[:3])
    ranked = r.rank("hamlet", [doc], chunking=Chunking(overlap_tokens=3))
    spans, _ = brute_windows(r.fast_tokenizer, doc, 10, 3)
    windows = [doc[a:b] for a, b in spans]
    assert ranked[0].score == pytest.approx(max(r.score("hamlet", windows)), abs=1e-6)
    assert ranked.chunks.windows_scored == len(windows) > 1


def test_planning_stops_once_the_windows_pass_the_budget():
    from cisrank.rerank.chunking import WindowsOverBudget, plan_request

    class Counting(Splitter):
        calls = 0

        def offsets(self, text):
            Counting.calls += 1
            return super().offsets(text)

    docs = ["w " * 50] * 100  # 100 documents of 50 words: 5 windows of 10 words each
    chunking = Chunking(window_tokens=10, overlap_tokens=0)
    full = plan_request(Counting(None), None, "q", docs, chunking)
    assert full.usage.windows_scored == 500 and Counting.calls == 100
    Counting.calls = 0
    with pytest.raises(WindowsOverBudget) as err:
        plan_request(Counting(None), None, "q", docs, chunking, cost=lambda n: n + 1, budget=120)
    # each document costs 5 windows x 11: the third passes 120, and no fourth is tokenized
    assert (err.value.cost, err.value.budget, Counting.calls) == (165, 120, 3)
    assert plan_request(Counting(None), None, "q", docs, chunking, lambda n: n + 1, 5500)
