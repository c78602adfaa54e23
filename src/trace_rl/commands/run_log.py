"""What one run of `compare` prints, told apart from the others: every line it writes (its header, its step
lines, its evaluation progress, its final lines) also goes to `run.log` in its own folder, and with
`workers` > 1, where two runs print at once, each line on the terminal starts with the run's label
(`[trace seed100] step 3/40 ...`).

`run_output` swaps `sys.stdout` and `sys.stderr` for the run's duration: everything that prints through them is
caught (print, tqdm bars, warnings), what a library writes to the file descriptors themselves is not. A line that
redraws itself with a carriage return (a progress bar, the rollout progress line) becomes a line of its own in the
log and, when labelled, on the terminal, once every `redraw_every` seconds while the redrawing lasts (a bar done
sooner shows none; the line a newline ends always shows), so two runs' bars never fight over one terminal line
and the log keeps a long evaluation's progress without every redraw. Unlabelled (one worker), the terminal gets
exactly what the run wrote, as without this module.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TextIO

LOG = "run.log"


class RunLog:
    """The run's log file, opened on the first line once its folder exists (a run that is refused before its
    folder is made leaves no log behind: the lines wait in memory and are dropped). Appends, so a resumed run's
    log holds every session, each under a line that says when it began."""

    def __init__(self, path: Path, title: str):
        self.path, self.title = Path(path), title
        self.waiting: list[str] = []
        self.fh: TextIO | None = None
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        with self.lock:
            if self.fh is None and not self.path.parent.is_dir():
                self.waiting.append(text)
                return
            if self.fh is None:
                self.fh = open(self.path, "a", encoding="utf-8")
                self.fh.write(f"--- {datetime.now().isoformat(timespec='seconds')} {self.title}\n")
                self.fh.writelines(w + "\n" for w in self.waiting)
                self.waiting = []
            self.fh.write(text + "\n")
            self.fh.flush()

    def close(self) -> None:
        with self.lock:
            if self.fh is not None:
                self.fh.close()
                self.fh = None


class RunStream(io.TextIOBase):
    """A text stream standing in for stdout or stderr during one run: each complete line goes to the log, and to
    `target` with `prefix` before it (`prefix` None: the text goes to `target` unchanged)."""

    def __init__(
        self,
        target: TextIO,
        log: RunLog,
        prefix: str | None,
        redraw_every: float = 30.0,
        clock=time.monotonic,
    ):
        self.target, self.log, self.prefix = target, log, prefix
        self.redraw_every, self.clock = redraw_every, clock
        self.buffer_text = ""
        self.quiet_since: float | None = None  # when the current run of redrawn lines began, or last showed one

    # what tqdm and print look at
    @property
    def encoding(self) -> str:
        return getattr(self.target, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self.prefix is None and self.target.isatty()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.prefix is None:
            self.target.write(text)
            if "\n" in text:  # stdout is block-buffered into a pipe: a line must not fall behind stderr's
                self.target.flush()
        self.buffer_text += text
        while True:
            cut = min((i for i in (self.buffer_text.find("\n"), self.buffer_text.find("\r")) if i >= 0), default=-1)
            if cut < 0:
                break
            segment, end = self.buffer_text[:cut], self.buffer_text[cut]
            self.buffer_text = self.buffer_text[cut + 1 :]
            self._segment(segment, redrawn=end == "\r")
        return len(text)

    def _segment(self, text: str, redrawn: bool) -> None:
        if redrawn:  # a line the next carriage return overwrites: one every redraw_every seconds while it lasts
            if not text.strip():  # a bar cleared: the redrawing is over
                self.quiet_since = None
                return
            now = self.clock()
            if self.quiet_since is None:
                self.quiet_since = now
            if now - self.quiet_since < self.redraw_every:
                return
            self.quiet_since = now
        else:
            self.quiet_since = None
        self.log.line(text)
        if self.prefix is not None:
            self.target.write(f"{self.prefix}{text}\n" if text.strip() else "\n")
            self.target.flush()

    def flush(self) -> None:
        self.target.flush()

    def finish(self) -> None:
        """A last line without its newline, written as a line."""
        if self.buffer_text.strip():
            self._segment(self.buffer_text, redrawn=False)
        self.buffer_text = ""
        self.flush()


@contextmanager
def run_output(run: Path, label: str, labelled: bool, redraw_every: float = 30.0) -> Iterator[RunLog]:
    """For the block's duration, what the process prints is the run's (`run`: its folder, where run.log goes;
    `label`: what its lines start with on the terminal when `labelled`). Restores stdout and stderr after."""
    log = RunLog(run / LOG, label)
    prefix = f"[{label}] " if labelled else None
    saved = sys.stdout, sys.stderr
    saved[0].flush()
    out, err = (RunStream(s, log, prefix, redraw_every) for s in saved)
    sys.stdout, sys.stderr = out, err
    try:
        yield log
    finally:
        for stream in (out, err):
            stream.finish()
        sys.stdout, sys.stderr = saved
        log.close()
