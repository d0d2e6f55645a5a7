"""Running the `cisrank` command as a user does, for the CLI tests."""

from __future__ import annotations

import subprocess
import sys
import traceback
from dataclasses import dataclass

from typer.testing import CliRunner

from cisrank.cli import app


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`cisrank ARGS...` in a subprocess: its real exit code, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "cisrank.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def help_text(*verb: str) -> str:
    """`cisrank VERB... --help` on a wide terminal (no wrapped rows)."""
    res = CliRunner().invoke(app, [*verb, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.output


def help_pages(*verb: str, columns: int = 200) -> dict[str, str]:
    """`cisrank VERB... --help` and, where the verb has `--help-kind`, each kind's page
    (`--help-kind KIND` for every registry kind the verb takes; one it does not is exit 2),
    keyed by `--help` and the kind."""
    from cisrank.rerank.registry import KINDS

    def invoke(*args: str):
        return CliRunner().invoke(app, [*verb, *args], env={"COLUMNS": str(columns)})

    main = invoke("--help")
    assert main.exit_code == 0, main.output
    pages = {"--help": main.output}
    if "--help-kind" in main.output:
        for kind in KINDS:
            page = invoke("--help-kind", kind)
            assert page.exit_code in (0, 2), page.output
            if page.exit_code == 0:
                pages[kind] = page.output
    return pages


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    @property
    def last_line(self) -> str:
        lines = self.err.strip().splitlines()
        return lines[-1] if lines else ""


def main_in_process(monkeypatch, capsys, *args: str) -> Ran:
    """`cisrank ARGS` through the real entry point (`cisrank.cli.main`), in this process: the
    exit code and output a user sees, without a subprocess's start-up. An exception escaping
    `main` comes back as exit code 99 with its traceback: the bug to catch."""
    from cisrank.cli import main

    monkeypatch.setattr(sys, "argv", ["cisrank", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        out = capsys.readouterr()
        return Ran(99, out.out, out.err + traceback.format_exc())
    out = capsys.readouterr()
    return Ran(code, out.out, out.err)
