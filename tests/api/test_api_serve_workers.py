"""`cisrank serve --workers N`: its workers die with it, and a restarted worker takes no request
before its models are loaded. A real `cisrank serve` subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

import httpx
from api_fakes import SLOW_LOAD_ENV
from serve_process import ServeProcess, serve_env


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                text = Path(f"/proc/{parent}/task/{task}/children").read_text()
            except FileNotFoundError:
                continue
            for child in map(int, text.split()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _workers(pid: int) -> list[int]:
    """The uvicorn workers among `pid`'s children (not multiprocessing's resource tracker)."""
    out = []
    for child in _descendants(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            out.append(child)
    return sorted(out)


def test_workers_die_with_a_killed_parent_and_a_restarted_one_waits_until_loaded(tmp_path):
    """Before: `kill -9` of the parent left both workers serving (re-parented to PID 1, the
    port held); a restarted worker answered 503 `not_ready` to requests (3 of 16) while the
    other was ready; its death was logged at INFO only."""
    slow = tmp_path / "slow-load"
    below: set[int] = set()
    with ServeProcess(
        *("-r", "api_fakes:restart_slow_reranker", "--workers", "2"),
        log=tmp_path / "stderr.txt",
        env=serve_env(**{SLOW_LOAD_ENV: str(slow)}),
    ) as served:
        proc, url = served.proc, served.url
        try:
            workers = _workers(proc.pid)
            below |= _descendants(proc.pid)
            assert len(workers) == 2, workers

            # a worker dies: its replacement loads in 3 s, and takes no request meanwhile
            slow.touch()
            os.kill(workers[0], signal.SIGKILL)
            body = {"query": "hamlet", "documents": ["hamlet", "paris"]}
            loading, loaded = Path(f"{slow}.loading"), Path(f"{slow}.loaded")
            deadline = time.monotonic() + 60
            while not loading.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            statuses = []
            while not loaded.exists() and time.monotonic() < deadline:
                r = httpx.post(url + "/v1/rerank", json=body, timeout=10)  # a new connection each
                statuses.append(r.status_code)
            assert len(statuses) > 5 and set(statuses) == {200}, statuses
            deadline = time.monotonic() + 20
            while len(_workers(proc.pid)) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert f"worker {workers[0]} died (killed by signal 9)" in served.output()

            # the parent is killed: every process below it goes, and the port is free
            below |= _descendants(proc.pid)
            proc.kill()
            proc.wait(10)
            deadline = time.monotonic() + 15
            while any(map(_alive, below)) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not [p for p in below if _alive(p)], "orphans keep serving"
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", served.port))  # nobody holds the port any more
        finally:
            if proc.poll() is None:
                proc.kill()
            for pid in below | _descendants(proc.pid):  # orphans of a failed test included
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
