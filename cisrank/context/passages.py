"""Reading the passages of one context: jsonl (`text`, optional `title`, `id`) or one per line."""

from __future__ import annotations

from pathlib import Path

from cisrank.data.datasets import LineFault, bounded_lines, guarded_json
from cisrank.data.types import Passage
from cisrank.errors import CisrankError


def read_passages(path: str | Path) -> list[Passage]:
    """The passages of a file in file order (best first, as a reranker ranked them): jsonl
    objects with a non-empty `text` and optional `title` and `id`, or plain lines of text."""
    return read_scored_passages(path)[0]


def read_scored_passages(path: str | Path) -> tuple[list[Passage], list[float] | None]:
    """`read_passages` and the reranker scores of the jsonl field `score`, if every line has one
    (None otherwise). Lines are read as the API reads a body (`bounded_lines`, `guarded_json`):
    a line over 16 MiB, one that is not UTF-8 or a JSON value nested too deep is one line
    naming `file:line`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CisrankError(f"passages file '{path}' does not exist")
    out: list[Passage] = []
    scores: list[float | None] = []
    for lineno, raw in bounded_lines(path, "passages", universal=True):
        if isinstance(raw, LineFault):  # over the API's body size, or not UTF-8
            raise CisrankError(raw.message)
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            obj = guarded_json(line, f"{path}:{lineno}")
            if not isinstance(obj, dict) or "text" not in obj:
                raise CisrankError(f"{path}:{lineno}: expected a JSON object with a 'text' field")
            text = obj["text"]
            title = obj.get("title", "")
            if not isinstance(text, str) or not text.strip():
                raise CisrankError(f"{path}:{lineno}: 'text' must be a non-empty string")
            if not isinstance(title, str):
                raise CisrankError(f"{path}:{lineno}: 'title' must be a string")
            score = obj.get("score")
            if score is not None and (
                isinstance(score, bool) or not isinstance(score, int | float)
            ):
                raise CisrankError(f"{path}:{lineno}: 'score' must be a number")
            out.append(Passage(str(obj.get("id", len(out))), text, title))
            scores.append(None if score is None else float(score))
        else:
            out.append(Passage(str(len(out)), line))
            scores.append(None)
    if not out:
        raise CisrankError(f"passages file '{path}' holds no passages")
    if any(s is None for s in scores):
        return out, None
    return out, [float(s) for s in scores if s is not None]
