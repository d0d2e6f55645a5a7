"""Every `CISRANK_*` environment variable, read in one place.

A variable is named once, here, with what it means; code elsewhere calls these functions instead
of reading `os.environ`, so `grep CISRANK_` finds the whole list and docs/deploy.md's table.

| variable | meaning |
|---|---|
| `CISRANK_DATA_DIR` | root holding one folder per dataset (`trec-dl19/`, ...), like `../shared/data` |
| `CISRANK_LOG_LEVEL` | logging level of the CLI and the server (default INFO) |
| `CISRANK_API_KEYS` | comma-separated API keys of at least 16 characters; set, they require `Authorization: Bearer <key>`; set but holding no usable key, the server refuses to start |
| `CISRANK_MODEL_HOME` | where `cisrank models pull` puts models (default `$XDG_CACHE_HOME/cisrank/models`) |
| `CISRANK_LM_BACKEND` | the causal LM's runtime where `--backend auto` (the default) is asked: torch, onnx or ctranslate2 |
| `CISRANK_CPU_BF16` | `0`: treat this CPU as having no native bf16 (float32 defaults everywhere); `1`: as having it; unset: detect (AVX512-BF16 or AMX) |
| `CISRANK_ENCODER_BACKEND` | the cross-encoder's runtime where `--backend auto` (its default) is asked: torch or onnx |
| `CISRANK_AUTO_PULL` | `0`: a catalogue model named but not pulled is an error naming `cisrank models pull`; default `1`: pulled on first use, with one line saying so |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from cisrank.errors import CisrankError

DATA_DIR = "CISRANK_DATA_DIR"
LOG_LEVEL = "CISRANK_LOG_LEVEL"
API_KEYS = "CISRANK_API_KEYS"
MODEL_HOME = "CISRANK_MODEL_HOME"
LM_BACKEND = "CISRANK_LM_BACKEND"
CPU_BF16 = "CISRANK_CPU_BF16"
ENCODER_BACKEND = "CISRANK_ENCODER_BACKEND"
AUTO_PULL = "CISRANK_AUTO_PULL"


def _get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    value = (environ if environ is not None else os.environ).get(name)
    return value if value is None or value.strip() else None


def data_dir() -> Path | None:
    """The dataset root, when set (and non-blank)."""
    value = _get(DATA_DIR)
    return Path(value).expanduser() if value else None


def log_level() -> str:
    return _get(LOG_LEVEL) or "INFO"


MIN_API_KEY_CHARS = 16
"""The shortest API key accepted: a short key is guessed (and was most often a placeholder)."""


def api_keys(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The configured API keys; empty when auth is off (the variable unset, or set to the empty
    string, which is what `${CISRANK_API_KEYS:-}` gives). Blank entries between keys are ignored.

    Fails closed: a variable that is set but holds no key (`" , "`) is a `CisrankError`, and so
    is a key shorter than `MIN_API_KEY_CHARS`. Before, `" , "` served every route without a key
    and said nothing. The message names the key by its position, never its text."""
    raw = (environ if environ is not None else os.environ).get(API_KEYS)
    if not raw:
        return ()
    keys = tuple(k.strip() for k in raw.split(",") if k.strip())
    if not keys:
        raise CisrankError(
            f"{API_KEYS} is set but holds no key: set it to key1,key2 (each at least "
            f"{MIN_API_KEY_CHARS} characters), or unset it to serve without keys"
        )
    for number, key in enumerate(keys, 1):
        if len(key) < MIN_API_KEY_CHARS:
            raise CisrankError(
                f"{API_KEYS}: key {number} of {len(keys)} has {len(key)} characters, at least "
                f"{MIN_API_KEY_CHARS} are required: use a long random key (openssl rand -hex 24)"
            )
    return keys


def model_home() -> Path | None:
    value = _get(MODEL_HOME)
    return Path(value).expanduser() if value else None


def lm_backend(environ: Mapping[str, str] | None = None) -> str | None:
    """The backend `auto` must mean in this process, when set (lower-cased)."""
    value = _get(LM_BACKEND, environ)
    return value.strip().lower() if value else None


def encoder_backend(environ: Mapping[str, str] | None = None) -> str | None:
    """The backend the cross-encoder's `auto` must mean in this process, when set."""
    value = _get(ENCODER_BACKEND, environ)
    return value.strip().lower() if value else None


def auto_pull(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a catalogue model named but not pulled is pulled on first use (the default)."""
    value = (_get(AUTO_PULL, environ) or "1").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    from cisrank.errors import CisrankError

    raise CisrankError(f"{AUTO_PULL}={value!r}: use 1 or 0")


def cpu_bf16(environ: Mapping[str, str] | None = None) -> bool | None:
    """Whether to treat the CPU as having native bf16 matmuls; None: detect it."""
    value = _get(CPU_BF16, environ)
    flag = (value or "auto").strip().lower()
    if flag == "auto":
        return None
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    from cisrank.errors import CisrankError

    raise CisrankError(f"{CPU_BF16}={value!r}: use 1, 0 or auto")


def user_cache_dir() -> Path:
    """`$XDG_CACHE_HOME`, else `~/.cache` (the convention pip and Hugging Face follow too)."""
    value = os.environ.get("XDG_CACHE_HOME", "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache"
