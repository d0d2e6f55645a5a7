"""The help of every command speaks the user's words: no Python types (`<bool>` for a flag,
`<list[Path]>` for a repeatable option), repeatable options show the item they take, and the
terminal, not the source file, decides where a help paragraph wraps."""

from __future__ import annotations

import re

import pytest
import typer.main
from cli.helpers import help_text
from typer.testing import CliRunner

from cisrank.cli import app


def _verbs(command, path=()):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _verbs(sub, (*path, name))


VERBS = list(_verbs(typer.main.get_command(app)))


def test_every_verb_is_checked():
    assert {("rerank",), ("search",), ("serve",), ("index", "verify"), ("models", "pull")} <= set(
        VERBS
    )


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: " ".join(v) or "cisrank")
def test_help_shows_no_python_types(verb):
    out = help_text(*verb)
    for python_type in (
        "<bool>",
        "<list",
        "list[",
        "<Path>",
        "None]",
        "(default False)",
        "PydanticUndefin",
    ):
        assert python_type not in out, (verb, python_type)


def _rows(*verb: str) -> dict[str, list[str]]:
    """Each option's help row from its long name on, less its short name: `--index` ->
    `["<path>", "Index", ...]`."""
    rows = {}
    for line in help_text(*verb).splitlines():
        words = [w.rstrip(",") for w in line.strip("│ ").split() if w != "*"]
        if words and words[0].startswith("--"):
            rows[words[0]] = [w for w in words[1:] if not (w.startswith("-") and len(w) == 2)]
    return rows


def test_flags_show_no_type_and_repeatable_options_their_item():
    search = _rows("search")
    assert search["--index"][:2] == ["<path>", "Index"]
    assert search["--json"][0] == "Machine-readable" and search["--help"][0] == "Show"
    assert _rows("eval", "run")["--first-stage"][:2] == ["<path>", "Index"]
    assert _rows("context")["--field"][:2] == ["<str>", "NAME=VALUE"]
    assert re.search(r"paths\.\.\.\s+<path>", help_text("index", "verify"))


def _command(verb: tuple[str, ...]):
    command = typer.main.get_command(app)
    for name in verb:
        command = command.commands[name]
    return command


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: " ".join(v) or "cisrank")
def test_help_paragraphs_are_left_to_the_terminal_to_wrap(verb):
    """typer's rich help keeps a docstring's line breaks after its first paragraph: on an
    80-column terminal `serve --help` came out as half-lines ("... checked and the port is" /
    "bound first ...")."""
    for paragraph in (_command(verb).help or "").split("\n\n"):
        assert "\n" not in paragraph or paragraph.startswith("\b"), (verb, paragraph)
    if verb == ("serve",):
        out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "80"}).output
        assert "the port is bound first" in " ".join(out.split())
        assert not any(line.strip() == "the port is" for line in out.splitlines()), out
