"""The server's pre-start checks: a server that cannot serve what it is configured to never
starts (`cisrank serve`: one line, exit 2) or never turns ready (an app of `create_app`: 503
`load_failed`, the reason in its log and its `on_loaded`).

Checked, in config order: first that every reranker's kind is one a server may serve (not `none`,
which scores nothing), from the record its spec keeps, before any file is hashed (a factory's
reranker is known only once built: `RerankerSpec.build(serving=True)` refuses one that scores
nothing); then every index in full (it exists; its manifest and the checksum of every file,
`cisrank.indexes.integrity.require_intact`: a half-built or damaged index would never become
ready); every existing prior store row by row (`index verify`'s check: SQLite's integrity_check and
every row's checksum, `require_intact_priors`); and every pulled or shipped model's files against
the sha256 its pull recorded (`cisrank.models.resolve.recorded_folder`, hashed in full; a
catalogue model not pulled yet is pulled first, with one line saying so). Other models are checked
when they load.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cisrank.errors import CisrankError
from cisrank.serving.config import RerankerSpec, ServerConfig


class PreflightError(CisrankError):
    """A configured component failed its pre-start check: the message names it and says what
    is wrong (a server path included: for the operator, never for clients); `component` names
    it alone (`index 'msmarco'`, `reranker 'cis'`)."""

    def __init__(self, component: str, problem: str) -> None:
        super().__init__(f"{component}: {problem}")
        self.component = component


def preflight(config: ServerConfig) -> None:
    """Every index, prior store and recorded model of `config`, checked in full before anything
    is served; the first fault is a `PreflightError`."""
    for name, spec in config.rerankers.items():
        with _blaming(f"reranker '{name}'"):
            check_servable(spec)
    for name, index in config.indexes.items():
        with _blaming(f"index '{name}'"):
            check_index(index.path)
    for name, spec in config.rerankers.items():
        with _blaming(f"reranker '{name}'"):
            check_prior_store(spec)
            check_model(spec)


@contextmanager
def _blaming(component: str) -> Iterator[None]:
    try:
        yield
    except PreflightError:
        raise
    except CisrankError as exc:
        raise PreflightError(component, str(exc)) from None


def check_index(path: Path) -> None:
    """The whole index folder. Its files found intact are not hashed again when the server (in
    this process) opens them."""
    from cisrank.indexes.integrity import require_intact

    if not path.exists():
        raise CisrankError(f"path '{path}' does not exist")
    require_intact(path)


def check_servable(spec: RerankerSpec) -> None:
    """The registry's word on the kind, from the record the spec keeps (not looked up again)."""
    if spec.record is not None and not spec.record.servable:
        from cisrank.rerank.registry import kind_list, servable

        pick = kind_list(servable())
        raise CisrankError(f"kind '{spec.kind}' cannot be served: pick {pick}")


def check_prior_store(spec: RerankerSpec) -> None:
    """The reranker's prior store (`prior_store` option), in full, where any of its files exists
    (a store that does not exist yet is created on first use)."""
    from cisrank.indexes.integrity import require_intact_priors

    store = spec.options.get("prior_store")
    parts = [Path(p.strip()).expanduser() for p in str(store or "").split(",") if p.strip()]
    if any(p.exists() for p in parts):
        require_intact_priors(str(store))


def check_model(spec: RerankerSpec) -> None:
    """The reranker's model (named, or its kind's default) hashed in full where its files were
    recorded: a damaged file stops the start with one line naming it and the command that
    repairs it."""
    record = spec.record
    if record is None:  # a `module:factory` of the user's: its model is its own business
        return
    from cisrank.models.integrity import require_intact_model
    from cisrank.models.resolve import recorded_folder

    model = spec.model or record.default_model
    if model is None:
        return
    folder = recorded_folder(model)
    if folder is not None:
        require_intact_model(folder, full=True)
