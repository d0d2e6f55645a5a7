"""`manifest.json`: what an index directory holds, written last so that its presence means complete.

Readers (`open_index`, `cisrank index info`, the API) trust an index directory only when its
manifest exists and parses; a build writes every other file first and the manifest atomically at
the end, so an interrupted build can never look complete.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from cisrank import __version__
from cisrank.errors import DataError
from cisrank.fileio import atomic_write_text

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1


def library_versions(*packages: str) -> dict[str, str | None]:
    """Installed versions of the packages an index depends on (None where not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version(), "cisrank": __version__}
    for pkg in packages:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


@dataclass
class Manifest:
    kind: str
    params: dict[str, Any]
    corpus: dict[str, Any]
    files: list[str]
    model: dict[str, Any] | None = None
    libraries: dict[str, str | None] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    """Atomically write the manifest; call only after every other file of the index is final."""
    manifest.build.setdefault("finished_at", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    missing = [f for f in manifest.files if not (directory / f).exists()]
    if missing:
        raise RuntimeError(f"refusing to write a manifest for missing files: {missing}")
    text = json.dumps(manifest.to_json(), indent=2, ensure_ascii=False) + "\n"
    return atomic_write_text(directory / MANIFEST_FILE, text)


def read_manifest(directory: str | Path) -> Manifest:
    """The manifest of a complete index, or a `DataError` saying why the folder is not one."""
    directory = Path(directory).expanduser()
    path = directory / MANIFEST_FILE
    if not directory.is_dir():
        raise DataError(f"index folder '{directory}' does not exist")
    if not path.is_file():
        raise DataError(
            f"'{directory}' is not a complete index (no {MANIFEST_FILE}): its build was "
            "interrupted or never ran; rerun `cisrank index build ...` with the same --out"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        manifest = Manifest.from_json(data)
    except (json.JSONDecodeError, TypeError) as exc:
        raise DataError(f"{path}: unreadable manifest ({exc}); rebuild the index") from None
    if manifest.format_version > FORMAT_VERSION:
        raise DataError(
            f"{path}: index format {manifest.format_version} is newer than this cisrank "
            f"understands ({FORMAT_VERSION}); upgrade cisrank"
        )
    return manifest


@dataclass
class BuildOutput:
    """What a builder reports back: its files (relative to the index folder) and provenance."""

    files: list[str]
    params: dict[str, Any]
    libraries: dict[str, str | None]
    model: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
