"""A model folder's identity, cheap enough to compute at every open.

Index manifests and the prior store record it so that an index or a stored log p(K) is never used
with weights other than the ones that produced it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def model_fingerprint(path: str | Path, partial_over: int = 64 << 20) -> str:
    """sha256 over a model folder's file names, sizes and contents.

    Files over `partial_over` bytes (multi-GB weights) contribute their size and first and last
    MiB only, so fingerprinting stays fast; any retraining changes those bytes in practice.
    """
    root = Path(path)
    h = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts)
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.relative_to(root).as_posix()}\0{size}\0".encode())
        with p.open("rb") as f:
            if size <= partial_over:
                h.update(f.read())
            else:
                h.update(f.read(1 << 20))
                f.seek(size - (1 << 20))
                h.update(f.read())
    return h.hexdigest()
