"""One record per index kind: its parameters (a typed config), builder and opener; the CLI's kinds
and defaults come from it, and manifests keep recording parameters as they always did."""

import json

import pytest
from typer.testing import CliRunner

from cisrank.cli import app
from cisrank.cli.index import build_app
from cisrank.data.manifest import read_manifest
from cisrank.errors import CisrankError
from cisrank.indexes.build import build_index
from cisrank.indexes.kinds import KINDS, open_index
from cisrank.retrieval.base import IndexConfig
from cisrank.retrieval.bm25 import BM25IndexConfig
from cisrank.retrieval.dense import DenseIndexConfig

runner = CliRunner()


@pytest.fixture
def corpus(tmp_path):
    p = tmp_path / "corpus.jsonl"
    rows = [("a", "brown fox"), ("b", "lazy dog"), ("c", "brown dog")]
    p.write_text("".join(json.dumps({"id": d, "text": t}) + "\n" for d, t in rows))
    return p


def test_every_kind_has_a_config_a_builder_and_a_build_command():
    commands = {c.name for c in build_app.registered_commands}
    assert commands == set(KINDS) == {"bm25", "lucene", "dense", "prior"}
    for name, kind in KINDS.items():
        config = kind.load_config()
        assert issubclass(config, IndexConfig) and config.label == name
        assert callable(kind.load_builder())
        opener = kind.load().opener
        assert (opener is None) == (name == "prior")
        assert opener is None or callable(opener)


def test_bm25_manifest_params_are_exactly_the_old_dict(tmp_path, corpus):
    # The manifest format is a contract: the typed config dumps the same plain dict as before.
    m = build_index("bm25", corpus, tmp_path / "i", progress=False)
    assert (
        read_manifest(tmp_path / "i").params
        == m.params
        == {
            "k1": 0.9,
            "b": 0.4,
            "lowercase": True,
            "stopwords": "lucene",
            "stemmer": "porter",
        }
    )


def test_dense_manifest_written_before_dtype_existed_still_opens(tmp_path, corpus, tiny_bert_dir):
    out = tmp_path / "d"
    m = build_index("dense", corpus, out, {"model": str(tiny_bert_dir)}, progress=False)
    data = m.to_json()
    del data["params"]["dtype"], data["model"]["dtype"]
    del data["checksums"], data["digest"]  # nor had manifests of that time checksums
    (out / "manifest.json").write_text(json.dumps(data))
    r = open_index(out)
    assert r.config == DenseIndexConfig(model=str(tiny_bert_dir))
    assert r.search("brown fox", 1)[0].docid in {"a", "b", "c"}


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("bm25", {"b": 1.5}, "bm25 options: b: Input should be less than or equal to 1"),
        ("bm25", {"k2": 1}, r"unknown bm25 parameters \['k2'\]"),
        ("lucene", {"threads": 0}, "lucene options: threads: Input should be greater than"),
        ("dense", {"index_type": "lsh"}, "dense options: index_type: Input should be 'flat'"),
        ("prior", {"model": "gpt2", "max_doc_tokens": 0}, "prior options: max_doc_tokens"),
    ],
)
def test_bad_params_fail_in_one_line_before_the_folder_is_touched(
    tmp_path, corpus, kind, params, message
):
    with pytest.raises(CisrankError, match=message) as err:
        build_index(kind, corpus, tmp_path / "i", params, progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "i").exists()


def test_cli_flags_default_to_the_config_and_say_so(tmp_path, corpus):
    res = runner.invoke(app, ["index", "build", "bm25", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert f"(default {BM25IndexConfig.model_fields['k1'].default})" in res.output
    assert "(default 0.4)" in res.output
    res = runner.invoke(app, ["index", "build", "dense", "--help"], env={"COLUMNS": "200"})
    assert "(default 8192)" in res.output and "--dtype" in res.output
    # flags left out are the config's defaults; a given flag overrides only itself
    res = runner.invoke(
        app, ["index", "build", "bm25", "--corpus", str(corpus), "--out", str(tmp_path / "i"),
              "--b", "0.75", "-q"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert read_manifest(tmp_path / "i").params == BM25IndexConfig(b=0.75).model_dump()
