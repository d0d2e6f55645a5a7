"""A real `cisrank serve` process, for the tests that need what no in-process app has: the
socket bound before the models load, the `ready on URL` line, the workers, the signals.

Every such test starts it the same way, here: `python -m cisrank.cli serve ARGS` on a free
port (`--port 0` unless ARGS name one; the port is read back from the ready line, so two tests
never race for a port picked in advance), its stdout and stderr in one log file, a bounded wait
for the ready line whose failure shows the log, and a stop that never leaves it running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

# tests/api: `api_fakes` (the weightless rerankers a served process loads as `api_fakes:NAME`)
API_TESTS = Path(__file__).resolve().parent / "api"
READY = "ready on "


def serve_env(**extra: str) -> dict[str, str]:
    """The environment of a served process: this one's, with `api_fakes` importable, no network
    for models, the server's own log at WARNING, no API keys from the shell that runs the tests,
    then `extra`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(API_TESTS), env.get("PYTHONPATH", "")]))
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", CISRANK_LOG_LEVEL="WARNING")
    env.pop("CISRANK_API_KEYS", None)
    env.update(extra)
    return env


def serve_command(*args: str) -> list[str]:
    """The command line of `cisrank serve ARGS`, on a port the system picks unless ARGS name one."""
    port = () if "--port" in args else ("--port", "0")
    return [sys.executable, "-m", "cisrank.cli", "serve", *args, *port]


def run_serve(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """`cisrank serve ARGS` run to its end, for the starts that must be refused: a server that
    starts anyway is killed at `timeout_s` and fails the test (TimeoutExpired)."""
    return subprocess.run(
        serve_command(*args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(serve_env() if env is None else env),
        check=False,
    )


def one_error_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The one `error: ...` line of a refused start (exit `code`, no traceback), holding every
    needle; the start's stderr is the failure message otherwise."""
    assert proc.returncode == code, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


class ServeProcess:
    """`with ServeProcess(*args, log=path) as served:` a `cisrank serve ARGS` that has said
    `ready on URL` (`served.url`, `served.port`, `served.proc`); stopped on leaving.

    `env` replaces `serve_env()` whole; `preexec_fn` runs in the child before it starts (a lowered
    limit, say). A process that exits, or stays silent for `ready_timeout_s`, fails the test
    with the end of its log."""

    def __init__(
        self,
        *args: str,
        log: Path,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 90,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.args = args
        self.log = log
        self.env = dict(serve_env() if env is None else env)
        self.ready_timeout_s = ready_timeout_s
        self.preexec_fn = preexec_fn
        self.ready_line = ""
        self.url = ""
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self._proc is not None, "the server was not started"
        return self._proc

    def __enter__(self) -> ServeProcess:
        with self.log.open("w") as out:  # a fresh log: a ready line in it is this start's
            self._proc = subprocess.Popen(
                serve_command(*self.args),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=self.preexec_fn,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while not (line := self._ready_line()):
            code = self.proc.poll()
            if code is not None:
                raise AssertionError(f"serve exited {code} before it was ready:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"serve not ready in {self.ready_timeout_s:g} s:\n{self.tail()}"
                )
            time.sleep(0.05)
        self.ready_line = line
        self.url = line.removeprefix(READY).split()[0]
        self.port = int(self.url.rsplit(":", 1)[1])

    def _ready_line(self) -> str:
        return next((x for x in self.output().splitlines() if x.startswith(READY)), "")

    def output(self) -> str:
        """Everything the server wrote so far, stdout and stderr interleaved."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    def tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, then SIGKILL if it is still up after `timeout_s`; its exit code (negative:
        the signal that ended it)."""
        proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode
