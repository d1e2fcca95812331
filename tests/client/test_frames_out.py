"""The blocking client's frame writer, driven without a daemon: an outlet
that says when it has no room, and a signal delivered while a frame waits
for room.

A signal handler runs in the thread it interrupts, between two steps of
whatever that thread was doing: a call made from one while the same thread's
own call was writing its frame (a daemon slow to read a large append) waited
for the writing turn, which the interrupted call holds and cannot give back
until the handler returns: for ever. It is refused at once now (nothing
sent), and the interrupted write goes on."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from streamd.client.frames_out import FrameWriter


@pytest.fixture
def alarm_handler() -> Iterator[list[BaseException | None]]:
    caught: list[BaseException | None] = []
    before = signal.getsignal(signal.SIGALRM)
    yield caught
    signal.signal(signal.SIGALRM, before)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers run in the main thread")
def test_a_call_from_a_signal_handler_during_its_threads_write_is_refused_not_waited_for(
    alarm_handler: list[BaseException | None],
) -> None:
    written = bytearray()
    full = [True]  # the outlet has no room until the signal has come

    def send(data: bytes) -> int:
        if full[0]:
            return 0
        written.extend(data)
        return len(data)

    def writable(timeout: float | None) -> bool:
        if full[0]:
            full[0] = False
            signal.raise_signal(signal.SIGALRM)  # the handler runs here, in this thread
        return True

    writer = FrameWriter((send, writable))
    withdrawn: list[str] = []

    def handler(signum: int, frame: object) -> None:
        try:
            # Bounded, so that the old wait (for ever) fails here instead.
            writer.write(b"from the handler\n", _in(2.0), lambda: withdrawn.append("handler"))
        except BaseException as exc:
            alarm_handler.append(exc)
        else:
            alarm_handler.append(None)

    signal.signal(signal.SIGALRM, handler)
    writer.write(b"the interrupted frame\n", _in(10.0), lambda: withdrawn.append("outer"))
    assert len(alarm_handler) == 1
    refused = alarm_handler[0]
    assert isinstance(refused, RuntimeError), refused
    assert "signal handler" in str(refused)
    assert withdrawn == ["handler"]  # taken back: it never reached the stream
    assert bytes(written) == b"the interrupted frame\n"  # whole, and alone


def _in(seconds: float) -> float:
    return time.monotonic() + seconds
