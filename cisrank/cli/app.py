"""The `cisrank` command. A stable contract: flags are documented, errors are one line and exit 2.

One module per verb group: `eval`, `rerank`, `search`, `context`, `generate`, `index`,
`distill`, `serve`; this module only assembles them and turns a `CisrankError` into its one-line
message and exit code.
"""

from __future__ import annotations

import sys

import typer

from cisrank.cli.context import context
from cisrank.cli.distill import distill_app
from cisrank.cli.eval import eval_app
from cisrank.cli.generate import generate
from cisrank.cli.index import index_app
from cisrank.cli.models import models_app
from cisrank.cli.rerank import rerank
from cisrank.cli.search import search
from cisrank.cli.serve import serve
from cisrank.errors import CisrankError

app = typer.Typer(
    name="cisrank",
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
