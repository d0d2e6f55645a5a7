"""Logging setup shared by the CLI and the server: one format, level from settings."""

from __future__ import annotations

import logging

from cisrank import env

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str | int | None = None) -> None:
    level = level or env.log_level()
    logging.basicConfig(level=level, format=_FORMAT, datefmt="%H:%M:%S")
    # Libraries that are chatty at INFO about things users cannot act on.
    for noisy in ("httpx", "urllib3", "filelock", "sentence_transformers", "transformers"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
