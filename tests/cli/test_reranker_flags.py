"""Reranker flags are generated from the configs' `Flag()` fields: the same names as ever on every
verb, help from the field, and the values reach the reranker's spec (`RerankerSpec.of`) as the
config holds them."""

from pathlib import Path
from typing import Any

import pytest
from cli.helpers import help_pages
from typer.testing import CliRunner

from cisrank.cli import app
from cisrank.cli.reranker_flags import flags_of, reranker_flags
from cisrank.config import Flag
from cisrank.rerank.registry import KINDS

runner = CliRunner()

RERANKER_FLAGS = {
    "--estimator",
    "--template",
    "--reverse-template",
    "--max-doc-tokens",
    "--prior-store",
    "--normalize",
    "--quantize",
    "--fuse",
    "--fusion",
    "--backend",
    "--dtype",
    "--passage-cache-mb",
}
TEACHER_FLAGS = RERANKER_FLAGS - {
    "--normalize",
    "--quantize",
    "--fuse",
    "--fusion",
    "--passage-cache-mb",
}


def _help(*verb: str) -> str:
    """The verb's main help and its kinds' pages (`--help-kind KIND`), one after the other."""
    return "".join(help_pages(*verb).values())


@pytest.mark.parametrize(
    ("verb", "flags"),
    [
        (["eval", "trec-dl19"], RERANKER_FLAGS),
        (["eval", "trec-dl21"], RERANKER_FLAGS),
        (["eval", "run"], RERANKER_FLAGS),
        (["rerank"], RERANKER_FLAGS),
        (["distill", "generate"], TEACHER_FLAGS),
        (["distill", "run"], TEACHER_FLAGS),
    ],
)
def test_every_verb_keeps_its_reranker_flags_with_help_from_the_config(verb, flags):
    out = _help(*verb)
    for flag in flags:
        assert f" {flag} " in out
    for flag in RERANKER_FLAGS - flags:
        assert f" {flag} " not in out
    cis = KINDS["cis"].config.model_fields
    assert f"(default {cis['max_doc_tokens'].default})" in out
    assert "x>=1" in out  # max_doc_tokens' ge=1 is the flag's range, as before
    generated = out.partition("╭─ --")[2]  # the panels of the generated flags
    assert generated.count("\n│ ") >= len(flags)
    for python_type in ("<bool>", "<Literal", "<list", "<dict", "None"):
        assert python_type not in generated


def test_generated_flags_are_exactly_the_marked_fields():
    marked = {
        "--" + field.replace("_", "-")
        for kind in KINDS.values()
        for field, info in kind.config.model_fields.items()
        if any(isinstance(m, Flag) for m in info.metadata)
    }
    assert marked == {f.name for f in flags_of()} == RERANKER_FLAGS


def test_flag_values_reach_the_spec_as_the_config_holds_them(monkeypatch, tmp_path):
    seen: dict[str, Any] = {}

    def of(cls, name, model=None, **options):
        seen.update(options, name=name, model=model)
        raise SystemExit(0)

    monkeypatch.setattr("cisrank.rerank.registry.RerankerSpec.of", classmethod(of))
    passages = tmp_path / "p.txt"
    passages.write_text("one\ntwo\n")
    args = ["rerank", "--query", "q", "--passages", str(passages), "-r", "cis", "-m", "m"]
    res = runner.invoke(
        app, [*args, "--prior-store", "./x//p.sqlite", "--max-doc-tokens", "9", "--fuse", "cis:1"]
    )
    assert res.exit_code == 0, res.output
    assert seen["prior_store"] == str(Path("x/p.sqlite"))  # a path, as typer always parsed it
    assert seen["max_doc_tokens"] == 9 and seen["fuse"] == "cis:1"
    assert seen["template"] is None and seen["batch_size"] is None  # left out: the default
    res = runner.invoke(app, [*args, "--max-doc-tokens", "0"])
    assert res.exit_code == 2 and "max-doc-tokens" in res.output


def test_the_decorator_needs_a_place_for_the_flags_and_no_clash():
    def no_options(reranker: str = "none") -> None: ...

    def clash(template: str = "", **options: Any) -> None: ...

    with pytest.raises(TypeError, match="no \\*\\*options"):
        reranker_flags()(no_options)
    with pytest.raises(TypeError, match="template"):
        reranker_flags()(clash)
    with pytest.raises(TypeError, match="template"):
        reranker_flags(kinds=["cis"], omit=["normalize"])(clash)
    assert [f.field for f in flags_of(["hybrid"])] == ["fuse", "fusion"]
