"""File writing that never leaves a half-written output behind (runs, reports, manifests), a folder
swapped in at once, and the block checksums that let a reader tell a file is still the one that
was written."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
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


def exchange_folders(a: Path, b: Path) -> bool:
    """Swap two folders in one atomic step (Linux renameat2 RENAME_EXCHANGE), as an index
    overwrite or a model repair swaps the new folder in; False where the platform or file
    system cannot, and the caller falls back to two renames."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, f"cannot swap '{a}' and '{b}': {os.strerror(err)}")


# ------------------------------------------------------------------------------- checksums


HASH_ALGORITHM = "sha256"
"""sha256 because it is the fastest digest in hashlib where the CPU has SHA extensions (1.3 GB/s
per core measured on this project's machine, against 0.5-0.7 GB/s for blake2b and md5), needs
no extra package, and is what the corpus checksum already uses."""
HASH_BLOCK_BYTES = 64 * 1024 * 1024
"""Files are hashed in blocks of this size: blocks of one big file (a 13 GB FAISS index) are
verified in parallel on every core, and a mismatch says which byte range is damaged."""
_READ_BYTES = 1024 * 1024


def _hash_range(path: Path, start: int, length: int) -> tuple[str, int]:
    """sha256 of `length` bytes of `path` from `start`, and how many bytes there were."""
    digest = hashlib.new(HASH_ALGORITHM)
    done = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        while done < length:
            chunk = f.read(min(_READ_BYTES, length - done))
            if not chunk:
                break
            digest.update(chunk)  # releases the GIL: blocks hash in parallel threads
            done += len(chunk)
    return digest.hexdigest(), done


def _workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def block_digests(path: Path, block_bytes: int = HASH_BLOCK_BYTES) -> list[str]:
    """The sha256 of each `block_bytes` block of a file (one block for an empty file)."""
    size = path.stat().st_size
    starts = list(range(0, size, block_bytes)) or [0]
    with ThreadPoolExecutor(_workers()) as pool:
        return [d for d, _ in pool.map(lambda s: _hash_range(path, s, block_bytes), starts)]


def first_bad_block(
    path: Path, expected: list[str], block_bytes: int = HASH_BLOCK_BYTES
) -> int | None:
    """Index of the first block of `path` whose sha256 is not `expected`'s, None when all match;
    the caller checks the size first (a truncated file fails there, before any hashing)."""
    with ThreadPoolExecutor(_workers()) as pool:
        got = pool.map(
            lambda i: _hash_range(path, i * block_bytes, block_bytes)[0], range(len(expected))
        )
        for i, (digest, want) in enumerate(zip(got, expected, strict=True)):
            if digest != want:
                return i
    return None
