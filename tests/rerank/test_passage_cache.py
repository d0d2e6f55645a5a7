"""The dense reranker's passage cache: exact scores, only new texts encoded, an LRU within its byte
budget, and no hit across models, runtimes, dtypes or token limits."""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import pytest

from cisrank import testing
from cisrank.rerank.dense import DenseReranker, company_moves
from cisrank.rerank.passage_cache import ENTRY_OVERHEAD, EmbeddingCache, cache_space

PASSAGES = [
    "Shakespeare was born in 1564 in Stratford-upon-Avon.",
    "Hamlet is a tragedy set in Denmark.",
    "Paris is the capital of France.",
    "The author of Hamlet is Shakespeare.",
    "Paris is the capital of France.",
]
DISTINCT = len(set(PASSAGES))
QUERIES = ["When was the author of Hamlet born?", "What is the capital of France?"]

needs_onnxruntime = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None,
    reason="the onnx backend needs the 'onnx' extra: pip install 'cisrank[onnx]'",
)


def counting(reranker: DenseReranker) -> list[list[str]]:
    """Every list of texts the reranker's runtime is asked to embed, from now on."""
    calls: list[list[str]] = []
    embed = reranker.runner.embed

    def recorded(texts, batch_size):
        calls.append(list(texts))
        return embed(texts, batch_size)

    reranker.runner.embed = recorded  # type: ignore[method-assign]
    return calls


@pytest.fixture(scope="module")
def plain(tiny_bert_dir) -> DenseReranker:
    return DenseReranker(str(tiny_bert_dir), batch_size=2, passage_cache_mb=0)


def test_cached_and_uncached_scores_are_exactly_equal(tiny_bert_dir, plain):
    cached = DenseReranker(str(tiny_bert_dir), batch_size=2, passage_cache_mb=1)
    assert plain.passage_cache is None and cached.passage_cache is not None
    for query in QUERIES:  # the first query fills the cache, the second reads it
        assert cached.score(query, PASSAGES) == plain.score(query, PASSAGES)
    stats = cached.passage_cache.stats()
    assert (stats["misses"], stats["hits"]) == (DISTINCT, DISTINCT)
    # a request half in the cache: the new passages are encoded in other company (float32
    # rounding apart, the same vectors) and the old ones read
    mixed = [*PASSAGES[:2], "Hamlet was written around 1600.", "Denmark is in Europe."]
    assert cached.score(QUERIES[0], mixed) == pytest.approx(
        plain.score(QUERIES[0], mixed), abs=1e-6
    )


def test_a_second_query_over_the_same_passages_encodes_only_the_query(tiny_bert_dir):
    r = DenseReranker(str(tiny_bert_dir), batch_size=2)  # the default budget: on
    calls = counting(r)
    r.score(QUERIES[0], PASSAGES)
    assert calls == [[QUERIES[0]], list(dict.fromkeys(PASSAGES))]
    calls.clear()
    r.score(QUERIES[1], PASSAGES)
    assert calls == [[QUERIES[1]]]
    calls.clear()  # one new passage among the cached ones: the query and it
    r.score(QUERIES[1], [*PASSAGES, "Denmark is in Europe."])
    assert calls == [[QUERIES[1]], ["Denmark is in Europe."]]


def test_the_passage_prefix_is_part_of_the_text_that_is_keyed(tiny_bert_dir):
    cache = EmbeddingCache(1 << 20)
    bare = DenseReranker(str(tiny_bert_dir), passage_cache=cache)
    prefixed = DenseReranker(str(tiny_bert_dir), passage_prefix="passage: ", passage_cache=cache)
    bare.score(QUERIES[0], PASSAGES)
    prefixed.score(QUERIES[0], PASSAGES)
    assert cache.stats()["hits"] == 0 and len(cache) == 2 * DISTINCT


def vectors(n: int, dims: int = 4) -> np.ndarray:
    return np.arange(n * dims, dtype=np.float32).reshape(n, dims)


def test_the_budget_evicts_the_least_recently_used_and_is_never_exceeded():
    entry = 4 * 4 + ENTRY_OVERHEAD
    cache = EmbeddingCache(3 * entry + entry // 2)  # room for three entries, not four
    space = b"s" * 32
    cache.put_many(space, ["a", "b", "c"], vectors(3))
    assert cache.get_many(space, ["a"])[0].tolist() == [0.0, 1.0, 2.0, 3.0]  # a: most recent
    cache.put_many(space, ["d"], vectors(1) + 100)
    got = cache.get_many(space, ["a", "b", "c", "d"])
    assert [g is None for g in got] == [False, True, False, False]  # b was the least recent
    assert cache.stats() == {
        "hits": 4,
        "misses": 1,
        "evictions": 1,
        "entries": 3,
        "bytes": 3 * entry,
        "budget_bytes": 3 * entry + entry // 2,
    }
    for k in range(50):  # any sequence of puts stays within the budget
        cache.put_many(space, [f"t{k}", f"u{k}"], vectors(2))
        assert cache.stats()["bytes"] <= cache.budget_bytes
        assert cache.stats()["bytes"] == len(cache) * entry
    assert cache.stats()["evictions"] == 1 + 100
    big = EmbeddingCache(entry - 1)  # a vector over the whole budget is not kept
    big.put_many(space, ["a"], vectors(1))
    assert (len(big), big.stats()["bytes"]) == (0, 0)


def test_cached_vectors_cannot_be_changed_by_a_caller():
    cache = EmbeddingCache(1 << 20)
    space = b"s" * 32
    rows = vectors(1)
    cache.put_many(space, ["a"], rows)
    rows[0, 0] = 99.0  # the caller's array is not the one kept
    kept = cache.get_many(space, ["a"])[0]
    assert kept[0] == 0.0
    with pytest.raises(ValueError):
        kept[0] = 1.0


def test_the_cache_is_safe_under_threads():
    entry = 4 * 4 + ENTRY_OVERHEAD
    cache = EmbeddingCache(20 * entry)
    space = b"s" * 32

    def work(k: int) -> None:
        for i in range(200):
            cache.put_many(space, [f"{k}-{i}"], vectors(1))
            cache.get_many(space, [f"{k}-{i - 1}"])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = cache.stats()
    assert stats["hits"] + stats["misses"] == 800
    assert stats["entries"] == 20 and stats["bytes"] == 20 * entry
    assert stats["evictions"] == 800 - 20


def test_another_model_or_token_limit_never_hits(tiny_bert_dir, word_vocab, tmp_path):
    other = testing.build_bert(tmp_path / "other", word_vocab, seed=1)
    cache = EmbeddingCache(1 << 20)
    readers = [
        DenseReranker(str(tiny_bert_dir), passage_cache=cache),
        DenseReranker(str(other), passage_cache=cache),
        DenseReranker(str(tiny_bert_dir), max_seq_length=8, passage_cache=cache),
    ]
    for r in readers:
        r.score(QUERIES[0], PASSAGES)
    assert cache.stats()["hits"] == 0 and len(cache) == 3 * DISTINCT
    readers[0].score(QUERIES[1], PASSAGES)  # the first one's own entries are still there
    assert cache.stats()["hits"] == DISTINCT


def test_the_space_is_keyed_by_every_part_of_how_vectors_are_computed():
    base = ("f" * 64, "torch", "float32", 256)
    spaces = {
        cache_space(*base),
        cache_space("e" * 64, *base[1:]),
        cache_space(base[0], "onnx", *base[2:]),
        cache_space(*base[:2], "int8", base[3]),
        cache_space(*base[:3], 128),
        cache_space(*base[:3], None),
    }
    assert len(spaces) == 6


@pytest.mark.parametrize(
    ("compute_type", "batch_size", "cached"),
    [
        ("float32", 16, True),
        ("int8", 1, True),
        ("int8", 2, False),
        ("bfloat16", 16, False),
        ("bfloat16", 1, False),
        ("float16", 16, False),
    ],
)
def test_the_cache_is_on_only_where_an_embedding_is_its_passages_alone(
    compute_type, batch_size, cached
):
    assert (company_moves(compute_type, batch_size) is None) is cached


def test_bf16_keeps_no_passage_cache(tiny_bert_dir):
    r = DenseReranker(str(tiny_bert_dir), dtype="bfloat16", passage_cache_mb=64)
    assert r.passage_cache is None
    assert r.passage_cache_off == "bfloat16 rounds each batch's products differently"


@needs_onnxruntime
def test_onnx_float32_and_int8_share_no_entry(tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = EmbeddingCache(1 << 20)
    f32 = DenseReranker(str(tiny_bert_dir), backend="onnx", dtype="float32", passage_cache=cache)
    int8 = DenseReranker(str(tiny_bert_dir), backend="onnx", dtype="int8", passage_cache=cache)
    plain = DenseReranker(str(tiny_bert_dir), backend="onnx", dtype="int8", passage_cache_mb=0)
    f32.score(QUERIES[0], PASSAGES)
    int8.score(QUERIES[0], PASSAGES)
    assert cache.stats()["hits"] == 0 and len(cache) == 2 * DISTINCT
    # int8 embeds one text a batch: cached and uncached are the same vectors, exactly
    assert int8.score(QUERIES[1], PASSAGES) == plain.score(QUERIES[1], PASSAGES)
    assert cache.stats()["hits"] == DISTINCT


def test_the_option_reaches_the_dense_part_of_a_hybrid_and_the_hybrid_declares_its_cache(
    tiny_bert_dir,
):
    from cisrank.rerank import load_reranker

    r = load_reranker(
        "hybrid", str(tiny_bert_dir), fuse="dense:1,first-stage:0.5", passage_cache_mb=2
    )
    dense = r.components["dense"]
    assert r.passage_cache is dense.passage_cache is not None
    assert dense.passage_cache.budget_bytes == 2 << 20
    r.score(QUERIES[0], PASSAGES)
    r.score(QUERIES[1], PASSAGES)
    assert r.passage_cache.stats()["hits"] == DISTINCT
    off = load_reranker("hybrid", str(tiny_bert_dir), fuse="dense:1", passage_cache_mb=0)
    assert off.passage_cache is None


def test_a_server_config_sets_the_budget_and_refuses_a_negative_one():
    from cisrank.errors import CisrankError
    from cisrank.rerank.configs import DenseRerankerConfig
    from cisrank.serving.config import RerankerSpec, ServerConfig

    config = ServerConfig.model_validate(
        {"rerankers": {"d": {"kind": "dense", "options": {"passage_cache_mb": 8}}}}
    )
    assert config.rerankers["d"] == RerankerSpec(kind="dense", options={"passage_cache_mb": 8})
    assert DenseRerankerConfig().passage_cache_mb == 64
    with pytest.raises((CisrankError, ValueError), match="passage_cache_mb"):
        ServerConfig.model_validate(
            {"rerankers": {"d": {"kind": "dense", "options": {"passage_cache_mb": -1}}}}
        )
