"""Another host may have committed: a wake for watchers of a MySQL log.

MySQL has no LISTEN/NOTIFY, so :class:`PolledChanges` reads the newest seq (the
one row of ``seq_counter``, by primary key, on the log's reader) and wakes when
it moved. The interval follows the log: after a change it polls again at
``floor`` (2 ms), doubling while nothing moves up to ``ceiling`` (50 ms, or
``--watch-interval-ms`` when that is smaller), so a busy log is followed within
milliseconds and an idle one costs the server twenty primary-key reads a
second. The same promise as the other sources: **missed wakes are not allowed,
spurious ones are**. The first poll after entry, and the first after a failed
one (the server away), wake whatever they read, since a commit may have come
between the caller's last confirmation read and that poll.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

import trio

from streamd.errors import RpcError

__all__ = ["CEILING_S", "FLOOR_S", "PolledChanges"]

logger = logging.getLogger(__name__)

FLOOR_S = 0.002
CEILING_S = 0.05


class PolledChanges:
    """Wakes when the newest seq moved (see the module docstring)."""

    def __init__(
        self, poll: Callable[[], Awaitable[int]], *, ceiling: float = CEILING_S,
        floor: float = FLOOR_S,
    ) -> None:
        if not 0 < floor <= ceiling:
            raise ValueError("need 0 < floor <= ceiling")
        self._poll = poll
        self._floor, self._ceiling = floor, ceiling
        self._interval = floor
        self._last: int | None = None  # None: the next poll wakes
        self.polls = 0
        """Polls made (for tests and diagnostics)."""

    async def __aenter__(self) -> PolledChanges:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    @property
    def interval(self) -> float:
        return self._interval

    def expect_commit(self) -> None:
        """Look soon: a commit under way moves the counter when it lands."""
        self._interval = self._floor

    async def wait(self) -> None:
        while True:
            await trio.sleep(self._interval)
            self.polls += 1
            try:
                seq = await self._poll()
            except RpcError as exc:
                logger.debug("event log watch: poll failed: %s", exc.message)
                self._last = None
                self._interval = self._ceiling
                continue
            if seq != self._last:
                self._last = seq
                self._interval = self._floor
                return
            self._interval = min(self._interval * 2, self._ceiling)
