"""Optional API keys: `CISRANK_API_KEYS` (comma-separated) turns on `Authorization: Bearer`.

Keys are compared in constant time (`hmac.compare_digest`, against every key, no early exit) so
response timing says nothing about how much of a key was right. Keys are never logged: only their
count is. Probes (`/healthz`, `/readyz`, `/health`) and the API docs stay open.

The key is checked from the request's head, before anything else the app does with the request
(`cisrank.api.middleware.KeyGateMiddleware`, outside the body limit and the in-flight body
budget; this module stays free of the web framework): a client without a
valid key is answered 401 without a byte of its body held or a byte of the budget reserved.
Checked only by the route before, 17 unauthenticated sockets that each declared a 16 MB body held
the whole 256 MiB budget, and every client with a key got 503 for as long as they stayed.
"""

from __future__ import annotations

import hmac
import logging

from cisrank import env

log = logging.getLogger(__name__)


def keys_from_env(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The configured keys (`CISRANK_API_KEYS`); empty when auth is off."""
    return env.api_keys(environ)


class KeyChecker:
    """Decides whether an `Authorization` header carries one of the keys."""

    def __init__(self, keys: tuple[str, ...] | list[str]) -> None:
        self._keys = tuple(k.encode("utf-8") for k in keys)
        if self._keys:
            log.info("API key auth on (%d key(s))", len(self._keys))

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def allows(self, authorization: str | None) -> bool:
        if not self._keys:
            return True
        if not authorization:
            return False
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        given = token.strip().encode("utf-8")
        ok = False
        for key in self._keys:  # no short-circuit: every key is compared
            ok |= hmac.compare_digest(given, key)
        return ok

    def __repr__(self) -> str:  # never show keys, even in a debugger or a log of the app state
        return f"KeyChecker(keys={len(self._keys)})"


UNAUTHORIZED = "missing or invalid API key: send 'Authorization: Bearer <key>'"

OPEN_PATHS = frozenset(
    {"/healthz", "/readyz", "/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)
"""Paths served without a key: the probes (a balancer or an orchestrator has none) and the API
docs, whose assets are under `OPEN_PREFIXES`."""

OPEN_PREFIXES = ("/docs-assets/",)


def is_open(path: str) -> bool:
    """Whether `path` (without the app's root path) is served without a key."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)
