"""Passage embeddings kept by content, so that a passage sent again is not encoded again.

RAG clients send the same chunks request after request, each time with another question. A
bi-encoder's passage embedding is a function of the passage text, the weights and how they are
computed, never of the query, so a second rerank of the same passages costs one query encoding
plus the dot products. A cross-encoder has nothing to keep: its model reads the (query,
passage) pair as one input, and every new query is a new pair.

The key of an entry is the sha256 of the exact text the encoder reads (the passage prefix
already put before it) inside a *space*: the sha256 of the model's fingerprint (its folder's
files, `cisrank.models.fingerprint`), the runtime, the compute type and the token limit
(`cache_space`). A change of any of them is another space, so it never serves a vector that
other weights, another runtime, another precision or another truncation computed, even when
one cache is shared by several rerankers.

Memory is bounded by a byte budget: an entry costs its vector's bytes plus `ENTRY_OVERHEAD`
(the key, the array object, the LRU's slot), and the least recently used entries are evicted
until the total is back within the budget (a vector larger than the budget is not kept). One
lock guards every operation: the serving model thread and `/v1/embeddings` may use it at once.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

ENTRY_OVERHEAD = 288
"""Bytes an entry costs beyond its vector's: the 64-byte `bytes` key (97 B by `sys.getsizeof`),
the ndarray object (112 B) and the `OrderedDict` slot and links. Measured with `tracemalloc` on
CPython 3.11, 20,000 all-MiniLM-L6-v2 vectors put in one cache: 284 B an entry beyond the
vector's 1,536, rounded up (the vector's own bytes are counted exactly)."""


def cache_space(fingerprint: str, runtime: str, compute_type: str, max_length: int | None) -> bytes:
    """The digest that keys one way of computing embeddings: the model's fingerprint, the runtime,
    the compute type and the token limit texts are cut to."""
    ident = f"{fingerprint}\0{runtime}\0{compute_type}\0{max_length}"
    return hashlib.sha256(ident.encode()).digest()


def text_key(space: bytes, text: str) -> bytes:
    """An entry's key: the space, then the sha256 of the exact text the encoder reads."""
    return space + hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class EmbeddingCache:
    """An LRU of float32 vectors bounded by `budget_bytes` (vectors plus `ENTRY_OVERHEAD` each),
    thread-safe, with hit, miss and eviction counters."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 1:
            raise ValueError(f"budget_bytes must be >= 1, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self._entries: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._lock = threading.Lock()

    @staticmethod
    def entry_bytes(vector: np.ndarray) -> int:
        """What one entry holding `vector` counts against the budget."""
        return int(vector.nbytes) + ENTRY_OVERHEAD

    def get_many(self, space: bytes, texts: Sequence[str]) -> list[np.ndarray | None]:
        """The cached vector of each text (None where absent), each found one made the most
        recently used; every text counts as one hit or one miss. The vectors are read-only."""
        keys = [text_key(space, t) for t in texts]
        out: list[np.ndarray | None] = []
        with self._lock:
            for key in keys:
                vector = self._entries.get(key)
                if vector is None:
                    self._misses += 1
                else:
                    self._entries.move_to_end(key)
                    self._hits += 1
                out.append(vector)
        return out

    def put_many(self, space: bytes, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Keep one vector per text (copied as float32, read-only), then evict the least recently
        used entries until the budget holds; a vector over the whole budget is not kept."""
        rows = np.asarray(vectors, dtype=np.float32)
        if len(rows) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(rows)} vectors")
        keys = [text_key(space, t) for t in texts]
        with self._lock:
            for key, row in zip(keys, rows, strict=True):
                vector = np.array(row, dtype=np.float32, copy=True)
                vector.setflags(write=False)
                size = self.entry_bytes(vector)
                if size > self.budget_bytes:
                    continue
                old = self._entries.pop(key, None)
                if old is not None:
                    self._bytes -= self.entry_bytes(old)
                self._entries[key] = vector
                self._bytes += size
                while self._bytes > self.budget_bytes:
                    _, evicted = self._entries.popitem(last=False)
                    self._bytes -= self.entry_bytes(evicted)
                    self._evictions += 1

    def stats(self) -> dict[str, int]:
        """`hits`, `misses`, `evictions`, `entries`, `bytes` (held, as the budget counts them)
        and `budget_bytes`, read together under the lock."""
        with self._lock:
            return {
                "hits": self._hits,
                "misses": self._misses,
                "evictions": self._evictions,
                "entries": len(self._entries),
                "bytes": self._bytes,
                "budget_bytes": self.budget_bytes,
            }

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
