"""Worker pools outlive nothing: a worker whose parent is killed exits instead of finishing its shard."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads process states from /proc"
)

# A parent that starts one worker on a task that would run for two minutes, then waits.
PARENT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from cisrank.jobs.pool import WorkerPool

    class Sleeper:
        def load(self):
            return None

        def score(self, state, item):
            Path(item + ".tmp").write_text(str(os.getpid()))
            os.replace(item + ".tmp", item)
            time.sleep(120)

    if __name__ == "__main__":
        pool = WorkerPool(Sleeper(), 1)
        pool.submit(sys.argv[1])
        time.sleep(120)
    """
)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child that no one has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize("how", ["kill", "terminate"])
def test_a_worker_exits_when_its_parent_is_killed_mid_task(tmp_path, how):
    script, pid_file = tmp_path / "parent.py", tmp_path / "worker.pid"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(pid_file)])
    try:
        assert _wait_for(pid_file.exists, 60), "the worker never started its task"
        worker = int(pid_file.read_text())
        assert worker != parent.pid and _running(worker)
        getattr(parent, how)()  # SIGKILL or SIGTERM: no cleanup runs in the parent either way
        parent.wait(10)
        assert _wait_for(lambda: not _running(worker), 10), "the orphaned worker kept running"
    finally:
        parent.kill()
        parent.wait(10)
