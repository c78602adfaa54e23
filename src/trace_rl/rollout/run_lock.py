"""One writer per run directory: `run_lock(out, what)` holds an exclusive `flock` on `out/.trace-rl.lock` for the
duration of a run, so a second run on the same directory is refused in one line naming the first (its pid, its
command, when it started) instead of both appending every step to one `metrics.jsonl`.

The kernel releases a flock when its holder dies (SIGKILL, a crash), so a stale lock file never blocks a later
run: the file's content is only what the refusal quotes. The file is removed when the run ends; a directory that
the lock created and that holds nothing else afterwards (a run refused before it wrote anything) is removed too, so
a refused command leaves nothing behind. Advisory: it keeps out other trace-rl runs, not other programs; and a run
directory on a network file system that does not carry flock between machines is not protected across machines.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError

LOCK_NAME = ".trace-rl.lock"
MAX_HOLDER_BYTES = 4096  # what a refusal reads of the holder's note


def _holder(fd: int) -> str:
    """The holder's note (pid, command, start time) as the refusal quotes it; unreadable notes are said so."""
    try:
        raw = os.pread(fd, MAX_HOLDER_BYTES, 0)
        note = json.loads(raw.decode("utf-8"))
        return f"pid {int(note['pid'])}, {note['what']}, started {note['started']}"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "a run whose note is unreadable"


def _open_locked(path: Path) -> int | None:
    """An fd holding the lock on `path`, or None when another process holds it. Retries when the file was
    replaced between open and lock (a finishing run unlinks it): the lock must be on the file the path names."""
    for _ in range(100):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _refuse(fd, path)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise ConfigError(f"out: could not lock {path.parent} (its lock file keeps being replaced)")


def _refuse(fd: int, path: Path) -> None:
    held_by = _holder(fd)
    os.close(fd)
    raise ConfigError(
        f"out: {path.parent} is in use by another trace-rl run ({held_by}); wait for it to end, or choose another out"
    )


@contextlib.contextmanager
def run_lock(out: str | Path, what: str) -> Iterator[None]:
    """Hold `out`'s run lock while the block runs (creating `out`); one line naming the holder if another run
    holds it. `what` names this run in the note a refused run quotes (e.g. 'trace-rl train')."""
    out = Path(out)
    created = []  # the folders this lock creates, deepest first: removed again when the run left them empty
    there = out
    while not there.exists() and not there.is_symlink() and there != there.parent:
        created.append(there)
        there = there.parent
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"out: cannot create the directory {out} ({err.strerror})") from None
    path = out / LOCK_NAME
    try:
        fd = _open_locked(path)
    except ConfigError:
        _remove_if_empty(created)
        raise
    try:
        note = {"pid": os.getpid(), "what": what, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(note).encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # before the unlock: a run that opens the path next creates a fresh file
        os.close(fd)
        _remove_if_empty(created)


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove `folders` (deepest first) while they are empty: what a run wrote stays, and so do their parents."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
