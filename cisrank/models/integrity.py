"""Is a pulled model folder still what `cisrank models pull` wrote?

At pull, the provenance file (`cisrank-provenance.json`) records the size and sha256 of every file
of the folder (`files`) and a sha256 of the provenance itself (`provenance_sha256`), so an edit
of the record is caught too. Every load of a pulled folder checks it (`require_intact_model`, called
by `cisrank.models.resolve.resolve_model`, which every loader of the project goes through):

- a missing file, a file of another size, a file the pull did not write, or a provenance that is
  not what was written is damage at once (no hashing needed);
- a file whose *stamp* (size, mtime, ctime, inode, device) is the one recorded when it last
  hashed to its recorded sha256 is taken as intact without reading it (the fast path: a few
  `stat` calls);
- any other file is hashed in full: the wrong sha256 is damage; the right one refreshes its stamp
  (a `touch`, a copy of the folder, a restore from backup: hashed once, then fast again).

Stamps live in the user cache (`<cache>/cisrank/model-stamps/`, one small JSON file per folder,
written atomically), never in the model folder: the folder stays byte-for-byte what the pull
wrote (model fingerprints and the CTranslate2/ONNX conversion keys hash its files), and a
read-only folder or volume works. Where the cache cannot be written either, the stamps are kept in
this process only and each new process hashes the folder once (one warning says so).

`verify_model(folder, full=True)` hashes every file whatever the stamps say: `cisrank models
verify`, `cisrank models pull` (before calling a folder "already pulled") and the server's start
use it. The fast path sees every change made through the file system (a write moves mtime and
ctime, a copy moves the inode); only the full check sees bytes that rot on the medium itself.

A provenance without its checksums (`files` or `provenance_sha256` missing) is damage like any
other edit of it: every pull writes both, and one that lacks them cannot be told apart from a
record someone stripped before damaging the weights (docs/reliability.md), so nothing in the folder
is vouched for; `cisrank models pull NAME` pulls it again and records them. Folders pulled before
cisrank recorded checksums are such folders, and are re-pulled the same way.

`check_files` is the check itself, for any folder whose record lists its files: the conversion
caches of `cisrank.runtimes` (ONNX exports, CTranslate2 conversions) are checked with it too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat as stat_module
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cisrank import env
from cisrank.errors import CisrankError, DamagedFileError
from cisrank.fileio import atomic_write_text
from cisrank.models.shipped import SHIPPED_FORMAT, reinstall_hint, shipped_root

log = logging.getLogger(__name__)

PROVENANCE_FILE = "cisrank-provenance.json"
DIGEST_FIELD = "provenance_sha256"
_READ = 1 << 20

RACY_SECONDS = 2.0
"""A file changed less than this long before its check gets no stamp: a write landing in the same
timestamp tick as the check would leave mtime and ctime unchanged (file systems with coarse
timestamps tick once a second or two), so its stamp could vouch for bytes never hashed."""

Stamp = tuple[int, int, int, int, int]


class DamagedModelError(DamagedFileError):
    """A file of a pulled model folder is not what the pull wrote (or is missing, or was added).

    One line: the file, what is wrong, and the command that repairs it.
    """

    def __init__(self, path: object, detail: str, remedy: str) -> None:
        CisrankError.__init__(self, f"{path}: damaged model file ({detail}): {remedy}")
        self.path = str(path)
        self.detail = detail
        self.remedy = remedy


@dataclass(frozen=True)
class FileProblem:
    file: str
    detail: str


@dataclass(frozen=True)
class ModelCheck:
    """The result of checking one model folder.

    `status`: "intact" (every file matches the record), "damaged" (`problems` says which, the
    provenance itself when it records no checksums), or "not-pulled" (no provenance: not a
    folder `cisrank models pull` wrote).
    """

    folder: Path
    status: str
    name: str = ""
    files: int = 0
    bytes: int = 0
    hashed_bytes: int = 0
    seconds: float = 0.0
    problems: tuple[FileProblem, ...] = field(default_factory=tuple)
    shipped: bool = False
    """A folder shipped inside cisrank (`cisrank.models.shipped`): repaired by a reinstall."""

    @property
    def intact(self) -> bool:
        return self.status == "intact"

    def error(self) -> DamagedModelError:
        """The one-line error of a damaged folder: its first problem (and how many more)."""
        first = self.problems[0]
        more = len(self.problems) - 1
        detail = first.detail + (f"; {more} more file(s) damaged" if more else "")
        hint = reinstall_hint(self.folder) if self.shipped else repair_hint(self.folder, self.name)
        return DamagedModelError(self.folder / first.file, detail, hint)


def model_home(home: str | Path | None = None) -> Path:
    """Where pulled models live: `home`, else `CISRANK_MODEL_HOME`, else the user cache."""
    if home is not None:
        return Path(home).expanduser()
    return env.model_home() or env.user_cache_dir() / "cisrank" / "models"


def repair_hint(folder: Path, name: str) -> str:
    """The command that repairs a pulled folder, as the user would type it (a folder shipped
    inside the package is repaired by reinstalling it)."""
    if folder.resolve().is_relative_to(shipped_root().resolve()):
        return reinstall_hint(folder)
    if not name:
        return "restore the folder or pull the model again"
    if folder.name != name:
        return f"restore the folder, or pull the model again (`cisrank models pull {name}`)"
    home = "" if folder.parent == model_home() else f" --home {folder.parent}"
    return f"run `cisrank models pull {name}{home}` to repair it"


# ------------------------------------------------------------------------ the record


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_READ):
            h.update(block)
    return h.hexdigest()


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def folder_files(folder: Path) -> list[str]:
    """The files a pull records: every file under `folder` but the provenance and hidden ones
    (`.cache/`, `.DS_Store`: what tools put beside models), as sorted POSIX paths."""
    found = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if _hidden(rel) or rel.as_posix() == PROVENANCE_FILE or not p.is_file():
            continue
        found.append(rel.as_posix())
    return sorted(found)


def provenance_digest(provenance: dict[str, Any]) -> str:
    """sha256 of the provenance without its digest field, in a canonical JSON form."""
    body = {k: v for k, v in provenance.items() if k != DIGEST_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def seal(provenance: dict[str, Any]) -> dict[str, Any]:
    """`provenance` with its digest added (what a pull writes)."""
    return {**provenance, DIGEST_FIELD: provenance_digest(provenance)}


def record_files(folder: Path) -> tuple[dict[str, dict[str, Any]], dict[str, list[Any]]]:
    """Hash every file of a folder being pulled: ({file: {size, sha256}}, stamps of them)."""
    return hash_files(folder, folder_files(folder))


def hash_files(
    folder: Path, names: Iterable[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, list[Any]]]:
    """Hash the files `names` of `folder`, just written: ({file: {size, sha256}}, their stamps,
    for `write_stamps`)."""
    files: dict[str, dict[str, Any]] = {}
    stamps: dict[str, list[Any]] = {}
    for rel in names:
        path = folder / rel
        before = path.stat()
        digest = sha256_file(path)
        files[rel] = {"size": before.st_size, "sha256": digest}
        stamps[rel] = [*_stamp(before), digest]
    return files, stamps


# ------------------------------------------------------------------------ stamps


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def stamp_path(folder: Path) -> Path:
    """Where the stamps of `folder` are kept: the user cache, one file per resolved folder."""
    key = hashlib.sha256(str(folder.resolve()).encode("utf-8")).hexdigest()[:32]
    return env.user_cache_dir() / "cisrank" / "model-stamps" / f"{key}.json"


_MEMORY: dict[str, dict[str, list[Any]]] = {}
_WARNED: set[str] = set()


def _read_stamps(folder: Path) -> dict[str, list[Any]]:
    path = stamp_path(folder)
    stamps: dict[str, list[Any]] = {}
    try:
        data = json.loads(path.read_text("utf-8"))
        if data.get("folder") == str(folder.resolve()) and isinstance(data.get("files"), dict):
            stamps = dict(data["files"])
    except (OSError, ValueError, AttributeError):
        pass  # no stamps yet, or unreadable ones: the files are hashed, which costs only time
    stamps.update(_MEMORY.get(str(path), {}))
    return stamps


def write_stamps(folder: Path, stamps: dict[str, list[Any]], *, replace: bool = False) -> None:
    """Record stamps of files just hashed, merged into those already recorded (all of them
    replaced with `replace`); atomic, and a failure to write only costs a full hash later."""
    path = stamp_path(folder)
    merged = {} if replace else _read_stamps(folder)
    merged.update(stamps)
    _MEMORY[str(path)] = merged
    body = {"folder": str(folder.resolve()), "files": merged}
    try:
        atomic_write_text(path, json.dumps(body, sort_keys=True) + "\n")
    except OSError as exc:
        if str(path) not in _WARNED:
            _WARNED.add(str(path))
            log.warning(
                "cannot record the integrity stamps of %s in %s (%s): each process will hash "
                "its files in full once",
                folder,
                path,
                exc.strerror or exc,
            )


# ------------------------------------------------------------------------ the check


def read_provenance(folder: Path) -> dict[str, Any] | None:
    """The provenance of a pulled folder; None when there is none; DamagedModelError when it is
    not valid JSON or not what the pull wrote."""
    path = folder / PROVENANCE_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DamagedModelError(
            path, f"unreadable: {exc.strerror}", repair_hint(folder, "")
        ) from None
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        detail = f"not the JSON a pull writes: {str(exc).splitlines()[0]}"
        raise DamagedModelError(path, detail, repair_hint(folder, folder.name)) from None
    name = str(data.get("name", ""))
    if DIGEST_FIELD in data and data[DIGEST_FIELD] != provenance_digest(data):
        detail = "edited since the pull: its sha256 differs from the one it recorded"
        raise DamagedModelError(path, detail, repair_hint(folder, name))
    return data


UNSEALED = (
    "it records no checksums (`files`, `provenance_sha256`): every pull writes them, so it was "
    "edited or predates them, and nothing in the folder can be vouched for"
)


def recorded_files(record: dict[str, Any]) -> dict[str, tuple[int | None, str]] | None:
    """{file: (size, sha256)} of a sealed record (a pull's provenance, a conversion's record);
    None when it has no checksums or no seal, or they are not what a record holds."""
    files = record.get("files")
    if DIGEST_FIELD not in record or not isinstance(files, dict):
        return None
    try:
        return {str(rel): (int(v["size"]), str(v["sha256"])) for rel, v in files.items()}
    except (TypeError, KeyError, ValueError):
        return None


@dataclass(frozen=True)
class FilesCheck:
    problems: tuple[FileProblem, ...]
    bytes: int
    hashed_bytes: int


def check_files(
    folder: Path, expected: dict[str, tuple[int | None, str]], *, full: bool = False
) -> FilesCheck:
    """Each recorded file of `folder` against its size and sha256 (see the module doc: by stamp
    where it is unchanged since it last hashed right, unless `full`), stamps refreshed for files
    hashed right. Files present but not recorded are the caller's question."""
    stamps = {} if full else _read_stamps(folder)
    fresh: dict[str, list[Any]] = {}
    problems: list[FileProblem] = []
    total = hashed = 0
    for rel, (size, sha) in sorted(expected.items()):
        path = folder / rel
        try:
            st = path.stat()
        except FileNotFoundError:
            problems.append(FileProblem(rel, "missing"))
            continue
        except OSError as exc:
            problems.append(FileProblem(rel, f"unreadable: {exc.strerror}"))
            continue
        if not stat_module.S_ISREG(st.st_mode):
            problems.append(FileProblem(rel, "not a regular file"))
            continue
        total += st.st_size
        if size is not None and st.st_size != size:
            problems.append(FileProblem(rel, f"{st.st_size} bytes, {size} when it was recorded"))
            continue
        stamp = _stamp(st)
        if stamps.get(rel) == [*stamp, sha]:
            continue
        try:
            digest = sha256_file(path)
        except OSError as exc:
            problems.append(FileProblem(rel, f"unreadable: {exc.strerror}"))
            continue
        hashed += st.st_size
        if digest != sha:
            problems.append(FileProblem(rel, "its sha256 differs from the one recorded"))
            continue
        after = path.stat()
        changed = max(after.st_mtime_ns, after.st_ctime_ns) / 1e9
        if _stamp(after) == stamp and time.time() - changed >= RACY_SECONDS:
            fresh[rel] = [*stamp, sha]
    if fresh:
        write_stamps(folder, fresh)
    return FilesCheck(tuple(problems), total, hashed)


def verify_model(folder: str | Path, *, full: bool = False) -> ModelCheck:
    """Check a model folder against the record its pull wrote; never raises for damage (the
    report says it), only for a provenance that cannot be read (`DamagedModelError`).

    `full=False` trusts files whose stamp matches (see the module doc); `full=True` hashes
    every byte (about 1.3 GB/s per core; 0.2 s for SmolLM2-135M, 1 s for Qwen2.5-0.5B in bf16).
    """
    folder = Path(folder)
    started = time.perf_counter()
    provenance = read_provenance(folder)
    if provenance is None:
        return ModelCheck(folder, "not-pulled")
    name = str(provenance.get("name", ""))
    shipped = provenance.get("format") == SHIPPED_FORMAT
    expected = recorded_files(provenance)
    if expected is None:
        return ModelCheck(
            folder,
            "damaged",
            name,
            problems=(FileProblem(PROVENANCE_FILE, UNSEALED),),
            shipped=shipped,
        )
    checked = check_files(folder, expected, full=full)
    problems = [
        *(
            FileProblem(p.file, p.detail.replace("recorded", "recorded at pull"))
            for p in checked.problems
        ),
        *(
            FileProblem(rel, "not written by the pull")
            for rel in folder_files(folder)
            if rel not in expected
        ),
    ]
    status = "damaged" if problems else "intact"
    seconds = time.perf_counter() - started
    return ModelCheck(
        folder,
        status,
        name,
        len(expected),
        checked.bytes,
        checked.hashed_bytes,
        seconds,
        tuple(problems),
        shipped,
    )


def require_intact_model(folder: str | Path, *, full: bool = False) -> ModelCheck:
    """`verify_model`, raising `DamagedModelError` (one line naming the file and the command that
    repairs it) for a damaged folder, a provenance without checksums included. What every load
    of a pulled folder and the server's start call."""
    check = verify_model(folder, full=full)
    if check.status == "damaged":
        raise check.error()
    return check


def damaged_json_file(folder: Path) -> str | None:
    """`name: why` of the first JSON file of a model folder (or of a module folder one level
    down, `1_Pooling/config.json`) that does not parse, or None. transformers and
    sentence-transformers report such a folder as "Unrecognized processing class" or a bare
    JSON error, naming no file; a folder with a provenance is checked by its checksums first,
    one without (a folder of one's own) only here, once loading has failed."""
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*/*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            why = str(exc).splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
            return f"{path.relative_to(folder).as_posix()}: {why}"
    return None


def damaged_folder_error(kind: str, model: str, path: str | Path) -> CisrankError | None:
    """The one-line error for a model folder that failed to load because one of its JSON files
    is damaged (`damaged_json_file`), naming that file, or None when each parses (the load
    failed for another reason, which its own error tells)."""
    folder = Path(path)
    damaged = damaged_json_file(folder) if folder.is_dir() else None
    if damaged is None:
        return None
    return CisrankError(
        f"cannot load {kind} '{model}': its file {damaged} (not JSON: truncated or damaged?): "
        f"restore the folder {path}"
    )
