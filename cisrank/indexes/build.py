"""Offline index build jobs: one driver for every kind, so each kind only says how to build.

The protocol that makes builds safe to interrupt:

1. The output folder is claimed with a state file (`.build-state.json`: kind, corpus checksum,
   parameters). A folder that holds neither a state file nor a manifest but has files in it is
   never touched (it is not ours).
2. A complete index (one with `manifest.json`) is rebuilt only with `overwrite=True`, and then its
   manifest is deleted *first*, so an interruption from then on leaves an incomplete index.
3. A rerun with the same state resumes: the builder gets `resume=True` and reuses what it can
   verify (the dense builder keeps finished embedding shards, the prior builder the priors it
   committed). A rerun with a different corpus or parameters starts clean.
4. The builder writes its files; the driver writes `manifest.json` last, then drops the state file.

Adding a kind is one record in `cisrank.indexes.kinds`; the CLI's `index build <kind>` command
only turns that kind's flags into `params`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from cisrank.errors import CisrankError, DataError
from cisrank.fileio import atomic_write_text
from cisrank.data.manifest import MANIFEST_FILE, Manifest, write_manifest
from cisrank.data.corpus import CorpusReader, Format, OnError, file_checksum
from cisrank.indexes.kinds import KINDS, kind_of

log = logging.getLogger(__name__)

STATE_FILE = ".build-state.json"


def builder_kinds() -> list[str]:
    return list(KINDS)


def _claim(out: Path, state: dict[str, Any], overwrite: bool) -> bool:
    """Prepare `out` for a build; returns True when a matching interrupted build can resume."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = out / MANIFEST_FILE
    state_path = out / STATE_FILE
    if manifest.exists():
        if not overwrite:
            raise CisrankError(
                f"'{out}' already holds a complete index: pass --overwrite to rebuild it, "
                "or choose another --out"
            )
        manifest.unlink()  # from here on, an interruption leaves an incomplete index
        _clear(out)
    elif not state_path.exists() and any(out.iterdir()):
        raise CisrankError(
            f"'{out}' is not empty and is not a cisrank index folder: choose an empty or new --out"
        )
    resume = False
    if state_path.exists():
        try:
            resume = json.loads(state_path.read_text(encoding="utf-8")) == state
        except json.JSONDecodeError:
            resume = False
        if not resume:
            log.info("%s: previous build had other inputs or parameters; starting clean", out)
            _clear(out)
    atomic_write_text(state_path, json.dumps(state, indent=2, sort_keys=True))
    return resume


def _clear(out: Path) -> None:
    for p in out.iterdir():
        if p.name == STATE_FILE:
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
    sha, _ = file_checksum(corpus_path)
    state = {
        "kind": kind,
        "corpus_sha256": sha,
        "format": fmt,
        "on_error": on_error,
        "params": config.model_dump(),
    }
    started = time.time()
    resume = _claim(out, state, overwrite)
    reader = CorpusReader(corpus_path, fmt, on_error)
    result = builder(reader, out, config, resume=resume, progress=progress, **(options or {}))
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
    )
    write_manifest(out, manifest)
    (out / STATE_FILE).unlink(missing_ok=True)
    log.info("built %s index of %d passages in %s", kind, stats.passages, out)
    return manifest
