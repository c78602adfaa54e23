"""The retriever server's logging, off its event loop: uvicorn's and the server's records go through a bounded
queue to a thread that writes stderr, so a stderr nobody reads can never stall the server (records past the
queue are dropped)."""

import logging
import logging.handlers
import queue
import sys
import threading

LOG_QUEUE = 1000  # log records waiting for stderr; past that they are dropped


class DropWhenFull(logging.handlers.QueueHandler):
    """Hands records to a queue without waiting: when the queue is full the record is dropped and counted."""

    def __init__(self, records: queue.Queue):
        super().__init__(records)
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1


_log_handler: DropWhenFull | None = None
_log_lock = threading.Lock()


def log_off_the_loop() -> DropWhenFull:
    """Route uvicorn's and this module's log records through a bounded queue that a thread writes to stderr.
    A stderr that nobody reads (a pipe whose reader stopped) then blocks that thread only: the event loop never
    waits on a log write, and records past LOG_QUEUE are dropped. Once per process; idempotent."""
    global _log_handler
    with _log_lock:
        if _log_handler is None:
            records: queue.Queue = queue.Queue(LOG_QUEUE)
            stream = logging.StreamHandler(sys.stderr)
            stream.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            logging.handlers.QueueListener(records, stream).start()  # a daemon thread
            _log_handler = DropWhenFull(records)
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "trace_rl.envs.retrieval_server"):
            logger = logging.getLogger(name)
            logger.handlers[:] = [_log_handler]
            logger.propagate = False
            logger.setLevel(logging.WARNING)
    return _log_handler
