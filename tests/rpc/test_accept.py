"""Accepting connections while the process is short of descriptors.

``accept`` fails with EMFILE for as long as a client holds every descriptor
the process may open; the socket server retries and serves the waiting
connection once one is free, and says so in the log at most once in
``LOG_EVERY_S``, not at every retry. The failures are made by wrapping the
listener's ``accept``. The real clock (the daemon starts threads, which a
mock clock would jump past), with the retry and log periods shortened, and
the log lines bounded by the time the retries actually took.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
import trio
from support.rpc_client import Client

from streamd.daemon import Config, Daemon, serve_socket
from streamd.rpc import accept

pytestmark = pytest.mark.subprocess

SHORT_FOR = 50  # failed accepts
LOG_EVERY_S = 1.0


async def test_an_accept_short_of_descriptors_is_retried_and_logged_at_most_once_a_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(accept, "RETRY_S", 0.001)
    monkeypatch.setattr(accept, "LOG_EVERY_S", LOG_EVERY_S)
    real_accept = trio.SocketListener.accept
    failed = 0
    first_failure = last_failure = 0.0

    async def short_of_descriptors(listener: trio.SocketListener) -> trio.SocketStream:
        nonlocal failed, first_failure, last_failure
        if failed < SHORT_FOR:
            failed += 1
            first_failure = first_failure or trio.current_time()
            last_failure = trio.current_time()
            await trio.lowlevel.checkpoint()
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return await real_accept(listener)

    monkeypatch.setattr(trio.SocketListener, "accept", short_of_descriptors)
    caplog.set_level(logging.ERROR)
    path = str(tmp_path / "streamd.sock")
    daemon = Daemon(Config(db=str(tmp_path / "events.db")))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_socket, daemon, path)
            # Waits in the listen backlog while accept fails.
            client = Client(await trio.open_unix_socket(path))
            await client.send({"jsonrpc": "2.0", "id": 1, "method": "no/such"})
            assert (await client.frame())["error"]["code"] == -32601
            nursery.cancel_scope.cancel()
    assert failed == SHORT_FOR
    lines = [r.getMessage() for r in caplog.records if "accept" in r.getMessage()]
    # Before: a traceback at every retry (trio.serve_listeners), 50 of them.
    assert 1 <= len(lines) <= 1 + (last_failure - first_failure) / LOG_EVERY_S, lines
    assert lines[0] == (
        f"accept failed 1 time in the last {LOG_EVERY_S:g} s, retried every 0.001 s:"
        " [Errno 24] Too many open files"
    )


class _Failing:
    """A listener whose accept fails (EMFILE) at the given times, then waits."""

    def __init__(self, at: list[float]) -> None:
        self.at = at

    async def __aenter__(self) -> _Failing:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def accept(self) -> trio.SocketStream:
        if not self.at:
            await trio.sleep_forever()
        await trio.sleep_until(self.at.pop(0))
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


async def test_failures_counted_long_before_a_line_are_not_said_to_be_of_the_last_period(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # Failures at 0 (logged), 1 and 2 s, then one at 100 s: its line said
    # "3 times in the last 10 s", of which two were 98 s old.
    caplog.set_level(logging.ERROR)
    t0 = trio.current_time()
    listener = _Failing([t0, t0 + 1, t0 + 2, t0 + 100])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept.accept_forever, listener, None, nursery)  # type: ignore[arg-type]
        await trio.sleep(200)
        nursery.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if "accept" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[1].startswith("accept failed 3 times in the last 100 s,"), lines
