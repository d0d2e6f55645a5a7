"""Cross-encoder reranker: raw logits equal to `CrossEncoder.predict` with identity activation."""

import importlib.util
import itertools
import sys

import numpy as np
import pytest
import torch
from sentence_transformers import CrossEncoder
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from cisrank import testing
from cisrank.cli.reranker_flags import flags_of
from cisrank.data.types import rank_order
from cisrank.errors import CisrankError, MissingExtraError, ModelNotFoundError
from cisrank.rerank import Reranker, load_reranker
from cisrank.rerank.configs import CPU_BATCH_SIZE, CrossEncoderRerankerConfig
from cisrank.rerank.cross_encoder import CrossEncoderReranker
from cisrank.runtimes import encoder_onnx

needs_fbgemm = pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines,
    reason="int8 dynamic quantization runs on x86 (fbgemm) only",
)
QUERY = "When was the author of Hamlet born?"
# Mixed lengths (from 1 word to ~100 tokens, so batches need padding) and one passage twice (2, 5).
PASSAGES = [
    *testing.SAMPLE_SENTENCES[:2],
    "Paris is the capital of France.",
    testing.SAMPLE_SENTENCES[3],
    " ".join(testing.SAMPLE_SENTENCES * 3),
    "Paris is the capital of France.",
    " ".join(testing.SAMPLE_SENTENCES[:3]),
    "Hamlet",
]


def predict(path, pairs, **kwargs):
    """The reference: sentence-transformers' own predict, raw logits."""
    model = CrossEncoder(str(path), device="cpu", **kwargs)
    return model.predict(pairs, activation_fn=torch.nn.Identity(), show_progress_bar=False)


def test_scores_equal_predict_with_identity_activation(ce_dir):
    want = predict(ce_dir, [(QUERY, p) for p in PASSAGES])
    assert np.ptp(want) > 0.02  # the scores differ by 2000x the tolerance
    for batch_size in (1, 2, 64):
        r = CrossEncoderReranker(model=str(ce_dir), batch_size=batch_size, dtype="float32")
        assert isinstance(r, Reranker)
        assert r.dtype == torch.float32 and r.config.quantize == "none"
        got = r.score(QUERY, PASSAGES)
        assert got == pytest.approx(want.tolist(), abs=1e-5), batch_size
    reverse = CrossEncoderReranker(model=str(ce_dir), dtype="float32").score(QUERY, PASSAGES[::-1])
    assert reverse == pytest.approx(want[::-1].tolist(), abs=1e-5)


def test_default_dtype_and_batch_size_on_cpu(ce_dir):
    r = CrossEncoderReranker(model=str(ce_dir), device="cpu")
    assert r.dtype == torch.float32
    assert r.batch_size == CPU_BATCH_SIZE["torch"] == 32
    assert CrossEncoderReranker(model=str(ce_dir), quantize="int8").dtype == torch.float32


def test_max_length_truncates_like_predict(ce_dir):
    want = predict(ce_dir, [(QUERY, p) for p in PASSAGES], max_length=12)
    r = CrossEncoderReranker(model=str(ce_dir), max_length=12, dtype="float32")
    got = r.score(QUERY, PASSAGES)
    assert got == pytest.approx(want.tolist(), abs=1e-5)
    assert np.abs(np.subtract(got, predict(ce_dir, [(QUERY, p) for p in PASSAGES]))).max() > 1e-4


@pytest.mark.parametrize(
    "options", [{"dtype": "float32"}, {}, pytest.param({"quantize": "int8"}, marks=needs_fbgemm)]
)
def test_score_batch_equals_score_per_query_and_dedupes(ce_dir, options):
    """float32 is exact up to rounding whatever the batches; bf16 and int8 results can move with
    the batch a pair lands in (padding width; int8 activation scales), within their precision."""
    r = CrossEncoderReranker(model=str(ce_dir), batch_size=3, **options)
    tol = 1e-5 if r.dtype == torch.float32 and r.config.quantize == "none" else 0.01
    other = "Which city is the capital of France?"
    requests = [(QUERY, PASSAGES), (other, PASSAGES[2:6]), (QUERY, PASSAGES[:3]), (other, [])]
    many = r.score_batch(requests)
    assert [len(s) for s in many] == [len(p) for _, p in requests]
    for (q, p), s in zip(requests, many, strict=True):
        assert s == pytest.approx(r.score(q, p), abs=tol)
    # A pair asked for twice is scored once, so it gets exactly the same number.
    assert many[2] == many[0][:3]
    assert many[0][2] == many[0][5]  # "Paris is the capital of France." twice in PASSAGES
    assert r.score_batch([]) == []
    assert r.score_batch([(QUERY, [])]) == [[]]
    assert r.score(QUERY, []) == []
    with pytest.raises(CisrankError, match="not one string"):
        r.score_batch([(QUERY, "a passage")])


def test_rerank_orders_by_score(ce_dir):
    r = load_reranker("cross-encoder", str(ce_dir), batch_size=2)
    scores = r.score(QUERY, PASSAGES)
    ranked = r.rank(QUERY, PASSAGES, top_n=4)
    assert [p.index for p in ranked] == rank_order(scores)[:4]
    assert [p.text for p in ranked] == [PASSAGES[i] for i in rank_order(scores)[:4]]
    assert all(x.score >= y.score for x, y in itertools.pairwise(ranked))
    everything = r.rank(QUERY, PASSAGES)
    positions = {p.index: k for k, p in enumerate(everything)}
    assert positions[2] < positions[5]  # the duplicate's tie keeps input order
    assert r.rank(QUERY, []) == []


@needs_fbgemm
def test_int8_is_close_to_float32(ce_dir):
    """Tolerance: int8 may move scores by quantization noise, never reorder them grossly.

    Dynamic int8 keeps ~8 bits per activation tensor; through 2 layers the error on the logit
    is a small fraction of the spread of scores across passages. On this random tiny model it is
    1.3% of that spread (correlation 0.9997); 5% and > 0.99 leave room for other CPUs' kernels
    (7-bit activations without VNNI). On real DL19 passages with a MiniLM-L6 encoder int8 does
    worse (0.97-0.98 per query, bench/cross_encoder.py), hence opt-in.
    """
    fp32 = np.array(CrossEncoderReranker(model=str(ce_dir), dtype="float32").score(QUERY, PASSAGES))
    r8 = CrossEncoderReranker(model=str(ce_dir), quantize="int8")
    int8 = np.array(r8.score(QUERY, PASSAGES))
    quantized = [n for n, m in r8.runner.net.named_modules() if isinstance(m, DynamicLinear)]
    assert len(quantized) == 2 * 6  # 2 layers x (q, k, v, attention out, intermediate, out)
    assert type(r8.runner.net.classifier) is torch.nn.Linear  # the head stays float32
    assert type(r8.runner.net.bert.pooler.dense) is torch.nn.Linear
    assert np.corrcoef(int8, fp32)[0, 1] > 0.99
    assert np.abs(int8 - fp32).max() < 0.05 * np.ptp(fp32)
    assert int8[2] == int8[5]  # duplicates still share one score


def test_bf16_runs_within_bf16_rounding(ce_dir):
    """bf16 keeps 8 significant bits (relative step 2**-8 = 0.4%): through 2 layers the logit
    stays within a few of those steps of float32 (here 1.2% of the largest score; 3% allowed).
    This tiny random model's scores differ by only ~3% of their size, so it cannot show ranking
    agreement: on real DL19 passages bf16 correlates 0.9999 with float32 (bench/cross_encoder.py).
    """
    fp32 = np.array(CrossEncoderReranker(model=str(ce_dir), dtype="float32").score(QUERY, PASSAGES))
    r = CrossEncoderReranker(model=str(ce_dir), dtype="bfloat16")
    assert r.dtype == torch.bfloat16
    assert r.runner.net.bert.encoder.layer[0].attention.self.query.weight.dtype == torch.bfloat16
    # The head runs in float32: scores are not rounded to bf16's 8 significant bits.
    assert r.runner.net.classifier.weight.dtype == torch.float32
    assert r.runner.net.bert.pooler.dense.weight.dtype == torch.float32
    bf16 = np.array(r.score(QUERY, PASSAGES))
    step = 2.0 ** (np.floor(np.log2(np.abs(bf16))) - 7)  # bf16 spacing at each score
    assert np.any(np.abs(bf16 / step - np.round(bf16 / step)) > 1e-3)
    assert np.abs(bf16 - fp32).max() < 0.03 * np.abs(fp32).max()
    assert bf16[2] == bf16[5]


def test_load_reranker_and_option_errors(ce_dir):
    r = load_reranker("cross-encoder", str(ce_dir), batch_size=5, device="cpu", quantize="none")
    assert isinstance(r, CrossEncoderReranker)
    assert r.name == "cross-encoder" and r.model_name == str(ce_dir) and r.batch_size == 5
    with pytest.raises(CisrankError, match="--template"):
        load_reranker("cross-encoder", str(ce_dir), template="qa")
    with pytest.raises(CisrankError, match="needs a model"):
        load_reranker("cross-encoder", "")
    with pytest.raises(CisrankError, match="unknown cross-encoder option"):
        CrossEncoderReranker(model=str(ce_dir), bogus=1)
    with pytest.raises(CisrankError, match="float32"):
        CrossEncoderReranker(model=str(ce_dir), quantize="int8", dtype="bfloat16")
    with pytest.raises(CisrankError, match="positions"):
        CrossEncoderReranker(model=str(ce_dir), max_length=100_000)
    with pytest.raises(CisrankError, match="quantize"):
        load_reranker("cross-encoder", str(ce_dir), quantize="int4")
    with pytest.raises(ValueError):
        CrossEncoderRerankerConfig(quantize="int4")


def test_missing_or_wrong_model_folder(tiny_bert_dir, tmp_path):
    missing = tmp_path / "no-such-student"
    with pytest.raises(ModelNotFoundError, match="no-such-student"):
        load_reranker("cross-encoder", str(missing))
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    with pytest.raises(ModelNotFoundError, match="empty"):
        load_reranker("cross-encoder", str(not_a_model))
    # A bare encoder (or a bi-encoder) would get a random head: refused.
    with pytest.raises(CisrankError, match="not a cross-encoder"):
        load_reranker("cross-encoder", str(tiny_bert_dir))


# ---------------------------------------------------------------------- backend="onnx"
needs_onnxruntime = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None,
    reason="the onnx backend needs the 'onnx' extra: pip install 'cisrank[onnx]'",
)
RELEVANT = {
    QUERY: "Shakespeare was born in 1564 in Stratford-upon-Avon.",
    "Which city is the capital of France?": "Paris is the capital of France.",
}
IRRELEVANT = "Goldfish grow to the size of their tank in some cases."


@pytest.fixture
def onnx_cache(tmp_path, monkeypatch):
    """Exports go under this test's own cache folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "cisrank" / "onnx"


def exports(cache):
    """The export folders of an ONNX cache (not the writers' lock files beside them)."""
    return [p for p in cache.iterdir() if not p.name.endswith(".lock")]


@pytest.fixture
def export_calls(monkeypatch):
    """Counts the ONNX exports and int8 quantizations made."""
    calls = {"export": 0, "quantize": 0}
    export, quantize = encoder_onnx._export_onnx, encoder_onnx._quantize_onnx

    def counted_export(source, out):
        calls["export"] += 1
        return export(source, out)

    def counted_quantize(folder):
        calls["quantize"] += 1
        return quantize(folder)

    monkeypatch.setattr(encoder_onnx, "_export_onnx", counted_export)
    monkeypatch.setattr(encoder_onnx, "_quantize_onnx", counted_quantize)
    return calls


@pytest.fixture(scope="module")
def trained_ce_dir(tiny_bert_dir, tmp_path_factory):
    """The tiny cross-encoder trained for a few steps to score each query's relevant passage
    above the others (a random head ranks at random), so that a ranking check means something."""
    torch.manual_seed(0)
    model = CrossEncoder(str(tiny_bert_dir), num_labels=1, device="cpu")
    net, tokenizer = model.model.train(), model.tokenizer
    pairs, labels = [], []
    for query, relevant in RELEVANT.items():
        for passage in testing.SAMPLE_SENTENCES:
            pairs.append((query, passage))
            labels.append(1.0 if passage == relevant else 0.0)
    enc = tokenizer([q for q, _ in pairs], [p for _, p in pairs], padding=True, return_tensors="pt")
    target = torch.tensor(labels)
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(40):
        optimizer.zero_grad()
        logits = net(**enc).logits[:, 0]
        torch.nn.functional.binary_cross_entropy_with_logits(logits, target).backward()
        optimizer.step()
    net.eval()
    out = tmp_path_factory.mktemp("trained-cross-encoder")
    model.save_pretrained(str(out))
    return out


@needs_onnxruntime
def test_onnx_float32_scores_as_torch_in_any_batch(ce_dir, onnx_cache):
    reference = CrossEncoderReranker(model=str(ce_dir), dtype="float32")
    want = reference.score(QUERY, PASSAGES)
    for batch_size in (1, 3, 64):
        r = CrossEncoderReranker(model=str(ce_dir), backend="onnx", batch_size=batch_size)
        assert r.backend == "onnx" and r.compute_type == "float32" and r.runner.name == "onnx"
        assert r.score(QUERY, PASSAGES) == pytest.approx(want, abs=1e-4), batch_size
    # one batch or many, alone or with other requests: the same numbers (float32, no int8 scales)
    other = "Which city is the capital of France?"
    requests = [(QUERY, PASSAGES), (other, PASSAGES[2:6]), (QUERY, PASSAGES[:3]), (other, [])]
    many = r.score_batch(requests)
    for (q, p), s in zip(requests, many, strict=True):
        assert s == pytest.approx(reference.score(q, p), abs=1e-4)
        assert s == pytest.approx(r.score(q, p), abs=1e-6)
    assert many[2] == many[0][:3] and many[0][2] == many[0][5]  # duplicates scored once
    assert r.score_batch([]) == [] and r.score(QUERY, []) == []
    # the same tokenizer and truncation as the torch path: capabilities unchanged
    assert r.pair_token_limit == reference.pair_token_limit
    assert r.fast_tokenizer is not None and r.tokenize([(QUERY, PASSAGES[4])]) == (
        reference.tokenize([(QUERY, PASSAGES[4])])
    )
    short = CrossEncoderReranker(model=str(ce_dir), backend="onnx", max_length=12)
    assert short.batch_size == CPU_BATCH_SIZE["onnx"] == 8  # ONNX Runtime float32
    want12 = CrossEncoderReranker(model=str(ce_dir), dtype="float32", max_length=12)
    assert short.pair_token_limit == 12
    assert short.score(QUERY, PASSAGES) == pytest.approx(want12.score(QUERY, PASSAGES), abs=1e-4)
    assert "backend='onnx'" in repr(r)


@needs_onnxruntime
def test_onnx_int8_is_close_to_float32_and_keeps_a_learned_ranking(trained_ce_dir, onnx_cache):
    """Tolerance: as torch int8's (`test_int8_is_close_to_float32`): correlation > 0.99 with
    float32 and every score within 5% of the spread of the scores; measured here 0.999998 and
    0.25%. The trained tiny model tells each query's relevant passage apart by a wide margin,
    which int8 keeps."""
    passages = [*testing.SAMPLE_SENTENCES, *PASSAGES[4:]]
    fp32 = np.array(
        CrossEncoderReranker(model=str(trained_ce_dir), dtype="float32").score(QUERY, passages)
    )
    r8 = CrossEncoderReranker(model=str(trained_ce_dir), backend="onnx", dtype="int8")
    assert r8.compute_type == "int8" and (r8.runner.folder / "model-int8.onnx").is_file()
    int8 = np.array(r8.score(QUERY, passages))
    assert np.corrcoef(int8, fp32)[0, 1] > 0.99
    assert np.abs(int8 - fp32).max() < 0.05 * np.ptp(fp32)
    for query, relevant in RELEVANT.items():
        good, bad = r8.score(query, [relevant, IRRELEVANT])
        assert good > bad + 1.0, (query, good, bad)
    # what was quantized: the encoder's 12 weight products (2 layers x query, key, value,
    # attention output, intermediate, output), the first three inside each fused attention
    # (QAttention); the head, pooler and the attention's own products stay float32
    import onnx

    assert r8.runner.info["fused"]["ops"]["Attention"] == 2
    graph = onnx.load(str(r8.runner.folder / "model-int8.onnx")).graph
    integer = [n.name for n in graph.node if n.op_type == "MatMulInteger"]
    attention = [n.op_type for n in graph.node if n.op_type.endswith("Attention")]
    assert attention == ["QAttention"] * 2
    assert len(integer) + 3 * len(attention) == 2 * 6
    assert not [n for n in integer if "pooler" in n or "classifier" in n]


@needs_onnxruntime
def test_int8_scores_a_pair_alone_so_no_neighbour_moves_it(trained_ce_dir, onnx_cache):
    """Dynamic int8 takes its activation scale over the whole batch tensor: at 8 pairs a
    passage's score moves with the passages batched beside it (the request's order, another
    client's request in a served batch; 0.135 on the shipped student over DL19). By default
    int8 scores one pair a batch, so a pair's score is the same in any order, any subset and
    any company of other requests, as the float runtimes' are."""
    passages = [*testing.SAMPLE_SENTENCES, *PASSAGES]
    order = list(range(len(passages)))[::-1]
    for options in ({"backend": "onnx", "dtype": "int8"}, {"quantize": "int8"}):
        r8 = CrossEncoderReranker(model=str(trained_ce_dir), **options)
        assert r8.batch_size == CPU_BATCH_SIZE["int8"] == 1
        alone = [r8.score(QUERY, [p])[0] for p in passages]
        assert r8.score(QUERY, passages) == alone, options
        assert r8.score(QUERY, [passages[i] for i in order]) == [alone[i] for i in order]
        _, mixed = r8.score_batch([(next(iter(RELEVANT)), passages[:3]), (QUERY, passages)])
        assert mixed == alone
    # what one batch of 8 did instead: the same passages, other numbers in another company
    batched = CrossEncoderReranker(
        model=str(trained_ce_dir), backend="onnx", dtype="int8", batch_size=8
    )
    moved = np.array(batched.score(QUERY, passages)) - np.array(
        [batched.score(QUERY, [p])[0] for p in passages]
    )
    assert np.abs(moved).max() > 1e-4


@needs_onnxruntime
def test_onnx_export_is_made_once_and_remade_when_damaged(ce_dir, onnx_cache, export_calls):
    want = CrossEncoderReranker(model=str(ce_dir), backend="onnx").score(QUERY, PASSAGES)
    assert export_calls == {"export": 1, "quantize": 0}
    (folder,) = exports(onnx_cache)
    assert folder.name.startswith(ce_dir.name + "-cross-encoder-")
    CrossEncoderReranker(model=str(ce_dir), backend="onnx", batch_size=2)
    CrossEncoderReranker(model=str(ce_dir), backend="onnx", dtype="int8")
    CrossEncoderReranker(model=str(ce_dir), backend="onnx", dtype="int8")
    assert export_calls == {"export": 1, "quantize": 1}  # int8 is made once from the export

    (folder / "model.onnx").unlink()  # missing: made again
    r = CrossEncoderReranker(model=str(ce_dir), backend="onnx")
    assert export_calls["export"] == 2
    assert r.score(QUERY, PASSAGES) == pytest.approx(want, abs=1e-6)
    (folder / "model.onnx").write_bytes(b"not a model")  # damaged: made again
    r = CrossEncoderReranker(model=str(ce_dir), backend="onnx")
    assert export_calls["export"] == 3
    assert r.score(QUERY, PASSAGES) == pytest.approx(want, abs=1e-6)
    # no leftovers but the writers' lock, kept on purpose (as a pull's)
    assert [p.name for p in onnx_cache.iterdir() if p.name.startswith(".")] == [
        f".{folder.name}.lock"
    ]


@needs_onnxruntime
def test_an_export_of_an_older_format_is_made_again(ce_dir, onnx_cache, export_calls):
    """An export made before fusion (format 1, no "format" in its record) is not served as is:
    it is made again in the current format."""
    import json

    want = CrossEncoderReranker(model=str(ce_dir), backend="onnx").score(QUERY, PASSAGES)
    (folder,) = exports(onnx_cache)
    record = folder / "cisrank-onnx.json"
    info = json.loads(record.read_text())
    assert info["format"] == encoder_onnx.EXPORT_FORMAT and info["fused"]["ops"]["Attention"]
    del info["format"]
    record.write_text(json.dumps(info))
    r = CrossEncoderReranker(model=str(ce_dir), backend="onnx")
    assert export_calls["export"] == 2 and r.runner.info["format"] == encoder_onnx.EXPORT_FORMAT
    assert r.score(QUERY, PASSAGES) == pytest.approx(want, abs=1e-6)


@needs_onnxruntime
def test_a_fusion_that_changes_the_scores_is_not_kept(ce_dir, onnx_cache, monkeypatch):
    """The optimizer's graph is checked against the unfused export on pairs of other lengths:
    one that scores differently (here its classifier bias moved by 0.01) is dropped, the
    unfused graph served, and the record says why."""
    from onnx import numpy_helper
    from onnxruntime.transformers import optimizer

    optimize = optimizer.optimize_model

    def off(*args, **kwargs):
        fused = optimize(*args, **kwargs)
        (bias,) = [t for t in fused.model.graph.initializer if t.name.endswith("classifier.bias")]
        bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 0.01, bias.name))
        return fused

    monkeypatch.setattr(optimizer, "optimize_model", off)
    reference = CrossEncoderReranker(model=str(ce_dir), dtype="float32")
    r = CrossEncoderReranker(model=str(ce_dir), backend="onnx")
    assert r.runner.info["fused"] == {"ops": {}, "reason": "fused graph off by 0.01"}
    assert r.score(QUERY, PASSAGES) == pytest.approx(reference.score(QUERY, PASSAGES), abs=1e-4)
    assert sorted(p.name for p in r.runner.folder.glob("*.onnx")) == ["model.onnx"]


@needs_onnxruntime
def test_an_export_that_never_loads_is_a_one_line_error(ce_dir, onnx_cache, monkeypatch):
    export = encoder_onnx._export_onnx

    def broken(source, out):
        info = export(source, out)
        (out / "model.onnx").write_bytes(b"not a model")
        return info

    monkeypatch.setattr(encoder_onnx, "_export_onnx", broken)
    with pytest.raises(CisrankError, match="cannot load the ONNX export") as caught:
        CrossEncoderReranker(model=str(ce_dir), backend="onnx")
    assert "\n" not in str(caught.value)


@needs_onnxruntime
def test_auto_backend_is_onnx_int8_on_a_cpu_unless_asked_otherwise(ce_dir, onnx_cache, monkeypatch):
    """`backend="auto"`: the measured fast path (ONNX Runtime int8) on a CPU; torch wherever a
    dtype or torch's quantization is asked for, or onnxruntime is missing; workers resolve it
    the same way from the same options; `CISRANK_ENCODER_BACKEND` overrides it process-wide."""
    monkeypatch.delenv("CISRANK_ENCODER_BACKEND")
    auto = CrossEncoderReranker(model=str(ce_dir), backend="auto")
    assert (auto.backend, auto.compute_type) == ("onnx", "int8")
    int8 = CrossEncoderReranker(model=str(ce_dir), backend="onnx", dtype="int8")
    assert auto.score(QUERY, PASSAGES) == pytest.approx(int8.score(QUERY, PASSAGES), abs=1e-6)
    for options, compute in (({"dtype": "float32"}, "float32"), ({"quantize": "int8"}, "int8")):
        r = CrossEncoderReranker(model=str(ce_dir), backend="auto", **options)
        assert (r.backend, r.compute_type) == ("torch", compute), options
    assert CrossEncoderReranker(model=str(ce_dir)).backend == "onnx"  # auto is the default
    monkeypatch.setenv("CISRANK_ENCODER_BACKEND", "torch")
    assert CrossEncoderReranker(model=str(ce_dir)).backend == "torch"
    monkeypatch.setenv("CISRANK_ENCODER_BACKEND", "ctranslate2")
    with pytest.raises(CisrankError, match="CISRANK_ENCODER_BACKEND='ctranslate2'"):
        CrossEncoderReranker(model=str(ce_dir))
    monkeypatch.delenv("CISRANK_ENCODER_BACKEND")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    assert CrossEncoderReranker(model=str(ce_dir), backend="auto").backend == "torch"


def test_onnx_without_onnxruntime_names_the_extra(ce_dir, onnx_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(MissingExtraError, match=r"cisrank\[onnx\]") as caught:
        load_reranker("cross-encoder", str(ce_dir), backend="onnx")
    assert caught.value.extra == "onnx" and "\n" not in str(caught.value)
    assert not onnx_cache.exists()  # nothing exported


@needs_onnxruntime
def test_onnx_options_and_model_errors(ce_dir, tiny_bert_dir, tmp_path, onnx_cache):
    r = load_reranker("cross-encoder", str(ce_dir), backend="onnx", dtype="float32")
    assert isinstance(r, CrossEncoderReranker) and r.backend == "onnx"
    with pytest.raises(CisrankError, match="causal LMs only"):
        load_reranker("cross-encoder", str(ce_dir), backend="ctranslate2")
    with pytest.raises(CisrankError, match="dtype='int8'"):
        CrossEncoderReranker(model=str(ce_dir), backend="onnx", quantize="int8")
    with pytest.raises(CisrankError, match="not a compute type of the onnx backend"):
        CrossEncoderReranker(model=str(ce_dir), backend="onnx", dtype="bfloat16")
    with pytest.raises(CisrankError, match="runs on the CPU"):
        CrossEncoderReranker(model=str(ce_dir), backend="onnx", device="cuda")
    with pytest.raises(CisrankError, match="onnx backend's compute type"):
        CrossEncoderReranker(model=str(ce_dir), dtype="int8")
    with pytest.raises(CisrankError, match="positions"):
        CrossEncoderReranker(model=str(ce_dir), backend="onnx", max_length=100_000)
    with pytest.raises(ModelNotFoundError, match="no-such-student"):
        load_reranker("cross-encoder", str(tmp_path / "no-such-student"), backend="onnx")
    with pytest.raises(CisrankError, match="not a cross-encoder"):  # checked by the export
        load_reranker("cross-encoder", str(tiny_bert_dir), backend="onnx")
    assert [p.name for p in exports(onnx_cache)] == [r.runner.folder.name]


def test_backend_and_dtype_are_flags_shared_with_cis():
    flags = {f.field: f for f in flags_of()}
    assert {"cis", "cross-encoder"} <= set(flags["backend"].kinds)
    assert {"cis", "cross-encoder"} <= set(flags["dtype"].kinds)
    # the measured fast path is the default (bench/RESULTS.md); exact torch is asked for by name
    assert CrossEncoderRerankerConfig().backend == "auto"


def test_the_cpu_default_is_float32_even_with_native_bf16(ce_dir, monkeypatch):
    """float32 by default on every CPU (CISRANK_CPU_BF16 stands in for a native-bf16 CPU, so this
    runs on any host): there bf16 logits moved with their batch company beyond DL21's tolerance
    (bench/bf16_invariance.py); bf16 whenever asked for."""
    monkeypatch.setenv("CISRANK_CPU_BF16", "1")
    assert CrossEncoderReranker(model=str(ce_dir), device="cpu").dtype == torch.float32
    asked = CrossEncoderReranker(model=str(ce_dir), device="cpu", dtype="bfloat16")
    assert asked.dtype == torch.bfloat16


def test_a_truncated_tokenizer_without_a_provenance_is_named(ce_dir, tmp_path):
    """A folder of one's own (no provenance to check) whose tokenizer.json was cut in half was
    reported as transformers' "Unrecognized processing class", naming no file."""
    import shutil

    copy = tmp_path / "ce"
    shutil.copytree(ce_dir, copy)
    tokenizer = copy / "tokenizer.json"
    data = tokenizer.read_bytes()
    tokenizer.write_bytes(data[: len(data) // 2])
    with pytest.raises(CisrankError) as raised:
        load_reranker("cross-encoder", str(copy), backend="torch")
    message = str(raised.value)
    assert message.startswith(f"cannot load cross-encoder '{copy}': its file tokenizer.json: ")
    assert message.endswith(f"(not JSON: truncated or damaged?): restore the folder {copy}")
    assert "Unrecognized processing class" not in message
