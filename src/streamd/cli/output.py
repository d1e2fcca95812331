"""Where a command's output goes, and what a write that fails there means.

The rules, grep's and rg's:

* **A reader gone is not an error.** ``streamd check big.jsonl | head -1``
  closes the pipe after one line; the rest of the output goes to /dev/null
  and the exit status is still what the command found (``check`` that
  printed a failure exits 1, not 0 and not 2). Before, ``check`` caught the
  ``BrokenPipeError`` as a failure to read its input: ``streamd: big.jsonl:
  broken pipe``, exit 2.
* **Any other failed write is an error**, said in one line, exit 2: stdout on
  a full disk (``> /dev/full``), an I/O error. Before, it was a traceback and
  exit 1, which for ``search`` means "no hit", and ``check`` named its input
  file as the one that failed.
* **Descriptors 0, 1 and 2 left closed** by the caller (``>&-``, ``2>&-``, a
  daemon manager) are opened on /dev/null before anything else, as Rust
  programs (rg among them) do at start. Python leaves ``sys.stdout`` (or
  ``sys.stderr``) None then, so the commands failed on it with a traceback
  and exit 1, a message meant for stderr went to stdout (among ``--json``'s
  lines), and the first file the process opened took the free number, where
  a stray write would land in it (the stdio server's own descriptors did,
  and it died at start). Written to /dev/null, the output is gone, as the
  caller asked, and the exit status still says what was found.

Standard library only: ``streamd attach`` imports it on every spawn.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class OutputFailed(Exception):
    """stdout refused a write for a reason other than its reader going away
    (exit 2); the message is the system's reason ("No space left on device")."""


def open_standard_descriptors() -> None:
    """Open /dev/null on each of descriptors 0, 1 and 2 that is closed, and
    give Python a ``sys.stdout`` and ``sys.stderr`` on them if it had none."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)
    # Each lives as long as the process.
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115


class Stdout:
    """The lines a command prints on stdout. ``reader_gone`` is set once a
    write found the pipe's reader gone; every later line is dropped (sent to
    /dev/null), so a command may stop early or carry on to its exit status."""

    def __init__(self) -> None:
        self.reader_gone = False

    def line(self, text: str) -> None:
        """Print ``text`` and a newline (buffered, as ``print`` does)."""
        self._guarded(lambda: print(text))

    def flush(self) -> None:
        """Write what is buffered: every command ends with this, so that a
        failure is said here, and not by the interpreter's last flush (an
        ``Exception ignored`` block, exit 120)."""
        self._guarded(sys.stdout.flush)

    def _guarded(self, write: Callable[[], object]) -> None:
        if self.reader_gone:
            return
        try:
            write()
        except BrokenPipeError:
            self.reader_gone = True
            _discard_the_rest()
        except OSError as exc:
            # What is still buffered would fail again at exit.
            _discard_the_rest()
            raise OutputFailed(exc.strerror or str(exc)) from None


def _discard_the_rest() -> None:
    """Point descriptor 1 at /dev/null: what is buffered, and any later
    write, goes there quietly."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real descriptor (a test's capture): nothing to flush at exit
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)
