"""What all of a server's connections hold together, and who waits past it.

Each connection is bounded on its own (:mod:`~streamd.rpc.server`: its
requests' params, estimated decoded, and its unwritten answers), but nothing
bounded their sum: 64 clients each pipelining ``eventlog/watch`` params of
small strings, or ``eventlog/since`` pages they never read, took the daemon
to gigabytes (``bench/held_memory.py``). The rules:

* Every connection has an :class:`Account` of what it holds: the unfinished
  frame its reader holds (up to 8 MiB, a read at a time), its requests'
  params from dispatch to answer (the in-flight estimate), a bulk answer
  from its start (up to a share, :data:`~streamd.rpc.bounds.BULK_ANSWER_BYTES`)
  and its answers from the moment they are queued until the peer has taken
  them.
* A read, a request or a bulk answer goes ahead at once while the total
  stays within half the limit: the *common* half, first come, first served.
  Past it, a connection still goes ahead while what it holds stays within its
  *share*: the other half divided among the open connections. A connection
  past both waits (its reader stops reading: back-pressure, not an error)
  until others free room or it holds less.
* So a client that holds little is served at once whatever the others hold,
  and the total stays within the limit (half for the common part, plus at
  most a share for each connection), but for answers that cannot wait (a
  queued append's reply, charged whatever the total), the read that took a
  connection past its share (64 KiB at most) and a share that shrinks while
  it is held because a connection joined.
* The hog is the one that waits: it is past its share by definition, and a
  waiter is woken by any release, its own peer reading included.
* One waiter at a time goes ahead anyway: a connection that would wait
  takes the *overdraft* if no other holds it, and keeps it until what it
  holds is within the rules again (or it closes). Without it, what held the room could be freed
  only by reads that waited for it: two clients each half through a frame
  past their shares never finished them, and a lone client's request past
  half the limit never dispatched, both for good (their peers' hang-ups went
  unread too). So the total may pass the limit by what one connection holds
  on its own bounds, never by one for each. The price: the others past the
  rules wait meanwhile, and a holder that stays past them keeps the
  overdraft for as long as it does: while requests that last hold it there
  (watches and their params), or its peer reads none of its answers or
  stops sending inside a frame, up to as long as it stays connected. A
  connection within its share is served at once all the same.

No I/O here; waiting is a parking lot, as in :mod:`~streamd.rpc.inflight`.
"""

from __future__ import annotations

import trio

__all__ = ["DEFAULT_MAX_HELD_BYTES", "Account", "HeldBudget", "admits", "share"]

DEFAULT_MAX_HELD_BYTES = 1 << 30
"""Half of it (512 MiB) for whoever comes first: two requests of the largest
params (256 MiB estimated, ``MAX_DECODED_BYTES``) fit in it, so a lone
client is refused nothing it would be served without this bound. The other
half is 1 MiB a connection at the 512 connections a daemon serves."""


def admits(total: int, held: int, size: int, connections: int, limit: int) -> bool:
    """Whether ``size`` more bytes go to a connection holding ``held`` while
    all ``connections`` hold ``total`` (see the module docstring)."""
    return total + size <= limit // 2 or held + size <= share(connections, limit)


def share(connections: int, limit: int) -> int:
    """What each of ``connections`` may hold past the common half of ``limit``."""
    return (limit - limit // 2) // max(connections, 1)


class HeldBudget:
    """The bytes all of one server's connections hold."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the daemon-wide held-bytes limit must be positive")
        self.limit = limit
        self.total = 0
        """The sum of every open account's ``held``."""
        self.peak = 0
        """The highest ``total`` seen (what the tests assert on, never RSS)."""
        self.accounts = 0
        self.overdraft: Account | None = None
        """The one account let past the rules now (see the module docstring)."""
        self._freed = trio.lowlevel.ParkingLot()

    def open(self) -> Account:
        self.accounts += 1
        return Account(self)

    def admits(self, held: int, size: int) -> bool:
        return admits(self.total, held, size, self.accounts, self.limit)

    def share(self) -> int:
        return share(self.accounts, self.limit)

    def add(self, n: int) -> None:
        """An account holds ``n`` bytes more (fewer when negative)."""
        self.total += n
        if n > 0:
            self.peak = max(self.peak, self.total)
            return
        self.settle()
        if self._freed:
            self._freed.unpark_all()

    def settle(self) -> None:
        """Take the overdraft back once its holder is within the rules again
        (whoever let go: the total may have come back within the common half)."""
        holder = self.overdraft
        if holder is not None and (not holder.open or self.admits(holder.held, 0)):
            self.overdraft = None

    def left(self) -> None:
        """An account has closed."""
        self.accounts -= 1
        # One share fewer to divide: the others' grow, the overdraft's
        # holder's among them, which may need it no more.
        self.settle()
        if self._freed:
            self._freed.unpark_all()

    async def wait_freed(self) -> None:
        """Until some account holds less, or closes."""
        await self._freed.park()


class Account:
    """What one connection holds, charged to its server's :class:`HeldBudget`."""

    def __init__(self, budget: HeldBudget) -> None:
        self._budget = budget
        self.held = 0
        self.open = True

    def charge(self, n: int) -> None:
        """Hold ``n`` bytes more (fewer when negative), whatever the total (the
        caller waited with :meth:`wait_room` first, or the bytes could not wait)."""
        if self.open:
            self.held += n
            self._budget.add(n)

    def discharge(self, n: int) -> None:
        if self.open:
            self.held -= n
            self._budget.add(-n)

    def fits(self, size: int) -> bool:
        return self._budget.overdraft is self or self._budget.admits(self.held, size)

    def share(self) -> int:
        """What one connection may hold past the common half, now."""
        return self._budget.share()

    async def wait_room(self, size: int) -> None:
        """Until ``size`` bytes more fit (:func:`admits`), or this account has
        the overdraft; woken by any release."""
        while not self.fits(size):
            if self._budget.overdraft is None:
                self._budget.overdraft = self
                return
            await self._budget.wait_freed()

    def close(self) -> None:
        """The connection has ended: nothing it held counts any more."""
        if self.open:
            self._budget.add(-self.held)
            self.held = 0
            self.open = False
            self._budget.left()
