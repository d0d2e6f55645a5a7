"""The `cisrank` command line: `cisrank.cli.app` assembles one module per verb group."""

from cisrank.cli.app import app, main

__all__ = ["app", "main"]
