"""What the services raise when they cannot answer a request: what went wrong, never which status
code it is (`cisrank.api.routes.api_error` owns that mapping, the one place HTTP is spoken).

No web framework here (an import-linter contract), so the services stay drivable by any transport.
"""

from __future__ import annotations


class ServiceError(Exception):
    """A request the service cannot answer; the transport decides how to say so."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidField(ServiceError):
    """A field of the request is out of its limits or names something not served here."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


class NotReady(ServiceError):
    """The models are still loading, or loading them failed."""


class LoadFailed(ServiceError):
    """A configured model or index failed to load: permanent until the server is restarted with
    a fixed configuration, so never answered with "retry in N seconds"."""


class Overloaded(ServiceError):
    """Too many requests are already waiting for the reranker."""


class TimedOut(ServiceError):
    """The request was not scored within its timeout."""


class BackendFailed(ServiceError):
    """A served component (an index, its document store) failed: the server's fault, not the
    request's. The message names the component only; the exception is logged."""


class ClientGone(ServiceError):
    """The client hung up before its answer: the work for it was stopped (its next model step
    saw the request cancelled). Nobody reads the answer; it is counted as a client abort."""
