"""Models that ship inside cisrank itself: this project's own trained student.

Why a second kind of named model beside the pulled ones (`cisrank.models.catalogue`): the best
fast reranker cisrank has measured is its own distilled cross-encoder, and a user must get it
with the package, with no download and no two hours of training. Its weights are the one
exception to "no weights in the repository": float16 safetensors (half the bytes of float32,
under 50 MB for a MiniLM-L6 student) that every loader widens to float32 (`config.json` keeps
`"dtype": "float32"`, so transformers' `dtype="auto"` widens them too, and cisrank's cross-encoder
asks for float32 by name).

A shipped folder is checked like a pulled one: its `cisrank-provenance.json` records the size
and sha256 of every file and a sha256 of itself (`cisrank.models.integrity`), and every load goes
through `cisrank.models.resolve.resolve_model`, which verifies it; a damaged file is refused in
one line naming it and the remedy (reinstall cisrank; there is nothing to pull). The provenance
also records the float32 student the files were made from, so `cisrank distill ship --check`
can show that `make student`'s weights turn into these exact files.

The facts users read (kind, licence, architecture, what chose it) are data in `catalogue.json`
under `shipped`, beside the pulled models, so `cisrank models list` shows both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

SHIPPED_FORMAT = "shipped"
"""The provenance `format` of a shipped folder (a pulled one says gguf or zip)."""


@dataclass(frozen=True)
class ShippedModel:
    """One model inside the package: where its folder is and what it is."""

    name: str
    folder: Path
    kind: str
    licence: str
    source_model: str
    architecture: str
    summary: str

    @classmethod
    def from_json(cls, name: str, fields: Mapping[str, Any], root: Path) -> ShippedModel:
        data = dict(fields)
        folder = root / str(data.pop("folder"))
        return cls(name=name, folder=folder, **data)


def _package_root() -> Path:
    return Path(str(resources.files("cisrank.models")))


def shipped_root() -> Path:
    """The folder that holds every shipped model (inside the installed package)."""
    return _package_root() / "shipped"


def load_shipped() -> dict[str, ShippedModel]:
    """Every shipped model by name, from `catalogue.json`'s `shipped` table."""
    text = resources.files("cisrank.models").joinpath("catalogue.json").read_text("utf-8")
    table = json.loads(text).get("shipped", {})
    root = _package_root()
    return {name: ShippedModel.from_json(name, f, root) for name, f in table.items()}


def shipped_model(name: str) -> ShippedModel | None:
    """The shipped model called `name` (case-insensitive), or None."""
    return load_shipped().get(name.strip().lower())


def student_folder() -> Path:
    """Where the shipped student's files live in this installation."""
    return shipped_root() / "cisrank-student"


REINSTALL_HINT = (
    "the model ships with cisrank and cannot be pulled: reinstall cisrank "
    "(`pip install --force-reinstall --no-deps cisrank`, or `git checkout -- {folder}` in a clone)"
)


def reinstall_hint(folder: Path) -> str:
    """How to repair a damaged folder of a shipped model: the installed one is reinstalled (or
    checked out again in a clone); a copy of it elsewhere is copied again from the installed
    one. A copy was told `git checkout -- <the copy's path> in a clone`, a path no clone has."""
    try:
        installed = folder.resolve().is_relative_to(shipped_root().resolve())
    except OSError:
        installed = False
    if installed:
        return REINSTALL_HINT.format(folder=folder)
    return (
        "it is a copy of a model that ships with cisrank: copy it again from the installed "
        f"one (in {shipped_root()}), or reinstall cisrank if that one is damaged too"
    )
