"""What `cisrank eval rag` computed once and never computes again: rankings and generations,
stored by what they are of, so that a rerun, an added reranker, an added k or another run over
the same questions (K = 10 from the K = 20 candidates, the answers after the retrieval figures)
reuses every score and answer it can.

- Scores: one folder per reranker spec (the hash of its kind, model and options), one file per
  scored chunk of questions, written atomically: a run killed midway keeps every chunk it
  finished. An entry is keyed by the query and its candidate texts in order (a reranker may fuse
  over the whole list); for a pointwise reranker (`pointwise`: each passage's score depends on
  the query and that passage alone) each (query, passage) score also serves any other list that
  holds the pair, which is how the K = 10 related set, the top of the K = 20 one, is scored once.
- Parts: for a kind whose settings differ in how they combine the same model sums (CIS:
  estimator, prior, normalization; the registry's `estimate_fields`), one folder per side and
  the options that side reads (`CISRerankerConfig.side_setting`), one file per chunk, each
  pair's sum and token count: every CIS setting of a grid that shares a model pass reads it
  from here, and the prior, which no template or question changes, is stored once a passage.
- Generations: one folder per generator setting (model, template, chat, length, dtype), one file
  per prompt, keyed by the question, the prompt's passages best first and the arrangement: the
  exact prompt is a function of these. Two rerankers that choose the same top k, and a reranker
  whose top 1 is the gold (the gold-only baseline), share one generation.

Each stored item carries the seconds it took to compute, so the cost figures survive a resume.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cisrank.data.datasets import guarded_json
from cisrank.errors import DataError
from cisrank.fileio import atomic_write_text


def digest(value: Any) -> str:
    """A short stable hash of a JSON-able value (keys sorted)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _pair(query: str, text: str) -> str:
    return digest([query, text])


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(
            f"{path}: a damaged cache file ({exc}): delete it and rerun with --resume"
        ) from None
    try:
        return guarded_json(text, str(path))
    except DataError as exc:
        raise DataError(
            f"{path}: a damaged cache file ({str(exc).removeprefix(f'{path}: ')}): delete it "
            "and rerun with --resume"
        ) from None


@dataclass(frozen=True)
class Scored:
    """One query's scores from the cache and the seconds they took (0 where they were put
    together from pairs scored for another list)."""

    scores: list[float]
    seconds: float


class ScoreCache:
    """The stored scores of one reranker (`spec`: its kind, model and options) under `root`."""

    def __init__(self, root: Path, spec: Mapping[str, Any], pointwise: bool) -> None:
        self.folder = Path(root) / "scores" / digest(dict(spec))
        self.pointwise = pointwise
        self._lists: dict[str, Scored] = {}
        self._pairs: dict[str, float] = {}
        if self.folder.is_dir():
            for path in sorted(self.folder.glob("*.json")):
                self._add(_read(path)["entries"])

    def _add(self, entries: Iterable[Mapping[str, Any]]) -> None:
        for e in entries:
            self._lists[e["key"]] = Scored(list(e["scores"]), float(e["seconds"]))
            if self.pointwise:
                self._pairs.update(zip(e["pairs"], e["scores"], strict=True))

    def get(self, query: str, texts: Sequence[str]) -> Scored | None:
        """The stored scores of `texts` for `query`, or None."""
        hit = self._lists.get(digest([query, list(texts)]))
        if hit is not None or not self.pointwise:
            return hit
        pairs = [self._pairs.get(_pair(query, t)) for t in texts]
        if any(p is None for p in pairs):
            return None
        return Scored([float(p) for p in pairs if p is not None], 0.0)

    def put(
        self,
        requests: Sequence[tuple[str, Sequence[str]]],
        scores: Sequence[Sequence[float]],
        seconds: float,
    ) -> None:
        """Store one chunk's scores (`seconds`: the chunk's model time, shared evenly by its
        queries) as one file, atomically."""
        each = seconds / max(len(requests), 1)
        entries = [
            {
                "key": digest([query, list(texts)]),
                "pairs": [_pair(query, t) for t in texts],
                "scores": [float(s) for s in values],
                "seconds": each,
            }
            for (query, texts), values in zip(requests, scores, strict=True)
        ]
        self.folder.mkdir(parents=True, exist_ok=True)
        name = digest([e["key"] for e in entries])
        atomic_write_text(self.folder / f"{name}.json", json.dumps({"entries": entries}))
        self._add(entries)


class PartsCache:
    """The stored model sums of one side (`conditional`, `prior` or `query_likelihood`) of
    one CIS model setting (`key`: kind, model, side and `CISRerankerConfig.side_setting`)
    under `root`: each pair's sum and token count and each list's seconds, so that every
    estimate, prior and normalization of that setting, and every template the side does not
    read, reads one pass of the model. A `query_free` side (the prior, log p(K)) is stored per
    passage, whichever question it came with. Stored as `ScoreCache` stores scores: one file
    per chunk, written atomically."""

    COUNT: ClassVar[dict[str, str]] = {
        "conditional": "doc_tokens",
        "prior": "doc_tokens",
        "query_likelihood": "query_tokens",
    }

    def __init__(
        self, root: Path, side: str, key: Mapping[str, Any], query_free: bool = False
    ) -> None:
        if side not in self.COUNT:
            raise ValueError(f"unknown side {side!r}: {sorted(self.COUNT)}")
        self.side = side
        self.query_free = query_free
        self.folder = Path(root) / "parts" / digest({**key, "side": side})
        self._pairs: dict[str, tuple[float, float, float]] = {}  # value, tokens, seconds
        self._seconds: dict[str, float] = {}
        if self.folder.is_dir():
            for path in sorted(self.folder.glob("*.json")):
                self._add(_read(path)["entries"])

    def _key(self, query: str, text: str) -> str:
        return _pair("" if self.query_free else query, text)

    def _add(self, entries: Iterable[Mapping[str, Any]]) -> None:
        for e in entries:
            self._seconds[e["key"]] = float(e["seconds"])
            each = float(e["seconds"]) / max(len(e["pairs"]), 1)
            for pair, value, tokens in zip(e["pairs"], e["values"], e["tokens"], strict=True):
                self._pairs[pair] = (float(value), float(tokens), each)

    def has(self, query: str, texts: Sequence[str]) -> bool:
        return all(self._key(query, t) in self._pairs for t in texts)

    def missing(
        self, requests: Sequence[tuple[str, list[str]]], passages_per_request: int
    ) -> list[tuple[str, list[str]]]:
        """The requests still to compute: those with a pair not stored; for a query-free side,
        each distinct passage not stored, once, `passages_per_request` to a request."""
        if not self.query_free:
            return [r for r in requests if not self.has(*r)]
        texts = list(dict.fromkeys(t for _, ts in requests for t in ts if not self.has("", [t])))
        n = passages_per_request
        return [("", texts[a : a + n]) for a in range(0, len(texts), n)]

    def parts(self, query: str, texts: Sequence[str]) -> list[dict[str, float]]:
        """Each pair's stored sum under the side's name, with the token count `estimate`
        divides by."""
        count = self.COUNT[self.side]
        out = []
        for t in texts:
            value, tokens, _ = self._pairs[self._key(query, t)]
            out.append({self.side: value, count: tokens})
        return out

    def seconds(self, query: str, texts: Sequence[str]) -> float:
        """The model seconds of this side for this list: its chunk's share (0 for a list whose
        pairs were scored for another: K = 10 read from K = 20); for a query-free side, each
        passage's share of the chunk that computed it, summed over the list (what the list
        costs with no passage shared)."""
        if self.query_free:
            return sum(self._pairs[self._key(query, t)][2] for t in texts)
        return self._seconds.get(digest([query, list(texts)]), 0.0)

    def put(
        self,
        requests: Sequence[tuple[str, Sequence[str]]],
        parts: Sequence[Sequence[Mapping[str, float]]],
        seconds: float,
    ) -> None:
        """Store one chunk of this side (`seconds`: its model time, shared evenly by its
        requests) as one file, atomically."""
        each = seconds / max(len(requests), 1)
        count = self.COUNT[self.side]
        entries = [
            {
                "key": digest([query, list(texts)]),
                "pairs": [self._key(query, t) for t in texts],
                "values": [float(p[self.side]) for p in rows],
                "tokens": [int(p[count]) for p in rows],
                "seconds": each,
            }
            for (query, texts), rows in zip(requests, parts, strict=True)
        ]
        self.folder.mkdir(parents=True, exist_ok=True)
        name = digest([e["key"] for e in entries])
        atomic_write_text(self.folder / f"{name}.json", json.dumps({"entries": entries}))
        self._add(entries)


class GenerationCache:
    """The stored answers of one generator setting (`setting`) under `root`."""

    def __init__(self, root: Path, setting: Mapping[str, Any]) -> None:
        self.folder = Path(root) / "generations" / digest(dict(setting))

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        return _read(path) if path.is_file() else None

    def put(self, key: str, answer: Mapping[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(dict(answer), ensure_ascii=False))


def prompt_key(question: str, passages: Sequence[Any], arrange: str) -> str:
    """The key of one generation: the question, its passages best first (title and text) and
    their arrangement, which with the generator setting make the exact prompt."""
    return digest([question, [[p.title, p.text] for p in passages], arrange])
