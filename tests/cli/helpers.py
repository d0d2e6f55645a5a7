"""Running the `cisrank` command as a user does, for the CLI tests."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from cisrank.cli import app


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`cisrank ARGS...` in a subprocess: its real exit code, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "cisrank.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def help_text(*verb: str) -> str:
    """`cisrank VERB... --help` on a wide terminal (no wrapped rows)."""
    res = CliRunner().invoke(app, [*verb, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.output
