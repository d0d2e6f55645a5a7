"""The help reads on an 80-column terminal: every description column at least 40 characters
wide (typer's columns left 17, and `serve --help` ran to 250 lines), `serve --help` under 100
lines with each reranker kind's options on a page of their own (`--help-kind KIND`), and every
option of every command in the main help or on one of its kind pages."""

from __future__ import annotations

import pytest
import typer.main
from cli.helpers import help_pages
from typer.testing import CliRunner

from cisrank.cli import app

WIDTH = 80
NARROWEST = 40


def _verbs(command, path=()):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _verbs(sub, (*path, name))


VERBS = list(_verbs(typer.main.get_command(app)))


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(WIDTH)})


def _row_width(page: str, name: str, first_word: str) -> int | None:
    """The width of the description column on the row of `name` (an option's long name, a
    command's name): from where its description's first word starts to the panel's border.
    None when no row of the page starts with `name`."""
    for line in page.splitlines():
        inner = line.removeprefix("│ ")
        if inner == line or not any(inner.startswith(name + end) for end in (" ", ",", "...")):
            continue
        if not first_word:  # no description: nothing to be narrow
            return WIDTH
        start = line.find(first_word, len("│ ") + len(name))
        assert start > 0, (name, first_word, line)
        end = line.rindex("│")
        return end - 1 - start
    return None


def _params(command):
    ctx = command.context_class(command, info_name=command.name)
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None and not getattr(param, "hidden", False):
            yield param, record[1]


@pytest.mark.parametrize(
    ("path", "command"), VERBS, ids=[" ".join(path) or "cisrank" for path, _ in VERBS]
)
def test_every_option_is_shown_with_a_wide_description(path, command):
    pages = help_pages(*path, columns=WIDTH)
    for page in pages.values():
        assert all(len(line) <= WIDTH for line in page.splitlines()), page
    for param, text in _params(command):
        names = [o for o in param.opts if o.startswith("--")] or [param.name]
        first = (text.split() or [""])[0]
        widths = {
            where: w
            for where, page in pages.items()
            if (w := _row_width(page, names[0], first)) is not None
        }
        assert widths, f"{' '.join(path)}: {names[0]} is in no help page"
        for where, width in widths.items():
            assert width >= NARROWEST, (path, where, names[0], width)
    for name, sub in getattr(command, "commands", {}).items():
        first = (sub.help or "").split()[0]
        width = _row_width(pages["--help"], name, first)
        assert width is not None and width >= NARROWEST, (path, name, width)


def test_serve_help_is_short_and_points_to_each_kinds_page():
    out = _invoke("serve", "--help").output
    lines = out.splitlines()
    assert len(lines) < 100, len(lines)
    # The common flags first, the kinds after them, one line each at least.
    starts = [line.split()[1] if line.startswith(("│ ", "╭─ ")) else "" for line in lines]
    assert starts.index("--config,") < starts.index("--help-kind") < starts.index("--reranker")
    for kind in ("cis", "cross-encoder", "dense", "student", "hybrid"):
        assert any(line.startswith(f"│ {kind} ") for line in lines), kind
    assert "│ --estimator" not in out and "--rrf-k" not in out

    def rows(page: str) -> set[str]:
        return {line.split()[1] for line in page.splitlines() if line.startswith("│ --")}

    cis = rows(_invoke("serve", "--help-kind", "cis").output)
    assert {"--estimator", "--prior", "--prior-store", "--batch-size"} <= cis
    assert "--rrf-k" not in cis and "--config," not in cis
    hybrid = rows(_invoke("serve", "--help-kind", "hybrid").output)
    assert {"--fuse", "--rrf-k", "--models"} <= hybrid and "--estimator" not in hybrid


def test_the_options_count_on_the_kinds_line_is_the_pages():
    out = _invoke("serve", "--help").output
    line = next(line for line in out.splitlines() if line.startswith("│ dense "))
    count = int(line.split()[2])
    page = _invoke("serve", "--help-kind", "dense").output
    rows = [line for line in page.splitlines() if line.startswith("│ --")]
    assert count == len(rows) > 0


def test_an_unknown_kind_is_a_usage_error_naming_the_kinds():
    res = _invoke("serve", "--help-kind", "bm25")
    assert res.exit_code == 2
    text = " ".join(res.output.replace("│", " ").split())
    assert "'bm25': give one of cis, cross-encoder, dense, student, hybrid" in text


def test_one_kind_only_stays_in_the_main_help():
    """`distill generate`'s teacher flags are all cis's: no page of their own."""
    out = _invoke("distill", "generate", "--help").output
    assert "--help-kind" not in out and "--estimator" in out
