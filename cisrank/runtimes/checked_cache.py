"""Conversion caches checked like a pulled model: every file of an ONNX export or a CTranslate2
conversion has its size and sha256 in the folder's record, sealed with a sha256 of the record
itself, and the folder is checked before every load.

Why: a conversion is weights. Zeroing 100 rows of an ONNX export's LM head changed CIS scores
from [16.514, 0.334, -4.874] to [16.641, 12.665, 0.314] with exit 0, and 1 MiB zeroed in its int8
body was an `InvalidProtobuf` traceback, the damaged export never made again (docs/reliability.md,
"Integrity"). A cache can always be made again from its source, so damage here is not refused but
repaired: the folder is removed and converted again, with one warning naming the damaged file.

- The record (`cisrank-onnx.json`, `cisrank-ct2.json`) is the conversion's own facts (source,
  fingerprint, shapes) plus `files` and `provenance_sha256`, written last, atomically, into a
  folder that is renamed into place whole (`cisrank.models.integrity.seal`).
- The check is `cisrank.models.integrity.check_files`: a `stat` per file while its stamp is the
  one recorded when it last hashed right (stamps in the user cache), a full hash otherwise.
  A record without checksums (an export of an older cisrank) or with a broken seal, a missing,
  changed or added file: the folder is made again.
- Files made later from the conversion (the int8 body quantized when int8 is first asked for)
  are added to the record under the same lock (`add_files`), so they are checked the same way.
- Writers hold a file lock beside the folder (`.<folder>.lock`, left in place), and check again
  once they hold it: processes that find the same damage, or the same missing file, convert
  once between them. Readers take no lock: a folder renamed into place is complete, and a file
  being added is caught by the check as "not recorded" until its record is written, which sends
  the reader to the lock, behind the writer.
- The identity a backend reports (what keys prior stores) is the record without `files` and
  its seal, byte for byte what records held before they had checksums: fingerprints, and so
  the priors stored under them, stay valid.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cisrank.errors import CisrankError
from cisrank.fileio import atomic_write_text
from cisrank.models.integrity import (
    DIGEST_FIELD,
    check_files,
    hash_files,
    provenance_digest,
    recorded_files,
    seal,
    write_stamps,
)

log = logging.getLogger(__name__)

FILES_FIELD = "files"


@dataclass(frozen=True)
class CacheCheck:
    """A cache folder against its record: `problem` is None when intact (`record` then holds
    it), else why it must be made again ("" when it does not exist at all)."""

    record: dict[str, Any] | None
    problem: str | None

    @property
    def intact(self) -> bool:
        return self.problem is None


def _files(folder: Path, record_name: str) -> list[str]:
    """Every file under `folder` but the record and hidden ones (a quantizer's `.partial`)."""
    found = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        hidden = any(part.startswith(".") for part in rel.parts)
        if path.is_file() and rel.as_posix() != record_name and not hidden:
            found.append(rel.as_posix())
    return sorted(found)


def read_record(folder: Path, record_name: str) -> dict[str, Any]:
    """A folder's record as written (json, a dict); OSError or ValueError when it is not one
    (one nested too deep to parse too: it was a RecursionError, past the check's repair)."""
    try:
        data = json.loads((folder / record_name).read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError("nested too deep to be a record") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def check(
    folder: Path,
    record_name: str,
    required: Collection[str] = (),
    derived: Collection[str] = (),
) -> CacheCheck:
    """Whether `folder` is a complete conversion that its record vouches for, every file of
    `required` recorded among them. Files named in `derived` (made later from the others) do
    not condemn the folder: `derived_file` checks each before it is used, and makes it again."""
    if not folder.is_dir():
        return CacheCheck(None, "")
    try:
        record = read_record(folder, record_name)
    except FileNotFoundError:
        return CacheCheck(None, f"has no {record_name}")
    except (OSError, ValueError) as exc:
        return CacheCheck(None, f"{record_name} is unreadable ({str(exc).splitlines()[0]})")
    expected = recorded_files(record)
    if expected is None:
        return CacheCheck(None, f"{record_name} records no checksums (an older cisrank made it)")
    if record[DIGEST_FIELD] != provenance_digest(record):
        return CacheCheck(None, f"{record_name} was edited: its sha256 is not the one it records")
    missing = [name for name in required if name not in expected]
    if missing:
        return CacheCheck(None, f"{missing[0]}: not recorded")
    checked = check_files(folder, expected)
    problems = [p for p in checked.problems if p.file not in derived]
    if problems:
        return CacheCheck(None, f"{problems[0].file}: {problems[0].detail}")
    added = [r for r in _files(folder, record_name) if r not in expected and r not in derived]
    if added:
        return CacheCheck(None, f"{added[0]}: not written by the conversion")
    return CacheCheck(record, None)


def write_record(folder: Path, record_name: str, info: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Record every file of a conversion just written into `folder` (before it is renamed into
    place): `info` with `files` and the seal, written atomically; returns the files' stamps, for
    `write_stamps` once the folder is at its final path (a rename keeps them)."""
    files, stamps = hash_files(folder, _files(folder, record_name))
    record = seal(
        {
            **{k: v for k, v in info.items() if k not in (FILES_FIELD, DIGEST_FIELD)},
            FILES_FIELD: files,
        }
    )
    atomic_write_text(folder / record_name, json.dumps(record, indent=2) + "\n")
    return stamps


def add_files(folder: Path, record_name: str, names: Collection[str]) -> None:
    """Add files just made in a recorded folder to its record (under `lock`)."""
    record = read_record(folder, record_name)
    files, stamps = hash_files(folder, names)
    record = seal(
        {
            **{k: v for k, v in record.items() if k != DIGEST_FIELD},
            FILES_FIELD: {**record.get(FILES_FIELD, {}), **files},
        }
    )
    atomic_write_text(folder / record_name, json.dumps(record, indent=2) + "\n")
    write_stamps(folder, stamps)


def identity(record: Mapping[str, Any]) -> bytes:
    """The record as a backend's identity: without its checksums, as records were written
    before they had them (so fingerprints do not move)."""
    info = {k: v for k, v in record.items() if k not in (FILES_FIELD, DIGEST_FIELD)}
    return json.dumps(info, indent=2).encode()


@contextmanager
def lock(folder: Path) -> Iterator[None]:
    """Hold the writers' lock of a cache folder (`.<name>.lock` beside it, kept there: deleting
    a lock file others wait on would let two writers in)."""
    import filelock  # a dependency of huggingface_hub, so of every model stack here

    folder.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(folder.parent / f".{folder.name}.lock")):
        yield


def _unwritable(folder: Path, problem: str, exc: OSError) -> CisrankError:
    """The one line for a cache that must be made where it cannot be written."""
    reason = exc.strerror or str(exc)
    why = f"must be made again ({problem})" if problem else "must be made"
    return CisrankError(
        f"the conversion cache {folder} {why} but cannot be written ({reason}): make "
        f"{folder.parent} writable, or set XDG_CACHE_HOME to a writable folder"
    )


def cached_conversion(
    final: Path,
    record_name: str,
    convert: Callable[[Path], Mapping[str, Any]],
    *,
    required: Collection[str] = (),
    derived: Collection[str] = (),
    what: str = "conversion",
) -> dict[str, Any]:
    """The record of the intact conversion at `final`, made first (or again, when damaged) by
    `convert(out)`, which writes its files into `out` and returns the facts to record. `derived`:
    files made later from it (`derived_file`), checked when they are used."""
    checked = check(final, record_name, required, derived)
    if checked.record is not None:
        return checked.record
    with _writing(final, checked.problem or ""), lock(final):
        checked = check(final, record_name, required, derived)  # made by another process?
        if checked.record is not None:
            return checked.record
        if checked.problem:
            log.warning("the %s %s is damaged (%s): making it again", what, final, checked.problem)
            shutil.rmtree(final, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
        try:
            out = work / "model"
            out.mkdir()
            with _not_writing():  # the conversion's own errors are its own
                info = convert(out)
            stamps = write_record(out, record_name, info)
            os.replace(out, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        write_stamps(final, stamps, replace=True)
    return read_record(final, record_name)


class _ConversionError(Exception):
    """Carries an error of `convert` itself past `_writing`, which only names the cache's own."""


@contextmanager
def _not_writing() -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise _ConversionError() from exc


@contextmanager
def _writing(final: Path, problem: str) -> Iterator[None]:
    """A cache folder that cannot be written (a read-only volume, no space) is one line; an
    error of the conversion itself keeps its own type."""
    try:
        yield
    except _ConversionError as wrapped:
        assert wrapped.__cause__ is not None
        raise wrapped.__cause__ from None
    except OSError as exc:
        raise _unwritable(final, problem, exc) from None


def derived_file(
    folder: Path, record_name: str, name: str, make: Callable[[], None], *, what: str = "file"
) -> None:
    """`folder/name` made once from an intact conversion by `make()` (which writes it, renamed
    into place) and added to the record; made again when it is missing, unrecorded or damaged."""
    checked = check(folder, record_name, (name,))
    if checked.intact:
        return
    with _writing(folder, checked.problem or ""), lock(folder):
        checked = check(folder, record_name, (name,))
        if checked.intact:
            return
        path = folder / name
        if path.exists():
            log.warning(
                "the %s %s is damaged (%s): making %s again", what, folder, checked.problem, name
            )
            path.unlink()
        make()
        add_files(folder, record_name, [name])
        checked = check(folder, record_name, (name,))
    if not checked.intact:  # the rest of the folder went bad meanwhile: next load remakes it
        raise CisrankError(f"the {what} cache {folder} is damaged ({checked.problem}): load again")
