"""File writing that never leaves a half-written output behind (runs, reports, manifests)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

# O_EXCL: never reuse (or follow a link planted at) a temp name; O_CLOEXEC: a subprocess started
# meanwhile (the Lucene JVM) must not inherit the descriptor.
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _create_temp(folder: Path, name: str) -> tuple[int, Path]:
    """A fresh temp file beside the target, created with mode 0o666 so the kernel applies the
    umask exactly as for a plain open(): outputs stay readable by a server running as another
    user. Reading the umask with os.umask() would instead set it for the whole process, racing
    with every thread that creates a file meanwhile."""
    while True:
        tmp = folder / f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, _TMP_FLAGS, 0o666), tmp
        except FileExistsError:
            continue


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write via a temp file in the same folder and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))
