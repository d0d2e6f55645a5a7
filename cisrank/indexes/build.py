"""Offline index build jobs: one driver for every kind, so each kind only says how to build.

The protocol that makes builds safe to interrupt:

1. The output folder is claimed with a state file (`.build-state.json`: kind, corpus checksum,
   parameters). A folder that holds neither a state file nor a manifest but has files in it is
   never touched (it is not ours).
2. A complete index (one with `manifest.json`) is rebuilt only with `overwrite=True`, and then
   never in place: the new index is built in the sibling folder `.<name>.overwrite` and swapped
   in whole at the end (`_swap_in`), so at every moment `out` holds the complete old index or the
   complete new one, and a search or a server started meanwhile keeps working. An interrupted
   overwrite leaves the old index live and its staging folder behind; rerunning it resumes there.
3. A rerun with the same state resumes: the builder gets `resume=True` and reuses what it can
   verify (the dense builder keeps finished embedding shards, the prior builder the priors it
   committed). A rerun with a different corpus or parameters starts clean.
4. The builder writes its files; the driver records their sizes and checksums in
   `manifest.json`, written last, then drops the state file.

Adding a kind is one record in `cisrank.indexes.kinds`; the CLI's `index build <kind>` command
only turns that kind's flags into `params`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from cisrank.data.corpus import CorpusReader, Format, OnError, file_checksum
from cisrank.data.datasets import guarded_json
from cisrank.data.manifest import MANIFEST_FILE, Manifest, record_checksums, write_manifest
from cisrank.errors import CisrankError, DataError
from cisrank.fileio import atomic_write_text, exchange_folders
from cisrank.indexes.kinds import KINDS, kind_of

log = logging.getLogger(__name__)

STATE_FILE = ".build-state.json"


def builder_kinds() -> list[str]:
    return list(KINDS)


def staging_folder(out: Path) -> Path:
    """Where an overwrite of the complete index in `out` is built before it is swapped in."""
    return out.with_name(f".{out.name}.overwrite")


def _claim(out: Path, state: dict[str, Any], overwrite: bool) -> tuple[Path, bool]:
    """Prepare the folder to build into: `out` itself, or its staging folder when `out` holds a
    complete index to overwrite. Returns it and whether a matching interrupted build resumes."""
    out.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(out)
    if (out / MANIFEST_FILE).exists():
        if not overwrite:
            pending = (
                f" (an interrupted --overwrite build waits in '{staging}')"
                if staging.exists()
                else ""
            )
            raise CisrankError(
                f"'{out}' already holds a complete index: pass --overwrite to rebuild it, "
                f"or choose another --out{pending}"
            )
        staging.mkdir(exist_ok=True)
        if (staging / MANIFEST_FILE).exists():  # the old index of a swap cut short: not ours
            _clear(staging, keep_state=False)
        return staging, _resume(staging, state)
    if not (out / STATE_FILE).exists() and any(out.iterdir()):
        raise CisrankError(
            f"'{out}' is not empty and is not a cisrank index folder: choose an empty or new --out"
        )
    return out, _resume(out, state)


def _resume(folder: Path, state: dict[str, Any]) -> bool:
    """Whether `folder` holds an interrupted build of the same `state`; else it is cleared."""
    state_path = folder / STATE_FILE
    resume = False
    if state_path.exists():
        try:
            resume = guarded_json(state_path.read_text(encoding="utf-8"), "") == state
        except (DataError, UnicodeDecodeError):
            resume = False
        if not resume:
            log.info("%s: previous build had other inputs or parameters; starting clean", folder)
    if not resume:
        _clear(folder)
    atomic_write_text(state_path, json.dumps(state, indent=2, sort_keys=True))
    return resume


def _swap_in(staging: Path, out: Path) -> None:
    """Put the complete index built in `staging` at `out` and delete the old one.

    On Linux the two folders are exchanged atomically: a reader sees the old index or the new
    one, never neither. Elsewhere the old folder is renamed away and the new one renamed in
    (a window of two renames where `out` is missing). The old index is deleted last: its
    manifest first, so a leftover of an interruption there never looks complete.
    """
    if exchange_folders(staging, out):
        old = staging
    else:
        old = out.with_name(f".{out.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.rename(out, old)
        os.rename(staging, out)
    _fsync_dir(out.parent)
    (old / MANIFEST_FILE).unlink(missing_ok=True)
    shutil.rmtree(old)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory descriptors
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _clear(out: Path, keep_state: bool = True) -> None:
    for p in out.iterdir():
        if keep_state and p.name == STATE_FILE:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def build_index(
    kind: str,
    corpus: str | Path,
    out: str | Path,
    params: dict[str, Any] | None = None,
    *,
    fmt: Format | None = None,
    on_error: OnError = "raise",
    overwrite: bool = False,
    progress: bool = True,
    options: dict[str, Any] | None = None,
) -> Manifest:
    """Build one index of `kind` from a corpus file into `out`; returns its manifest.

    `params` define the index: checked against the kind's `IndexConfig` before anything is
    touched, completed with its defaults and recorded in the manifest (a change means a clean
    rebuild); `options` only say how to run (e.g. `device`) and go to the builder unrecorded.
    """
    index_kind = kind_of(kind)
    config = index_kind.params(params)
    builder = index_kind.load_builder()
    corpus_path = Path(corpus).expanduser()
    if not corpus_path.is_file():
        raise DataError(f"corpus file '{corpus_path}' does not exist")
    out = Path(out).expanduser()
    if out.is_symlink():  # swap the folder it points to, never the link itself
        out = out.resolve()
    sha, _ = file_checksum(corpus_path)
    state = {
        "kind": kind,
        "corpus_sha256": sha,
        "format": fmt,
        "on_error": on_error,
        "params": config.model_dump(),
    }
    started = time.time()
    folder, resume = _claim(out, state, overwrite)
    reader = CorpusReader(corpus_path, fmt, on_error)
    result = builder(reader, folder, config, resume=resume, progress=progress, **(options or {}))
    stats = reader.stats
    if stats is None:
        raise RuntimeError(f"the {kind} builder did not read the corpus to its end")
    if stats.sha256 != sha:
        raise DataError(f"corpus '{corpus_path}' changed while the build was reading it")
    manifest = Manifest(
        kind=kind,
        params=result.params,
        corpus=stats.to_json(),
        files=result.files,
        model=result.model,
        libraries=result.libraries,
        build={
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "seconds": round(time.time() - started, 3),
            "resumed": resume,
            **result.extra,
        },
        checksums=record_checksums(folder, result.files, result.mutable),
    )
    write_manifest(folder, manifest)
    (folder / STATE_FILE).unlink(missing_ok=True)
    if folder != out:
        _swap_in(folder, out)
    log.info("built %s index of %d passages in %s", kind, stats.passages, out)
    return manifest
