"""A database server that stops answering: its processes stopped (SIGSTOP)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence

__all__ = ["stopped"]


@contextlib.contextmanager
def stopped(pids: Sequence[int], most: float = 15.0) -> Iterator[None]:
    """The processes ``pids`` stopped (SIGSTOP) for the block, and at most
    ``most`` seconds whatever the code under test does: continued in a
    finally, so the server can always stop. One that has ended meanwhile (a
    backend whose client just left) is passed over."""

    def send(sig: signal.Signals) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    watchdog = threading.Timer(most, send, (signal.SIGCONT,))
    watchdog.start()
    try:
        send(signal.SIGSTOP)  # inside: a failure half way still continues them all
        yield
    finally:
        watchdog.cancel()
        send(signal.SIGCONT)
