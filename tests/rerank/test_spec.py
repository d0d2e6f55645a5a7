"""Reranker specs (`{kind, model, options}`): read from a file, checked against the registry's
kind configs before any model loads, one-line errors naming the file and the entry."""

from __future__ import annotations

import json

import pytest

from cisrank.errors import CisrankError
from cisrank.rerank.spec import RerankerSpec, parse_specs, read_specs
from cisrank.serving.config import RerankerSpec as ServedSpec
from cisrank.serving.config import ServerConfig

GOOD = {
    "first-stage": {"kind": "none"},
    "mini": {"kind": "dense", "model": "all-MiniLM-L6-v2"},
    "cis-no-prior": {
        "kind": "cis",
        "model": "m",
        "options": {"estimator": "forward", "template": "qa", "prior": False},
    },
    "hybrid": {"kind": "hybrid", "model": "m", "options": {"fuse": "cis:0.3,dense:0.7"}},
    "custom": {"kind": "my.module:factory", "options": {"anything": 1}},
}


def test_a_server_configs_rerankers_are_the_same_schema(tmp_path):
    assert ServedSpec is RerankerSpec
    path = tmp_path / "server.json"
    path.write_text(json.dumps({"rerankers": GOOD}))
    served = ServerConfig.load(path).rerankers
    assert read_specs(path) == served  # a server config is read as its rerankers
    bare = tmp_path / "rerankers.json"
    bare.write_text(json.dumps(GOOD))
    assert read_specs(bare) == served
    yaml_file = tmp_path / "rerankers.yaml"
    yaml_file.write_text("mini:\n  kind: dense\n  model: all-MiniLM-L6-v2\n")
    assert read_specs(yaml_file) == {"mini": served["mini"]}


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"kind": "nope"}, "unknown reranker 'nope'"),
        ({"kind": "cis", "options": {"estimatr": "reverse"}}, "--estimatr: not options"),
        ({"kind": "cis", "options": {"estimator": "sideways"}}, "estimator"),
        ({"kind": "cis", "options": {"estimator": "reverse", "prior": False}}, "no prior term"),
        ({"kind": "hybrid", "options": {"fuse": "cis:x"}}, "--fuse"),
        ({"kind": "none", "model": "m"}, "keeps the input order"),
        ({"kind": "dense", "workers": 0}, "bad.workers"),
        ({"model": "m"}, "bad.kind"),
    ],
)
def test_a_bad_entry_is_one_line_naming_file_and_entry(tmp_path, entry, needle):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"ok": {"kind": "dense"}, "bad": entry}))
    with pytest.raises(CisrankError) as info:
        read_specs(path)
    message = str(info.value)
    assert message.startswith(f"{path}: bad") and needle in message and "\n" not in message


def test_files_that_are_not_rerankers(tmp_path):
    with pytest.raises(CisrankError, match="does not exist"):
        read_specs(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(CisrankError, match="not valid JSON"):
        read_specs(broken)
    with pytest.raises(CisrankError, match=r"expected an object \{name"):
        parse_specs(["dense"], "cli")


def test_only_the_entries_asked_for_are_read(tmp_path):
    """An entry of a kind not (yet) registered does not stop a run of the others."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"later": {"kind": "not-yet"}, **GOOD}))
    assert list(read_specs(path, ["mini", "custom"])) == ["mini", "custom"]
    with pytest.raises(CisrankError, match="unknown reranker 'not-yet'"):
        read_specs(path)
    with pytest.raises(CisrankError, match=r"has no reranker nope, gone: it names later, "):
        read_specs(path, ["mini", "nope", "gone"])


def test_several_files_merge_and_a_name_means_one_reranker(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"mini": GOOD["mini"], "first-stage": GOOD["first-stage"]}))
    b.write_text(json.dumps({"mini": GOOD["mini"], "hybrid": GOOD["hybrid"]}))
    assert list(read_specs([a, b])) == ["mini", "first-stage", "hybrid"]
    assert list(read_specs([a, b], ["hybrid"])) == ["hybrid"]
    b.write_text(json.dumps({"mini": {"kind": "dense", "model": "other"}}))
    with pytest.raises(CisrankError, match=r"b.json: mini is another reranker in an earlier file"):
        read_specs([a, b])
