"""The Python API at the top level: `cisrank.load_reranker(kind, model=...)` and
`reranker.rank(query, documents, top_n=None)`, the same for every kind.

The first test runs the README's example, taken from README.md, with the server's default
reranker (all-MiniLM-L6-v2 on `backend="auto"`: ONNX Runtime int8 with the `onnx` extra); the
others run every kind on the tiny models of `cisrank.testing`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import cisrank
from cisrank.data.types import RankedPassage, rank_order

DOCUMENTS = [
    "Paris is the capital of France.",
    "William Shakespeare wrote Hamlet.",
    "Hamlet is a tragedy set in Denmark.",
]
QUERY = "Who wrote Hamlet?"
README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_python_api_example(marker: str = "top_n=3") -> str:
    """The README's Python block that calls `cisrank.load_reranker` and holds `marker`, as
    written there."""
    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), re.S | re.M)
    (example,) = [b for b in blocks if "cisrank.load_reranker(" in b and marker in b]
    return example


def _shown_after(example: str) -> list[str]:
    shown = README.read_text(encoding="utf-8").split(example, 1)[1]
    lines = re.search(r"```text\n(.*?)```", shown, re.S)
    assert lines is not None, "the README shows no output after its example"
    return lines.group(1).splitlines()


def test_readme_long_document_example(capsys, monkeypatch):
    """The README's long-document example, run as written with the shipped student on its
    default runtime (the suite pins the cross-encoder to torch; a user's `auto` is not pinned):
    it prints what the README shows, and the answer at the page's end is found by its best
    window, not by the first."""
    monkeypatch.delenv("CISRANK_ENCODER_BACKEND", raising=False)
    example = _readme_python_api_example("chunking=")
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert capsys.readouterr().out.splitlines() == _shown_after(example)
    page, hits = namespace["page"], namespace["hits"]
    best = hits[0].best_chunk
    assert hits[0].index == 0 and page[best.start : best.end].endswith("wrote Hamlet around 1600.")


def test_readme_example_with_the_default_reranker(capsys):
    """The README's example, extracted from README.md and run as written, offline, on the
    bi-encoder a bare `cisrank serve` answers /v1/rerank with; it prints what the README shows
    below it."""
    example = _readme_python_api_example()
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    lines = capsys.readouterr().out.splitlines()
    assert lines == _shown_after(example)
    assert len(lines) == 3 and lines[0].startswith("1 ")
    assert lines[0].endswith("William Shakespeare wrote Hamlet.")
    reranker, documents = namespace["reranker"], namespace["documents"]
    hits = reranker.rank("Who wrote Hamlet?", documents)
    assert [h.index for h in hits][:1] == [1] and len(hits) == 3
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(h.document == documents[h.index] for h in hits)
    # the bare server's default, all-MiniLM-L6-v2 on ONNX Runtime int8 on a CPU with the extra
    import importlib.util

    import torch

    from cisrank.serving.config import ServerConfig

    bare = ServerConfig()
    assert bare.rerankers[bare.default_reranker_name].options == {"backend": "auto"}
    assert reranker.model_name == "all-MiniLM-L6-v2"
    if importlib.util.find_spec("onnxruntime") and not torch.cuda.is_available():
        assert (reranker.runtime, reranker.compute_type) == ("onnx", "int8")


@pytest.fixture(scope="module")
def kinds(tiny_gpt2_dir, tiny_bert_dir, tmp_path_factory) -> dict[str, tuple[str | None, dict]]:
    """Every kind, on a tiny model: (model, options)."""
    from sentence_transformers import CrossEncoder

    cross_encoder = tmp_path_factory.mktemp("cross-encoder")  # saved as training saves one
    CrossEncoder(str(tiny_bert_dir), num_labels=1).save_pretrained(str(cross_encoder))
    return {
        "dense": (str(tiny_bert_dir), {}),
        "cross-encoder": (str(cross_encoder), {"dtype": "float32"}),
        "cis": (str(tiny_gpt2_dir), {}),
        "hybrid": (str(tiny_gpt2_dir), {"fuse": "cis:0.5,first-stage:0.5"}),
        "none": (None, {}),
    }


@pytest.mark.parametrize("kind", ["dense", "cross-encoder", "cis", "hybrid", "none"])
def test_every_kind_ranks_documents_best_first(kinds, kind):
    model, options = kinds[kind]
    reranker = cisrank.load_reranker(kind, model=model, **options)
    try:
        scores = reranker.score(QUERY, DOCUMENTS)
        hits = reranker.rank(QUERY, DOCUMENTS)
        assert all(isinstance(h, RankedPassage) for h in hits)
        assert [h.index for h in hits] == rank_order(scores)
        assert [h.score for h in hits] == pytest.approx([scores[h.index] for h in hits])
        assert [h.document for h in hits] == [DOCUMENTS[h.index] for h in hits]
        top = reranker.rank(QUERY, DOCUMENTS, top_n=2)
        assert [(h.index, h.document) for h in top] == [(h.index, h.document) for h in hits[:2]]
        assert reranker.rank(QUERY, []) == []
        assert [h.text for h in hits] == [h.document for h in hits]  # `document` is `text`
    finally:
        reranker.close()


def test_rank_refuses_one_string_and_a_bad_top_n(kinds):
    reranker = cisrank.load_reranker("none")
    with pytest.raises(TypeError, match="list of strings"):
        reranker.rank(QUERY, "one document")
    with pytest.raises(ValueError, match="top_n must be >= 1"):
        reranker.rank(QUERY, DOCUMENTS, top_n=0)


def test_import_cisrank_is_light_and_names_its_api():
    code = (
        "import sys, cisrank\n"
        "assert 'load_reranker' in dir(cisrank) and 'rank' in dir(cisrank.Reranker)\n"
        "cisrank.load_reranker, cisrank.RankedPassage\n"
        "heavy = [m for m in ('torch', 'transformers', 'sentence_transformers') "
        "if m in sys.modules]\n"
        "print(cisrank.__version__, heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [cisrank.__version__, "[]"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cisrank.nope  # noqa: B018
