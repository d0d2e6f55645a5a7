"""Errors a user can act on.

Every failure that the user can fix (a bad path, an unknown name, a missing extra) is raised as a
`CisrankError` whose message says what was wrong and what to do. The CLI prints that message on one
line and exits non-zero; the API maps it to a 4xx. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from json import JSONDecodeError


class CisrankError(Exception):
    """Base class for errors caused by input or environment, never by a bug."""

    exit_code: int = 2


class DataError(CisrankError):
    """A dataset folder or file is missing or malformed."""


class DamagedFileError(DataError):
    """A file cisrank wrote is no longer what was written: bytes flipped, truncated, unreadable.

    Raised instead of ranking with it: a damaged index gives silently wrong results, which is worse
    than none. It names the file (`path`) and says to rebuild or restore it; it is the server's
    fault, never the client's, so a transport reports it as a server error.
    """

    def __init__(self, path: object, detail: str) -> None:
        super().__init__(f"{path}: damaged file ({detail}): restore it or rebuild the index")
        self.path = str(path)
        self.detail = detail


class ModelNotFoundError(CisrankError):
    """A model id or path cannot be resolved to weights on this machine."""


class UnknownRerankerError(CisrankError):
    """The name does not match any registered reranker."""


class MissingExtraError(CisrankError):
    """An optional dependency is not installed; the message names the extra."""

    def __init__(self, module: str, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the Python package '{module}', which is not installed: "
            f"run `pip install 'cisrank[{extra}]'`"
        )
        self.module = module
        self.extra = extra


def require(module: str, extra: str, feature: str):
    """Import an optional dependency lazily, turning ImportError into an actionable message."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingExtraError(module, extra, feature) from exc


def json_error(exc: JSONDecodeError) -> str:
    """What is wrong with a broken line of a JSON-lines file, for a message that names the file
    and the line: `invalid JSON (Expecting ',' delimiter at column 12)` (`at line 3 column 12`
    where the text is a whole file of several lines). A few of `json`'s
    messages end in "at" themselves (`Unterminated string starting at`)."""
    at = "" if exc.msg.endswith(" at") else " at"
    # a whole file (a config, a candidates array) is named by line too; a line of a JSON-lines
    # file by its column only (the caller names the line)
    line = f" line {exc.lineno}" if "\n" in exc.doc.rstrip("\r\n") else ""
    return f"invalid JSON ({exc.msg}{at}{line} column {exc.colno})"
