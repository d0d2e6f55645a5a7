"""Atomic writes: whole files only, the mode a plain open() gives, and no process-wide side effect."""

import os
import stat
import threading

import pytest

from cisrank import fileio
from cisrank.fileio import atomic_write_bytes, atomic_write_text


@pytest.fixture
def umask_027():
    """A umask distinct from both mkstemp's 0o600 and the raw 0o666, restored afterwards."""
    old = os.umask(0o027)
    try:
        yield 0o027
    finally:
        os.umask(old)


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_written_file_has_the_mode_of_a_plain_open(tmp_path, umask_027):
    with open(tmp_path / "plain", "wb") as f:
        f.write(b"x")
    atomic_write_bytes(tmp_path / "sub" / "atomic", b"payload")
    assert _mode(tmp_path / "sub" / "atomic") == _mode(tmp_path / "plain") == 0o640
    assert (tmp_path / "sub" / "atomic").read_bytes() == b"payload"
    assert os.listdir(tmp_path / "sub") == ["atomic"]  # no temp file left behind


def test_concurrent_file_creation_keeps_the_normal_mode(tmp_path, umask_027, monkeypatch):
    """Another thread creating a file at any instant of an atomic write gets the umask's mode.

    The interleaving is made deterministic: every os.umask call (the process-wide switch a
    umask read needs) is followed at once by another thread's plain open(), as a scheduler might
    run it there."""
    real_umask = os.umask
    seen: list[int] = []

    def umask_then_other_thread(mask):
        previous = real_umask(mask)
        target = tmp_path / f"other-{len(seen)}"

        def create():
            with open(target, "wb"):
                pass

        t = threading.Thread(target=create)
        t.start()
        t.join()
        seen.append(_mode(target))
        return previous

    monkeypatch.setattr(os, "umask", umask_then_other_thread)
    atomic_write_text(tmp_path / "out.txt", "hello")
    monkeypatch.setattr(os, "umask", real_umask)
    assert all(mode == 0o640 for mode in seen), [oct(m) for m in seen]
    assert (tmp_path / "out.txt").read_text() == "hello"
    assert _mode(tmp_path / "out.txt") == 0o640


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "out"
    target.write_bytes(b"old")

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(fileio.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out"]
