"""The `cisrank` command. A stable contract: flags are documented, errors are one line and exit 2.

One module per verb group: `eval`, `rerank`, `search`, `context`, `generate`, `index`,
`distill`, `serve`; this module only assembles them, says how their help shows value types, and
turns a `CisrankError` into its one-line message and exit code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import PurePath
from typing import Any, get_args

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

from cisrank.cli.context import context
from cisrank.cli.distill import distill_app
from cisrank.cli.eval import eval_app
from cisrank.cli.generate import generate
from cisrank.cli.help_format import KIND_FLAGS, install_help
from cisrank.cli.index import index_app
from cisrank.cli.models import models_app
from cisrank.cli.rerank import rerank
from cisrank.cli.search import search
from cisrank.cli.serve import serve
from cisrank.errors import CisrankError


def _commands(command: Any) -> Iterator[Any]:
    """`command` and every command below it."""
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _commands(sub)


def _item_type(param: TyperOption | TyperArgument) -> str:
    """`<path>` or `<str>` for a parameter of type `list[Path]` or `list[str]`."""
    (item,) = get_args(param.type_descriptor.annotation)
    return "<path>" if issubclass(item, PurePath) else f"<{item.__name__}>"


def _shown_as(label: str) -> Callable[[Any], str]:
    return lambda ctx: label


def _plain_value_types(command: Any) -> None:
    """The help's type column in the user's words, not Python's: nothing for a flag (typer
    shows `<bool>`, `--help` included), the item of a repeatable parameter (`<path>`, not
    `<list[Path]>`; the help text says that it repeats) and a bounded number's type (`<int>`,
    not `<int range>`)."""
    context = command.context_class(command, **command.context_settings)
    params = [*command.params, command.get_help_option(context)]
    for param in params:
        if isinstance(param, TyperOption) and param.metavar is None:
            if param.is_flag:
                param.metavar = ""
            elif param.type_descriptor.is_list:
                param.metavar = _item_type(param)
            elif param.type_descriptor.annotation in (int, float):
                # A bounded number's range is in its description ([x>=1]).
                param.metavar = f"<{param.type_descriptor.annotation.__name__}>"
        elif isinstance(param, TyperArgument) and param.type_descriptor.is_list:
            # An argument's metavar is its name in the usage line, so its type is set here.
            param.display_type_rich = _shown_as(_item_type(param))  # type: ignore[method-assign,assignment]


def _unwrapped(text: str | None) -> str | None:
    """Each paragraph of a command's help as one line, for the terminal to wrap: typer's rich
    help keeps the line breaks of a docstring after its first paragraph, so source lines of 95
    characters came out as ragged half-lines on an 80-column terminal. Paragraphs stay apart,
    and one marked with click's `\b` keeps its lines."""
    if not text:
        return text
    paragraphs = text.split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


class _Cisrank(TyperGroup):
    """The root command: its tree is built once per run (typer builds it from `app`), and this
    sets every command's value types, help paragraphs and help layout (`help_format`: the
    terminal's full width, a reranker kind's flags on a page of their own) as it is built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in _commands(self):
            _plain_value_types(command)
            command.help = _unwrapped(command.help)
            install_help(command, getattr(command.callback, KIND_FLAGS, None))


app = typer.Typer(
    name="cisrank",
    cls=_Cisrank,
    help="Retrieval and reranking by causal relevance (CIS) for retrieval-augmented generation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(eval_app, name="eval")
app.command("rerank")(rerank)
app.command("search")(search)
app.command("context")(context)
app.command("generate")(generate)
app.add_typer(index_app, name="index")
app.add_typer(distill_app, name="distill")
app.add_typer(models_app, name="models")
app.command("serve")(serve)


@app.command("version")
def version() -> None:
    """Print the versions of cisrank and its main dependencies."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v

    for pkg in ("cisrank", "torch", "transformers", "sentence-transformers", "ir_measures"):
        try:
            typer.echo(f"{pkg} {v(pkg)}")
        except PackageNotFoundError:
            typer.echo(f"{pkg} not installed")


def main() -> None:
    from cisrank.log import setup_logging

    # transformers draws a "Loading weights" bar of its own for every model it loads (two for
    # one dense reranker), interleaved with cisrank's output; cisrank's own bars are plain tqdm
    # and stay. Read when huggingface_hub is first imported, which no verb has done yet here;
    # set it to 0 to see them again.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    setup_logging()
    try:
        app()
    except CisrankError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
