"""Reading files that a damaged disk, a cut copy or a mistaken `mv` may have replaced: regular files only, so a
FIFO or a device in place of a file fails at once instead of blocking the reader for ever; a bounded size, so a
huge file is refused before it is read; JSON whose failures are all one ValueError, so a value the standard
library takes (`Infinity`, `NaN`) or a document nested too deep for its recursive parser (RecursionError) never
escapes as a traceback.

Standard library only: every layer (checkpoints, the metrics reader, the tree viewer) uses it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 << 20  # a manifest, a trainer state or a record is far smaller; a file this large is not one


class NotRegularFile(OSError):
    """The path exists but is not a regular file (a FIFO, a socket, a device, a directory)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"


def check_regular(path: str | Path) -> None:
    """NotRegularFile unless `path` (followed through symlinks) is a regular file; FileNotFoundError if absent."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(f"{path}: {_kind(mode)}, not a regular file")


def read_bytes(path: str | Path, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`. The file is opened non-blocking and checked through
    its descriptor, so a FIFO swapped in after a check cannot block the open or the read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path}: {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise ValueError(f"{path}: {st.st_size} bytes, more than the {max_bytes} a file of this kind may hold")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(max_bytes + 1)
    finally:
        os.close(fd)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (only finite numbers are)")


def loads(text: str | bytes, strict: bool = True) -> Any:
    """json.loads where every failure is a ValueError: bad syntax, invalid UTF-8, nesting too deep; with `strict`,
    also `NaN`, `Infinity` and `-Infinity`, which Python writes but strict JSON readers reject."""
    try:
        if strict:
            return json.loads(text, parse_constant=_no_constant)
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 ({err.reason} at byte {err.start})") from None


def read_json(path: str | Path, max_bytes: int = MAX_JSON_BYTES, strict: bool = True) -> Any:
    """The JSON document in a regular file (see `read_bytes` and `loads`)."""
    return loads(read_bytes(path, max_bytes), strict=strict)
