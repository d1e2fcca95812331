"""What a connect to a server that never answers costs the rest of the
process: it shows (``EventLog.connecting_s``, what ``streamd status`` says
before any attempt has failed), and a log closed while it waits leaves it a
thread of its own, never one of Trio's default limiter's 40, and a bounded
number of them (:mod:`streamd.eventlog.handoff`).

Every wait is on a socket the test holds or a thread handshake; the held
connections are let go past each test's bound (``bounded``), so a connect
nothing ends fails the test rather than hangs it.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from support.black_hole import TIMEOUTS, BlackHole, bounded, hole_url

from streamd.eventlog import EventLog

backends = pytest.mark.parametrize("backend", ["postgres", "mysql"])


@backends
async def test_a_connect_under_way_shows_how_long_calls_have_waited_for_it(
        backend: str, mock_clock: trio.testing.MockClock) -> None:
    with BlackHole() as hole, bounded(hole):
        async with EventLog(hole_url(backend, hole.port, TIMEOUTS["none"])) as log:
            assert log.connecting_s is None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(log.ping)
                await hole.wait_held(1)
                assert log.connecting_s == 0
                mock_clock.jump(12)
                # Before: nothing said so: no attempt had failed (none ends).
                assert log.connecting_s == 12
                assert log.fault is None
                nursery.cancel_scope.cancel()
            assert log.connecting_s == 12  # the connect goes on: the log still waits
            await log.aclose()
            assert log.connecting_s is None
