"""Reading files that a damaged disk, a cut copy or a mistaken `mv` may have replaced: regular files only, so a
FIFO or a device in place of a file fails at once instead of blocking the reader for ever; a bounded size, so a
huge file is refused before it is read; JSON whose failures are all one ValueError, so a value the standard
library takes (`Infinity`, `NaN`) or a document nested too deep for its recursive parser (RecursionError) never
escapes as a traceback.

The files a user names (task rows, a retrieval corpus, trees, a run's records) are read line by line with
`read_lines`: each line and the whole file have a bound (`BOUNDS`), and reading stops one line past it with one
line (`TooLarge`, a UserError) naming the file, the line and the bound, so a file of one 2 GiB line is refused
after 16 MiB instead of being read whole. Documents read whole (`read_bytes`, `read_json`) are bounded by size.

Standard library only (and `errors`): every layer (checkpoints, the metrics reader, the tree viewer) uses it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UserError

MiB, GiB = 1 << 20, 1 << 30
MAX_JSON_BYTES = 64 * MiB  # a manifest, a trainer state or a summary is far smaller; a file this large is not one


@dataclass(frozen=True)
class Bound:
    """The bounds on one kind of file: bytes per line, bytes in all (None: no bound beyond the disk's), bytes of a
    `.json` file read as one document (which is parsed whole, so it needs a tighter bound than JSON lines)."""

    what: str  # what a line of the file is, for the message
    line: int
    file: int | None
    document: int = 1 * GiB


# The bounds, by kind of file. Each is far above what real use writes (measured or worked out below), far below
# what one process can hold once parsed (Python's objects take several times the bytes they are read from):
BOUNDS: dict[str, Bound] = {
    # `eval data=`, train's task files: a row is a question and its answers (kilobytes); a training set of
    # millions of rows is a few GB. .parquet task files are bounded by `file` too, on disk and decompressed
    # (`envs.data`).
    "tasks": Bound("a task row", 16 * MiB, 4 * GiB),
    # `env.qa.corpus=`, `serve-retriever corpus=`: a passage is ~100 words; wiki-18's 21 M passages are ~14 GB of
    # JSON lines, so a JSON-lines corpus has no file bound; a .json corpus (parsed whole) up to 1 GiB.
    "corpus": Bound("a passage", 16 * MiB, None),
    # `view trees=`, `load_trees` (a predictor's warm-up): one tree a line holds every node's token ids and
    # log-probs, ~20-30 bytes a token (measured on this package's runs); a 64-leaf tree of 32k-token contexts is
    # ~50 MB. A file of a long run's trees past 4 GiB: view a slice of it (`head -n`).
    "trees": Bound("a tree", 256 * MiB, 4 * GiB),
    # a run's metrics.jsonl and predictions.jsonl (`diagnose`, `compare`, `report keep=`): a record is a few KB;
    # 1,000 steps of 2,000 predictions are ~600 MB.
    "records": Bound("a record", 16 * MiB, 4 * GiB),
}


class BadFile(UserError, ValueError):
    """A file the user named that cannot be read as one of its kind (past a bound, not UTF-8); the message names
    the file and the line (a ValueError too, for callers that catch a reader's ValueError)."""


class TooLarge(BadFile):
    """A file, or a line of it, past its bound."""


def _size(n: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n:,} bytes"


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
            raise TooLarge(f"{path}: {st.st_size:,} bytes, over the {_size(max_bytes)} bound on such a file")
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


def read_raw_lines(path: str | Path, kind: str) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line's bytes without its newline) of a regular file of `kind` (a key of BOUNDS), blank
    lines included, undecoded (for a reader that tolerates a line torn mid-character, such as a run's own records
    after a kill). Never holds more than one line of at most the line bound (plus one byte) in memory: TooLarge
    as soon as a line or the file passes its bound, NotRegularFile for a FIFO or a device (opened non-blocking,
    so it cannot block the open), FileNotFoundError if absent. The bounds are read at each call, so a test may
    lower them."""
    bound = BOUNDS[kind]
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path}: {_kind(st.st_mode)}, not a regular file")
        if bound.file is not None and st.st_size > bound.file:
            raise TooLarge(f"{path}: {st.st_size:,} bytes, over the {_size(bound.file)} bound on such a file")
        total, lineno = 0, 0
        while raw := fh.readline(bound.line + 1):  # one byte past the bound tells a line at the bound from a longer one
            lineno += 1
            total += len(raw)
            body = raw[:-1] if raw.endswith(b"\n") else raw
            if len(body) > bound.line:
                raise TooLarge(f"{path}:{lineno}: a line over {_size(bound.line)}, the bound on {bound.what}")
            if bound.file is not None and total > bound.file:  # it grew while read
                raise TooLarge(f"{path}: over the {_size(bound.file)} bound on such a file (by line {lineno})")
            yield lineno, body


def read_lines(path: str | Path, kind: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its newline) of a regular file of `kind` (a key of BOUNDS), blank lines
    included: `read_raw_lines`, each line decoded, BadFile for a line that is not UTF-8."""
    for lineno, body in read_raw_lines(path, kind):
        try:
            line = body.decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadFile(f"{path}:{lineno}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        yield lineno, line
