"""Another host may have committed: a wake for watchers of a PostgreSQL log.

:class:`PgChanges` is :class:`~streamd.eventlog.sqlite.changes.FileChanges` for a log
in PostgreSQL, with the same shape (``async with``, then ``await wait()`` in a
loop, confirming each wake) and the same promise: **missed wakes are not
allowed, spurious ones are.**

* **LISTEN, one notification per batch.** Every append transaction sends one
  ``pg_notify`` on its schema's channel
  (:func:`~streamd.eventlog.postgres.schema.notify_channel` of
  ``options.schema``, so logs in two schemas of a database do not wake each
  other; payload: its newest seq), which the server delivers to every listener when,
  and only if, the transaction commits. A listener holds one connection that
  does nothing but ``LISTEN``; Trio waits on its socket directly (no thread
  while idle), and one ``wait()`` drains every notification queued into one
  return. Notifications are queued by the server from the moment ``LISTEN``
  committed, whether or not anyone waits: entered before the log's first
  confirmation read, nothing committed after that read goes unseen.
* **A dropped connection is a wake.** Notifications sent while the listener
  was away are lost, so the first ``wait()`` after a drop returns at once, and
  then, while reconnecting with backoff (``fallback_interval`` doubling to
  ``reconnect_max``), every ``fallback_interval`` it polls ``poll()`` (the
  log's newest seq, read on its own connection) and returns when that moved;
  the first poll after it stopped listening (or after it could not listen at
  entry) returns whatever it reads, since a commit may have come between the
  caller's last confirmation read and that poll.
  Reconnected, it listens again and returns once more (what committed between
  the last poll and the new ``LISTEN`` is covered by the caller's
  confirmation read).
* **Its attempts show.** Each attempt to listen is kept (:attr:`PgChanges.attempts`)
  for ``streamd status``, as the log's own connections' are: a watcher that
  cannot listen hears other hosts' appends only by polling, a degraded service
  an operator must see, and an outage that only this connection sees (its
  connection ended while the log's others still serve, or seen by it first,
  while the log is idle) showed nowhere before.
* **Neither entry nor a close waits for a connect.** A server that accepts
  and never answers (stopped, partitioned away) holds the listener's connect
  for its whole connect timeout, for ever with none. Entry waits for the
  first attempt ``reconnect_max`` at most, then polls beside it as it does
  while away (the first poll is a wake, and so is the ``LISTEN`` when it
  comes); a cancel leaves the connect to its thread, which closes what it
  makes.
* **One reconnect at a time, whatever cuts a wait short.** An attempt to
  listen again runs in a task of its own, and ``wait()`` polls beside it: the
  log cuts every wait short after ``SAFETY_POLL`` (5 s), and a cut that came
  while the attempt was connecting to a server that never answers left that
  connect to its thread while the next wait started another, one thread more
  each cut, until the process's bound of connects left running (16) was all
  this watch's and every open of every log in the process was refused.
* **A dead peer is noticed.** Over TCP, keepalives (set by
  :func:`~streamd.eventlog.postgres.store.connect` unless the conninfo sets
  its own) turn a silently vanished server into a socket error within about
  half a minute; over a Unix socket a dead server is an EOF at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Literal

import psycopg
import trio

from streamd.eventlog.handoff import made_on_thread
from streamd.eventlog.postgres.schema import notify_channel
from streamd.eventlog.postgres.store import (
    PostgresOptions,
    connect,
    scrub,
    target_of,
)
from streamd.eventlog.store.reconnecting import Backoff

__all__ = ["PgChanges"]

logger = logging.getLogger(__name__)

Mode = Literal["listen", "poll"]

class PgChanges:
    """Wakes when another connection (any host) may have committed events."""

    def __init__(
        self,
        conninfo: str,
        *,
        fallback_interval: float,
        poll: Callable[[], Awaitable[int]] | None = None,
        options: PostgresOptions | None = None,
        reconnect_max: float = 5.0,
        channel: str | None = None,
    ) -> None:
        if not fallback_interval > 0:
            raise ValueError("fallback_interval must be positive")
        self._conninfo = conninfo
        self._opts = options or PostgresOptions()
        self._interval = fallback_interval
        self._poll = poll
        self._reconnect_max = max(reconnect_max, fallback_interval)
        self._channel = notify_channel(self._opts.schema) if channel is None else channel
        target = target_of(conninfo)
        self._where = f"PostgreSQL database {target.description}"
        self._secrets = list(target.secrets)  # password, sslpassword and the like
        self._conn: psycopg.Connection[Any] | None = None
        self._state: Literal["new", "open", "closed"] = "new"
        self._pending = False  # a wake owed (a notification seen, or a drop)
        self._polled: int | None = None  # None: the next poll counts as moved
        self._backoff = fallback_interval
        self._next_listen: float | None = None  # when to try LISTEN again, while away
        self._reconnecting: trio.Event | None = None  # set when the attempt under way ends
        self._tasks = AsyncExitStack()  # holds the nursery the attempts run in
        self._nursery: trio.Nursery | None = None
        # Its own timing is _backoff's: this one only keeps what status shows.
        self._attempts = Backoff(fallback_interval, self._reconnect_max, clock=trio.current_time)
        self.newest_notified = 0
        """The highest seq any notification carried (0 before the first)."""
        self.reason = ""
        """Why it polls ("" while listening), for diagnostics."""

    @property
    def mode(self) -> Mode:
        return "listen" if self._conn is not None else "poll"

    @property
    def attempts(self) -> Backoff:
        """Its attempts to listen: the one under way, the run since it last
        listened, and the newest failure (for
        :func:`~streamd.eventlog.store.reconnecting.reconnecting_s`). Read,
        never changed, by others."""
        return self._attempts

    @property
    def backend_pid(self) -> int | None:
        """The server process of the listening connection (None while polling),
        for diagnostics: ``pg_stat_activity`` shows it."""
        return self._conn.info.backend_pid if self._conn is not None else None

    async def __aenter__(self) -> PgChanges:
        if self._state != "new":
            raise RuntimeError("PgChanges can be entered once")
        await trio.lowlevel.checkpoint()
        self._state = "open"
        try:
            self._nursery = await self._tasks.enter_async_context(trio.open_nursery())
            # The first attempt too runs as a task: a server that never
            # answers held the entry for the whole connect timeout (for ever
            # with none), and the log's watches with it, polling nothing.
            first = self._reconnecting = trio.Event()
            self._nursery.start_soon(self._reconnect, first)
            with trio.move_on_after(self._reconnect_max):
                await first.wait()
        except BaseException:
            await self._end()
            raise
        if first.is_set():
            # Listening (or not) before the caller's first read: no gap to cover.
            self._pending = False
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._end()

    async def _end(self) -> None:
        self._state = "closed"
        self._attempts.stop()
        self._close()
        if self._nursery is not None:
            # Its own cancel: an attempt under way leaves its connect to the
            # thread (see made_on_thread), and nothing reaches the caller.
            self._nursery.cancel_scope.cancel()
        await self._tasks.aclose()

    def expect_commit(self) -> None:
        """Nothing to do: a NOTIFY is delivered at its transaction's commit, so
        a commit under way at LISTEN time still notifies."""

    async def wait(self) -> None:
        """Return when a commit may have happened since the previous wait()
        returned (or since entry, for the first call)."""
        if self._state != "open":
            raise trio.ClosedResourceError("PgChanges is not entered")
        while True:
            if self._pending:
                self._pending = False
                return
            conn = self._conn
            if conn is None:
                await self._while_away()
                continue
            try:
                if self._drain(conn):
                    return
                await trio.lowlevel.wait_readable(conn.pgconn.socket)
            except (psycopg.Error, OSError) as exc:
                self._lost(exc)
            except trio.ClosedResourceError:
                if self._state != "open":
                    raise
                # Our own connection was closed under the wait (a drop seen by
                # another path): a wake is owed and _lost has been called.

    def _drain(self, conn: psycopg.Connection[Any]) -> bool:
        """Read whatever arrived; whether any notification was among it."""
        pgconn = conn.pgconn
        pgconn.consume_input()
        got = False
        while (n := pgconn.notifies()) is not None:
            got = True
            self._note(n.extra.decode(errors="replace"))
        if pgconn.status != psycopg.pq.ConnStatus.OK:
            raise psycopg.OperationalError("the listening connection is closed")
        return got

    def _note(self, payload: str) -> None:
        try:
            self.newest_notified = max(self.newest_notified, int(payload))
        except ValueError:
            pass  # someone else's NOTIFY on our channel: still a wake

    def _on_notify(self, n: psycopg.Notify) -> None:
        # Notifications psycopg read itself (while LISTEN ran) reach us here.
        self._note(n.payload)
        self._pending = True

    async def _listen(self) -> None:
        """Connect and LISTEN; failing that, poll (and owe a wake)."""
        self._attempts.began()
        try:
            # A cancel (a close) leaves the connect to its thread: see the
            # module docstring.
            conn = await made_on_thread(self._connect_and_listen, _close, self._where)
        except Exception as exc:  # any failure to listen: poll, and keep trying
            self._poll_because(exc)
            self._attempts.failed(f"a watch cannot listen on the {self._where}: {self.reason}")
            return
        except BaseException:
            self._attempts.ended()
            raise
        if self._state != "open":
            conn.close()
            return
        self._attempts.succeeded()
        self._conn = conn
        self._polled = None  # when it next polls, the first poll is a wake
        if self.reason:
            logger.info("event log watch: listening again on the %s", self._where)
        self.reason = ""
        self._backoff = self._interval

    def _connect_and_listen(self) -> psycopg.Connection[Any]:
        conn = connect(self._conninfo, self._opts)  # with TCP keepalives
        try:
            conn.add_notify_handler(self._on_notify)
            conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self._channel)))
        except BaseException:
            conn.close()
            raise
        return conn

    def _lost(self, exc: BaseException) -> None:
        self._close()
        self._poll_because(exc)
        self._pending = True  # notifications sent while away are gone

    def _poll_because(self, exc: BaseException) -> None:
        self.reason = scrub(str(exc).strip() or type(exc).__name__, self._secrets)
        logger.warning(
            "event log watch: not listening on the %s (%s); polling every %g s while"
            " reconnecting", self._where, self.reason, self._interval,
        )

    async def _while_away(self) -> None:
        """One step without a connection: start an attempt to listen again
        when the backoff allows, wait one poll interval (or until the
        attempt ends), and poll. The time of the next try is kept on the
        instance, and the attempt runs in a task of its own: a wait() that
        returns for a poll's wake, or is cancelled by its caller's timeout,
        must neither push the next try back (a watcher under steady foreign
        commits, or a caller that checks every few seconds, would never
        listen again) nor abandon the try under way and start another (see
        the module docstring)."""
        now = trio.current_time()
        if self._reconnecting is None:
            if self._next_listen is None:
                self._next_listen = now + self._backoff
            if now >= self._next_listen:
                self._next_listen = None
                self._backoff = min(self._backoff * 2, self._reconnect_max)
                self._reconnecting = trio.Event()
                assert self._nursery is not None
                self._nursery.start_soon(self._reconnect, self._reconnecting)
        if (attempt := self._reconnecting) is not None:
            with trio.move_on_after(self._interval):
                await attempt.wait()
        else:
            assert self._next_listen is not None
            await trio.sleep(min(self._interval, self._next_listen - now))
        if self._conn is None and self._poll is not None and await self._poll_moved():
            self._pending = True

    async def _reconnect(self, done: trio.Event) -> None:
        """One attempt to listen again, in the nursery's task."""
        try:
            await self._listen()
            if self._conn is not None:
                self._pending = True  # the gap between the last poll and LISTEN
        finally:
            self._reconnecting = None
            done.set()

    async def _poll_moved(self) -> bool:
        assert self._poll is not None
        try:
            value = await self._poll()
        except Exception as exc:  # the database is away too: keep waiting
            logger.debug("event log watch: poll failed: %s", scrub(str(exc), self._secrets))
            return False
        # The first poll since it stopped listening has nothing to compare
        # with, and a commit may have landed between the caller's last
        # confirmation read and it: a wake (spurious ones are allowed).
        moved = self._polled is None or value != self._polled
        self._polled = value
        return moved

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                trio.lowlevel.notify_closing(conn.pgconn.socket)
            except (psycopg.Error, OSError):
                pass  # already dead: nobody can be waiting on it
            conn.close()


def _close(conn: psycopg.Connection[Any]) -> None:
    conn.close()
