"""Structured documents: ranked by their fields as `field: value` lines, in the order given."""

from __future__ import annotations

import pytest

from cisrank.rerank.base import BaseReranker
from cisrank.rerank.fields import MissingField, render, render_all

RECORD = {"id": 7, "title": "Hamlet", "body": "a tragedy", "year": 1600, "tags": ["play", "é"]}


def test_fields_render_in_the_order_given_values_as_they_read():
    got = render(RECORD, ["year", "title", "tags"], 0)
    assert got == 'year: 1600\ntitle: Hamlet\ntags: ["play", "é"]'


def test_strings_holding_json_or_yaml_are_records():
    json_doc = '{"title": "Hamlet", "body": "a tragedy"}'
    yaml_doc = "title: Hamlet\nbody: a tragedy\n"
    assert render(json_doc, ["body", "title"], 0) == "body: a tragedy\ntitle: Hamlet"
    assert render(yaml_doc, ["body", "title"], 0) == "body: a tragedy\ntitle: Hamlet"


def test_prose_is_its_text_even_where_it_parses_as_yaml():
    prose = "Note: Hamlet is a tragedy"  # YAML would read {"Note": ...}
    assert render(prose, ["text"], 0) == "text: Note: Hamlet is a tragedy"
    with pytest.raises(MissingField) as err:
        render_all(["fine text", prose], ["text", "title"])
    assert (err.value.index, err.value.field) == (0, "title")
    assert "documents[0] has no field 'title'" in str(err.value)


def test_a_missing_field_names_the_document_and_the_field():
    with pytest.raises(MissingField) as err:
        render_all([RECORD, {"title": "Macbeth"}], ["title", "body"])
    assert (err.value.index, err.value.field) == (1, "body")


class Counting(BaseReranker):
    name = "count"

    def score_batch(self, requests):
        return [[float(p.count("hamlet")) for p in ps] for q, ps in requests]


def test_rank_by_fields_equals_ranking_the_rendered_lines():
    docs = [{"title": "macbeth", "body": "hamlet hamlet"}, '{"title": "hamlet", "body": "x"}']
    ranked = Counting().rank("q", docs, rank_fields=["title"])
    assert [(p.index, p.score, p.text) for p in ranked] == [
        (1, 1.0, "title: hamlet"),
        (0, 0.0, "title: macbeth"),
    ]
    both = Counting().rank("q", docs, rank_fields=["body", "title"])
    assert [(p.index, p.score) for p in both] == [(0, 2.0), (1, 1.0)]
    with pytest.raises(TypeError, match="records need rank_fields"):
        Counting().rank("q", docs)


def test_aliases_and_deep_nesting_are_prose_never_an_expansion_or_a_crash():
    # Nine levels of ten aliases each would render 10**9 values; aliases are not read.
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    laughs = "\n".join(levels)
    with pytest.raises(MissingField):  # read as prose: {"text": ...}, which has no l8
        render(laughs, ["l8"], 0)
    for deep in ("{" * 100_000 + '"text"', "text: " + "[" * 100_000):
        assert render(deep, ["text"], 0).startswith("text: ")
