"""Is an index folder intact? Every file against its manifest, and the prior store row by row.

`cisrank index verify` prints `verify_index`'s report; the server's pre-start checks
(`cisrank.serving.preflight`) call `require_intact` on every configured index and
`require_intact_priors` on every reranker's prior store, so a damaged or half-built index stops
the start with one line instead of a server that answers 503 forever. `open_index` checks the same
checksums (`cisrank.data.manifest.verify_files`) each time it opens an index.

The prior store is the one file readers may change after the build (a CIS reranker with
`--prior-store` adds the priors it computes), so a prior store whose bytes changed since the build
is judged by SQLite's `integrity_check` and the checksum of every row instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cisrank.data.manifest import FileCheck, Manifest, check_files
from cisrank.errors import CisrankError, DamagedFileError
from cisrank.indexes.kinds import open_index, read_index_manifest

if TYPE_CHECKING:
    from cisrank.rerank.prior_store import PriorStore


@dataclass(frozen=True)
class IndexReport:
    """The result of checking one index folder."""

    path: Path
    manifest: Manifest
    checks: list[FileCheck]

    @property
    def recorded(self) -> bool:
        """Whether the manifest has checksums (indexes built before them have none)."""
        return bool(self.manifest.checksums)

    @property
    def damaged(self) -> list[FileCheck]:
        return [c for c in self.checks if c.bad]


def _verified_rows(store: PriorStore) -> tuple[int, int]:
    """(rows checked, rows without a checksum) of a whole prior store (SQLite's
    `integrity_check`, then every row's checksum); `DamagedFileError` naming the store and its
    first problem otherwise."""
    rows, unverified, problems = store.verify()
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DamagedFileError(store.path, problems[0] + more)
    return rows, unverified


def _prior_rows(path: Path, name: str, changed: str) -> FileCheck:
    from cisrank.rerank.prior_store import PriorStore

    try:
        store = PriorStore(path / name)
        try:
            rows, unverified = _verified_rows(store)
        finally:
            store.close()
    except DamagedFileError as exc:
        return FileCheck(name, "damaged", exc.detail)
    note = f"{rows} rows match their checksums"
    if unverified:
        note += f", {unverified} rows have none (stored before row checksums)"
    return FileCheck(name, "ok", f"{changed}; {note}" if changed else note)


def require_intact_priors(spec: str | Path) -> None:
    """The priors a `--prior-store` names, in full, as `cisrank index verify` checks a prior
    index: a store SQLite cannot open (damaged header, not a database), one whose
    `integrity_check` fails or whose rows fail their checksums (a flipped bit of one stored
    value, which SQLite does not see), a Parquet prior table that cannot be read, or a prior
    index folder whose files fail their manifest's checksums is a `DamagedFileError` (or the
    `CisrankError` of opening it). Reads every row: about 235k rows/s (37 s at 8.8M rows)."""
    from cisrank.rerank.prior_store import PriorStore
    from cisrank.rerank.prior_table import TieredPriors, open_prior_store

    store = open_prior_store(spec)
    try:
        sqlite = store.cache if isinstance(store, TieredPriors) else store
        if isinstance(sqlite, PriorStore):
            _verified_rows(sqlite)
    finally:
        store.close()


def verify_index(path: str | Path) -> IndexReport:
    """Check every file of an index folder; a damaged or unreadable manifest raises
    `DamagedFileError` (there is nothing else to check against)."""
    path = Path(path).expanduser()
    manifest = read_index_manifest(path)
    checks = check_files(path, manifest)
    if manifest.kind == "prior":
        names = [c.name for c in checks] or list(manifest.files)
        by_name = {c.name: c for c in checks}
        checks = []
        for name in names:
            c = by_name.get(name)
            if c is None or c.status == "changed":
                changed = f"changed since the build ({c.detail})" if c else ""
                checks.append(_prior_rows(path, name, changed))
            else:
                checks.append(c)
    elif not manifest.checksums:  # nothing recorded: at least every engine must load its files
        try:
            open_index(path)
            checks = [FileCheck(f, "unverified", "opens, but no checksum") for f in manifest.files]
        except DamagedFileError as exc:
            checks = [FileCheck(_relative(path, exc.path), "damaged", exc.detail)]
    return IndexReport(path, manifest, checks)


def _relative(root: Path, file: str) -> str:
    try:
        return Path(file).relative_to(root).as_posix()
    except ValueError:
        return file


def require_intact(path: str | Path) -> IndexReport:
    """`verify_index`, raising `DamagedFileError` naming the first damaged file."""
    report = verify_index(path)
    for check in report.damaged:
        raise DamagedFileError(report.path / check.name, check.detail)
    if report.manifest.kind == "prior":
        raise CisrankError(f"'{report.path}' is a prior index, which is not a retriever")
    return report
