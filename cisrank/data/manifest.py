"""`manifest.json`: what an index directory holds, written last so that its presence means complete.

Readers (`open_index`, `cisrank index info`, the API) trust an index directory only when its
manifest exists and parses; a build writes every other file first and the manifest atomically at
the end, so an interrupted build can never look complete.

Integrity: the manifest records the size and block checksums (sha256 per 64 MiB) of every file
of the index (`checksums`), and a digest of its own content (`digest`), so a flipped byte or a
truncation anywhere, manifest included, is found before the index ranks anything: `check_files`
names the damaged file. A file a reader may append to (the prior store) is marked `mutable`: a
changed checksum there is not damage by itself, and its own per-row checksums decide.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import threading
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from cisrank.errors import DamagedFileError, DataError
from cisrank.fileio import (
    HASH_ALGORITHM,
    HASH_BLOCK_BYTES,
    atomic_write_text,
    block_digests,
    first_bad_block,
)
from cisrank.version import __version__

log = logging.getLogger(__name__)

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
    checksums: dict[str, Any] | None = None
    """{algorithm, block_bytes, files: {relative path: {bytes, blocks}}, mutable: [...]};
    None in manifests written before checksums were recorded."""
    digest: str | None = None
    """sha256 of the manifest's own canonical JSON without this field."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def _content_digest(data: dict[str, Any]) -> str:
    body = {k: v for k, v in data.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    """Atomically write the manifest; call only after every other file of the index is final."""
    manifest.build.setdefault("finished_at", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    missing = [f for f in manifest.files if not (directory / f).exists()]
    if missing:
        raise RuntimeError(f"refusing to write a manifest for missing files: {missing}")
    data = manifest.to_json()
    manifest.digest = data["digest"] = _content_digest(data)
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    return atomic_write_text(directory / MANIFEST_FILE, text)


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "kind": str,
    "params": dict,
    "corpus": dict,
    "files": list,
    "model": (dict, type(None)),
    "libraries": dict,
    "build": dict,
    "format_version": int,
    "checksums": (dict, type(None)),
    "digest": (str, type(None)),
}


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
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError: a ValueError
        raise DamagedFileError(path, f"not a JSON manifest: {exc}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read the manifest ({exc.strerror or exc})") from None
    if not isinstance(data, dict):
        raise DamagedFileError(path, "not a JSON object")
    wrong = [k for k, t in _FIELD_TYPES.items() if k in data and not isinstance(data[k], t)]
    if wrong or not all(k in data for k in ("kind", "params", "corpus", "files")):
        raise DamagedFileError(path, f"fields missing or of the wrong type: {wrong or 'required'}")
    if data.get("digest") is not None and data["digest"] != _content_digest(data):
        raise DamagedFileError(path, "its content does not match its digest")
    manifest = Manifest.from_json(data)
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
    mutable: list[str] = field(default_factory=list)
    """Files that readers may append to after the build (the prior store): their checksums
    record the build's state, their own content checks decide whether they are damaged."""


# ------------------------------------------------------------------------------- checksums


def _expand(directory: Path, names: list[str]) -> list[str]:
    """Every regular file under the listed names (a listed folder stands for its files)."""
    out: list[str] = []
    for name in names:
        p = directory / name
        if p.is_dir():
            out += sorted(f.relative_to(directory).as_posix() for f in p.rglob("*") if f.is_file())
        else:
            out.append(name)
    return out


def record_checksums(
    directory: Path, files: list[str], mutable: list[str] | tuple[str, ...] = ()
) -> dict[str, Any]:
    """Size and block checksums of every file of an index, for its manifest."""
    entries = {}
    for name in _expand(directory, files):
        path = directory / name
        entries[name] = {"bytes": path.stat().st_size, "blocks": block_digests(path)}
    return {
        "algorithm": HASH_ALGORITHM,
        "block_bytes": HASH_BLOCK_BYTES,
        "files": entries,
        "mutable": sorted(mutable),
    }


@dataclass(frozen=True)
class FileCheck:
    """How one file of an index compares with what its manifest recorded."""

    name: str
    status: str
    """ok, damaged, missing, or changed (a mutable file, to be judged by its own checks)."""
    detail: str = ""

    @property
    def bad(self) -> bool:
        return self.status in ("damaged", "missing")


# Files found intact in this process, by identity and modification: `cisrank serve` checks every
# index before the server starts, and the server (in the same process) then opens it without
# hashing it again. A file changed since has another size or mtime and is hashed again.
_verified: set[tuple[Any, ...]] = set()
_verified_lock = threading.Lock()


def _identity(path: Path) -> tuple[Any, ...]:
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _check_one(
    directory: Path, name: str, entry: Any, block_bytes: int, mutable: bool
) -> FileCheck:
    path = directory / name
    if not path.is_file():
        return FileCheck(name, "missing", "recorded in the manifest but not on disk")
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("bytes"), int)
        or not isinstance(entry.get("blocks"), list)
    ):
        return FileCheck(name, "damaged", f"its checksum entry in {MANIFEST_FILE} is malformed")
    bad = "changed" if mutable else "damaged"
    size = path.stat().st_size
    if size != entry["bytes"]:
        return FileCheck(name, bad, f"{size} bytes, {entry['bytes']} when built")
    key = _identity(path)
    if key in _verified:
        return FileCheck(name, "ok")
    block = first_bad_block(path, entry["blocks"], block_bytes)
    if block is not None:
        lo = block * block_bytes
        return FileCheck(
            name, bad, f"checksum mismatch in bytes {lo}-{min(size, lo + block_bytes) - 1}"
        )
    with _verified_lock:
        _verified.add(key)
    return FileCheck(name, "ok")


def check_files(directory: str | Path, manifest: Manifest) -> list[FileCheck]:
    """Every file of the index against its recorded size and checksums (empty list when the
    manifest predates checksums). Hashes in parallel threads: about 1.3 GB/s per core."""
    directory = Path(directory).expanduser()
    sums = manifest.checksums
    if not sums:
        return []
    files = sums.get("files")
    block_bytes = sums.get("block_bytes")
    if (
        sums.get("algorithm") != HASH_ALGORITHM
        or not isinstance(files, dict)
        or not isinstance(block_bytes, int)
        or block_bytes < 1
    ):
        return [FileCheck(MANIFEST_FILE, "damaged", "its checksums section is malformed")]
    mutable = set(sums.get("mutable") or [])
    return [
        _check_one(directory, name, entry, block_bytes, name in mutable)
        for name, entry in files.items()
    ]


def verify_files(directory: str | Path, manifest: Manifest) -> None:
    """Raise `DamagedFileError` naming the first damaged or missing file of the index; warn once
    when the manifest has no checksums (built before they were recorded)."""
    directory = Path(directory).expanduser()
    if not manifest.checksums:
        log.warning(
            "%s: no checksums recorded (built by an older cisrank): damage cannot be detected; "
            "rebuild the index to record them",
            directory,
        )
        return
    for check in check_files(directory, manifest):
        if check.bad:
            raise DamagedFileError(directory / check.name, check.detail)
