"""Turn a trained float32 student into the files cisrank ships (`cisrank distill ship`).

Why a command and not a hand-made copy: the shipped files are the one set of weights the
repository holds, so anyone must be able to check that they are what `make student` trains.
The conversion is deterministic (the same float32 folder gives the same bytes, sha256 for
sha256), and `--check` rebuilds them from a student folder and compares with the shipped ones.

What changes and what does not:

- `model.safetensors`: every floating tensor rounded to float16 (round to nearest even, IEEE
  754 binary16), integer tensors kept; a value outside float16's finite range is refused rather
  than turned into an infinity. Written with `safetensors`' own layout (tensors sorted, fixed
  metadata), which is a function of the tensors alone.
- `config.json` and the tokenizer and sentence-transformers files are copied byte for byte; the
  config keeps `"dtype": "float32"`, so every loader widens the float16 weights to float32
  (transformers' `dtype="auto"` reads that field).
- `cisrank-provenance.json` records the size and sha256 of every shipped file (checked on every
  load, `cisrank.models.integrity`) and of the source files they came from, and no date, so that
  two runs write identical provenances.

What float16 storage costs in ranking is measured, not assumed (bench/RESULTS.md: the shipped
weights against the float32 student on every backend, DL19 and DL21).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cisrank.data.datasets import guarded_json
from cisrank.errors import CisrankError
from cisrank.fileio import atomic_write_text, exchange_folders
from cisrank.models.integrity import (
    PROVENANCE_FILE,
    folder_files,
    record_files,
    seal,
    sha256_file,
)
from cisrank.models.shipped import SHIPPED_FORMAT
from cisrank.rerank.registry import CROSS_ENCODER, DENSE, RerankerKind

WEIGHTS = "model.safetensors"
COPIED = (
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "added_tokens.json",
)
"""The files a sentence-transformers folder (a CrossEncoder, or a bi-encoder's first module)
loads from besides its weights (those present are copied); training logs, checkpoints and the
model card stay behind. A bi-encoder's other modules (`1_Pooling/`, ...) are copied whole, as its
`modules.json` lists them."""

MAX_SHIPPED_BYTES = 50_000_000
"""The repository's bound on shipped weights: 50 MB for the whole folder."""

FLOAT16_MAX = 65504.0


@dataclass(frozen=True)
class Shipped:
    """What `ship_student` wrote: the folder, its total bytes and its files' sha256."""

    folder: Path
    bytes: int
    files: dict[str, str]


def _check_source(source: Path) -> RerankerKind[Any, Any]:
    """The kind that serves the student in `source`: a one-logit cross-encoder, or a
    sentence-transformers bi-encoder (`distill train --student bi`); anything else refused."""
    if not (source / WEIGHTS).is_file() or not (source / "config.json").is_file():
        raise CisrankError(
            f"'{source}' is not a trained student folder (it needs {WEIGHTS} and config.json: "
            "the folder `cisrank distill train` or `make student` writes)"
        )
    config = _read_json(source / "config.json")
    archs = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        if (source / "modules.json").is_file() and _module_folders(source):
            return DENSE
        raise CisrankError(
            f"'{source}' holds a {archs[0] if archs else 'model'} with no classification head "
            "and no sentence-transformers modules: neither a cross-encoder nor a bi-encoder "
            "student"
        )
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 1)
    if labels != 1:
        raise CisrankError(f"'{source}' has {labels} labels; a student has one (its score)")
    return CROSS_ENCODER


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text("utf-8")
    except (OSError, ValueError) as exc:
        raise CisrankError(f"{path}: not readable JSON ({exc})") from None
    return guarded_json(text, f"{path}: not readable JSON")


def _module_folders(source: Path) -> list[str]:
    """The folders of a bi-encoder's modules after the first (`1_Pooling`, ...), as its
    `modules.json` lists them; a listed folder that is missing is fine where the module has
    no files (`Normalize`), and sentence-transformers loads it so."""
    modules = _read_json(source / "modules.json")
    if not isinstance(modules, list) or not modules:
        raise CisrankError(f"{source / 'modules.json'}: not a list of modules")
    folders = []
    for m in modules:
        path = str(m.get("path", "")) if isinstance(m, dict) else ""
        if path and (".." in Path(path).parts or Path(path).is_absolute()):
            raise CisrankError(f"{source / 'modules.json'}: module path '{path}' leaves the folder")
        if path:
            folders.append(path)
    return folders


def half_tensors(source: Path) -> dict[str, Any]:
    """The student's tensors with every floating one rounded to float16; a value float16
    cannot hold is an error naming the tensor."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(source / WEIGHTS))
    out = {}
    for name in sorted(tensors):
        t = tensors[name]
        if t.is_floating_point():
            t32 = t.float()
            if not bool(torch.isfinite(t32).all()):
                raise CisrankError(f"{source / WEIGHTS}: tensor '{name}' holds NaN or infinity")
            peak = float(t32.abs().max()) if t32.numel() else 0.0
            if peak > FLOAT16_MAX:
                raise CisrankError(
                    f"{source / WEIGHTS}: tensor '{name}' holds {peak:g}, beyond float16's "
                    f"{FLOAT16_MAX:g}: this student cannot ship as float16"
                )
            t = t32.to(torch.float16)
        out[name] = t.contiguous()
    return out


def _write(source: Path, staging: Path, name: str, recipe: str) -> None:
    from safetensors.torch import save_file

    kind = _check_source(source)
    save_file(half_tensors(source), str(staging / WEIGHTS), metadata={"format": "pt"})
    used = [WEIGHTS]
    for rel in COPIED:
        if (source / rel).is_file():
            shutil.copyfile(source / rel, staging / rel)
            used.append(rel)
    if kind.embeds:  # a bi-encoder: its pooling and other modules in folders of their own
        for folder in _module_folders(source):
            for rel in folder_files(source / folder):
                (staging / folder / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / folder / rel, staging / folder / rel)
                used.append(f"{folder}/{rel}")
    files, _ = record_files(staging)
    provenance = {
        "name": name,
        "kind": kind.name,
        "format": SHIPPED_FORMAT,
        "weights": "float16 (round to nearest even) of the float32 student below; config.json "
        "says float32, so loaders widen them to float32",
        "recipe": recipe,
        "source": {rel: {"sha256": sha256_file(source / rel)} for rel in sorted(used)},
        "files": files,
    }
    atomic_write_text(staging / PROVENANCE_FILE, json.dumps(seal(provenance), indent=2) + "\n")


def _hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` (its provenance included), by POSIX path."""
    return {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def ship_student(
    source: str | Path,
    out: str | Path,
    *,
    name: str = "cisrank-student",
    recipe: str = "make student",
) -> Shipped:
    """Write the shipped form of the float32 student `source` into `out` (replaced whole, in
    one step: a reader sees the old folder or the new one). Deterministic."""
    source, out = Path(source), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.ship-", dir=out.parent))
    try:
        _write(source, staging, name, recipe)
        total = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
        if total > MAX_SHIPPED_BYTES:
            raise CisrankError(
                f"the shipped student would take {total / 1e6:.1f} MB, over the "
                f"{MAX_SHIPPED_BYTES / 1e6:.0f} MB the repository allows"
            )
        hashes = _hashes(staging)
        # package data: readable by every user of an installation (mkdtemp made it 0700)
        staging.chmod(0o755)
        for p in staging.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        if out.exists():
            if not exchange_folders(staging, out):
                old = staging.with_name(staging.name + ".old")
                out.rename(old)
                staging.rename(out)
                shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(out)
        return Shipped(out, total, hashes)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_shipped(source: str | Path, shipped: str | Path, **options: Any) -> list[str]:
    """The differences between the shipped folder and what `ship_student(source)` writes now:
    [] when every file has the same sha256 (the shipped files are `source`'s, exactly)."""
    shipped = Path(shipped)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = ship_student(source, Path(tmp) / shipped.name, **options)
        have = _hashes(shipped) if shipped.is_dir() else {}
        diffs = []
        for rel in sorted(set(fresh.files) | set(have)):
            if rel not in have:
                diffs.append(f"{rel}: not in {shipped}")
            elif rel not in fresh.files:
                diffs.append(f"{rel}: in {shipped} but not made from {source}")
            elif have[rel] != fresh.files[rel]:
                diffs.append(
                    f"{rel}: sha256 {have[rel][:12]}... shipped, {fresh.files[rel][:12]}... made"
                )
        return diffs
