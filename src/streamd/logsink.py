"""Logging that never blocks the daemon.

stderr is usually a pipe to whoever started the daemon, and nothing obliges
that process to read it: once the pipe's buffer (64 KiB on Linux) is full, a
plain ``StreamHandler`` blocks the thread that logs, which for a Trio daemon
is the event loop, so every client stops being served. Here a record is only
formatted and put on a bounded queue; one thread writes stderr. While that
thread is blocked the queue fills, and from then on records are dropped and
counted, never waited for; the count is written as soon as a line gets
through again (or when the sink closes), so a reader learns what it missed.

The resident daemon logs to a rotated file instead (:func:`install_file`),
through the same queue and thread: a disk that stalls, and the renames of a
rotation, then cost the writer thread, never the event loop.
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import os
import queue
import threading
from collections.abc import Callable
from typing import TextIO

# Records waiting for the writer thread. Enough for any burst the daemon
# logs at the default level; beyond it a stalled stderr loses lines.
QUEUE_RECORDS = 1024
# How long exit waits for queued lines to reach stderr before abandoning
# them (and a writer thread blocked on a pipe nobody reads).
CLOSE_TIMEOUT = 0.5
# The resident daemon's log file: rotated at this size, this many old files kept.
FILE_MAX_BYTES = 5 << 20
FILE_BACKUPS = 3

_STOP = object()


class LogSink:
    """A bounded queue of records and the one thread that writes them."""

    def __init__(
        self,
        output: TextIO | logging.Handler,
        formatter: logging.Formatter,
        *,
        capacity: int = QUEUE_RECORDS,
        name: str = "stderr was not being read",
    ) -> None:
        """``output``: a stream, or a handler only the writer thread will call;
        ``name`` completes "N log lines were dropped while ..."."""
        self._queue: queue.Queue[object] = queue.Queue(capacity)
        self._lock = threading.Lock()
        self._dropped = 0
        self._name = name
        if not isinstance(output, logging.Handler):
            output = logging.StreamHandler(output)
        self._output = output
        self._output.setFormatter(formatter)
        self.handler: logging.Handler = _QueueHandler(self._queue, self.offer)
        self._thread = threading.Thread(target=self._write, name="streamd-log", daemon=True)
        self._thread.start()

    def offer(self, record: logging.LogRecord) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    @property
    def dropped(self) -> int:
        """Records dropped and not yet reported."""
        with self._lock:
            return self._dropped

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Let the writer drain the queue for up to ``timeout`` seconds."""
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _write(self) -> None:
        while True:
            record = self._queue.get()
            self._report_dropped()
            if record is _STOP:
                return
            assert isinstance(record, logging.LogRecord)
            self._output.handle(record)

    def _report_dropped(self) -> None:
        with self._lock:
            count, self._dropped = self._dropped, 0
        if count:
            self._output.handle(
                logging.makeLogRecord({
                    "name": "streamd.log",
                    "levelno": logging.WARNING,
                    "levelname": "WARNING",
                    "msg": f"{count} log lines were dropped while {self._name}",
                })
            )


class _QueueHandler(logging.handlers.QueueHandler):
    """Formats on the caller's thread (arguments and tracebacks are turned
    into text while they are still valid) and never waits for room."""

    def __init__(
        self, records: queue.Queue[object], offer: Callable[[logging.LogRecord], None]
    ) -> None:
        super().__init__(records)
        self._offer = offer

    def enqueue(self, record: logging.LogRecord) -> None:
        self._offer(record)


def install(level: int, stream: TextIO, fmt: str) -> LogSink | None:
    """Send the root logger's records through a LogSink to ``stream``.

    Like ``logging.basicConfig``, does nothing when the root logger already
    has handlers (a second call, or a host such as pytest that captures logs).
    """
    return _install(level, stream, fmt, "stderr was not being read")


def install_file(level: int, path: str, fmt: str, *, make_directory: bool = True) -> LogSink | None:
    """Send the root logger's records through a LogSink to a file rotated at
    ``FILE_MAX_BYTES`` with ``FILE_BACKUPS`` old files, its directory made 0700
    if missing (with ``make_directory``). Raises OSError if the file cannot be opened."""
    if make_directory:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=FILE_MAX_BYTES, backupCount=FILE_BACKUPS, encoding="utf-8"
    )
    return _install(level, handler, fmt, f"{path} could not be written")


def _install(level: int, output: TextIO | logging.Handler, fmt: str, name: str) -> LogSink | None:
    root = logging.getLogger()
    if root.handlers:
        if isinstance(output, logging.Handler):
            output.close()
        return None
    sink = LogSink(output, logging.Formatter(fmt), name=name)
    root.addHandler(sink.handler)
    root.setLevel(level)
    # Registered after logging's own exit hook, so it runs first.
    atexit.register(sink.close)
    return sink
