"""The event log's JSON-RPC methods: thin handlers over :class:`EventLog`.

Each handler decodes and validates nothing (the RPC layer has already decoded
its Struct with unknown fields forbidden, and hands it as it is to the log's
:attr:`~streamd.eventlog.log.EventLog.requests`) and builds no error frames (it
raises ``RpcError``).
What this module adds is per-connection behaviour:

* ``eventlog/append`` and ``eventlog/append_batch`` are *queued* methods
  (:class:`~streamd.rpc.Method` ``submit``): the RPC reader hands the decoded
  params to :meth:`EventLog.submit_append` with a callback and reads on; the
  reply is encoded when the writer's commit resolves the append. Once queued,
  an append is committed whatever its connection does, so a cancel of one is
  answered with its real outcome, and a connection that closes with appends
  queued still has them committed (their replies are dropped). The awaited
  handlers stay, with the same answers, for callers of the method table.

* ``eventlog/watch`` is a long-running request. Entries go out as
  ``eventlog/entry`` notifications ``{watch: <request id>, entry}``, in seq order.
  The request ends only when cancelled (the RPC layer answers -32007) or when the
  connection closes for shutdown or reaches end of input (its peer half-closed),
  which answers ``{last_seq}``: the seq of the last entry actually handed to the
  connection, so a client can resume exactly.
* End of input finishes what was asked: every method here is ``at_eof="finish"``
  (:class:`~streamd.rpc.Method`), so a request already read is answered as
  usual within the server's grace (``EOF_GRACE``), where a Recall request is
  cancelled at once.
* A watch is bounded in bytes, whatever its client does: it reads ahead an
  eighth of the log's ``watch_buffer_bytes`` (default 4 MiB,
  ``--watch-buffer-bytes``) and queues a notification only while the
  connection holds less than the rest unwritten (one notification larger than
  that still goes out alone). A client that stops reading therefore costs at
  most the budget, and when it leaves no room for the log's stall timeout the
  watch ends with ``budget_exceeded``, whose message and data name the seq to
  resume from: the last notification queued, which the client receives before
  the error; nothing follows the error. Other requests and other clients are
  served meanwhile. All the log's watches share a budget too
  (:mod:`~streamd.eventlog.watch_budget`): past it the watch holding the most
  ends at once the same way, even while its send waits for a client that does
  not read. A connection may have at most :data:`MAX_WATCHES_PER_CONNECTION`
  watches open; one more is refused ``budget_exceeded`` (``data.reason``
  ``too_many_watches``).
* ``since`` pages and ``sessions.get`` answers stop at the reply budget
  (:data:`~streamd.eventlog.model.REPLY_BUDGET_BYTES`, half the frame limit),
  so every reply is a frame the client can read, and say how to continue.
* Leases belong to the connection that took them: their heartbeats run in the
  log's nursery until released, a stolen lease is reported on that connection as
  ``eventlog/lock_lost {lock, holder}``, and whatever a connection still holds is
  released (its heartbeat stopped) when it closes, all together
  (:meth:`EventLog.release_leases`; within the close's grace once a stop is
  coming, so a database that does not answer cannot hold up a stop). A connection holds at most
  :data:`~streamd.eventlog.lease_budget.MAX_LEASES_PER_CONNECTION` leases,
  counting its acquires in flight; one more is refused ``budget_exceeded``
  (``data.reason`` ``too_many_leases``).

The database is opened by the first ``eventlog/*`` call (the EventLog is lazy,
and the daemon creates it on first use), so a Recall core that never calls one
never creates a file.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence

import msgspec
import trio

from streamd.errors import BUDGET_EXCEEDED, TOO_MANY_WATCHES, RpcError
from streamd.eventlog.lease import Lease
from streamd.eventlog.lease_budget import MAX_LEASES_PER_CONNECTION, too_many_leases
from streamd.eventlog.log import AppendOutcome, EventLog
from streamd.eventlog.model import (
    REPLY_BUDGET_BYTES,
    AppendBatchParams,
    AppendBatchResult,
    AppendParams,
    AppendResult,
    BootRecentParams,
    BootRecentResult,
    BootRecordParams,
    BootRecordResult,
    BootUpdateParams,
    BranchesParams,
    BranchesResult,
    CompactParams,
    CompactResult,
    Empty,
    LatestSeqParams,
    LatestSeqResult,
    LeaseAcquireParams,
    LeaseAcquireResult,
    LeaseLostNotification,
    LeaseReleaseParams,
    PingParams,
    RetentionGetParams,
    RetentionPolicy,
    RetentionResult,
    Session,
    SessionCreateParams,
    SessionDeleteParams,
    SessionGetParams,
    SessionListParams,
    SessionListResult,
    SessionsGetParams,
    SessionsResult,
    SessionWithEvents,
    SinceParams,
    SinceResult,
    StateGetParams,
    StateSnapshot,
    WatchParams,
    WatchResult,
    with_event_time,
)
from streamd.eventlog.store import Committed, ReadShape
from streamd.eventlog.watch import Watch
from streamd.eventlog.watch_hub import LOG_WENT_BACK
from streamd.rpc import Connection, Method, Request, encode_notification
from streamd.rpc.methods import Reply
from streamd.rpc.protocol import RequestId

__all__ = [
    "ENTRY_NOTIFICATION",
    "LEASE_LOST_NOTIFICATION",
    "MAX_WATCHES_PER_CONNECTION",
    "METHOD_NAMES",
    "eventlog_methods",
]

# Entries already encoded (the layer only copies them) and cut at the reply
# budget, so every reply is a frame the client can read.
_REPLY = ReadShape("encoded", REPLY_BUDGET_BYTES)

logger = logging.getLogger(__name__)

ENTRY_NOTIFICATION = "eventlog/entry"
LEASE_LOST_NOTIFICATION = "eventlog/lock_lost"

MAX_WATCHES_PER_CONNECTION = 64
"""Each watch costs some 18 KiB however little it holds (its tasks, scopes and
buffers; measured with 1,024 idle ones): without a bound, the 256 requests a
connection may have in flight, all watches, on each of 512 connections, were
2.3 GB. A client following many sessions needs one watch with a filter."""

LogFactory = Callable[[], EventLog | Awaitable[EventLog]]

class _Service:
    def __init__(self, get_log: LogFactory) -> None:
        self._get_log = get_log
        # The log the factory last gave, while it stays open: what lets an
        # append be queued from the RPC reader without awaiting the factory.
        self._known: EventLog | None = None
        # Leases each connection holds, by lease id (``lock`` on the wire): released when it closes.
        self._held: weakref.WeakKeyDictionary[Connection, dict[str, Lease]] = (
            weakref.WeakKeyDictionary()
        )
        # Acquires each connection has in flight: with what it holds, within
        # MAX_LEASES_PER_CONNECTION.
        self._acquiring: weakref.WeakKeyDictionary[Connection, int] = weakref.WeakKeyDictionary()
        # Watches each connection has open (MAX_WATCHES_PER_CONNECTION).
        self._watching: weakref.WeakKeyDictionary[Connection, int] = weakref.WeakKeyDictionary()

    async def log(self) -> EventLog:
        got = self._get_log()
        log = await got if inspect.isawaitable(got) else got
        self._known = log
        return log

    # -- appends and reads --

    async def append(self, p: AppendParams, request: Request) -> AppendResult:
        return await (await self.log()).requests.append(p)

    async def append_batch(self, p: AppendBatchParams, request: Request) -> AppendBatchResult:
        return AppendBatchResult(results=await (await self.log()).requests.append_batch(p))

    # The queued forms the RPC layer uses (Method.submit): same answers as the
    # two above, without a task per append. Once queued, an append is committed
    # whatever its connection does, so there is nothing to cancel.

    def submit_append(self, p: AppendParams, reply: Reply) -> Awaitable[None] | None:
        log = self._known
        if log is None or log.closed:
            # First use (the factory may open the log) or a closed log (the
            # factory says what it says then): ask it, in a task.
            return self._submit_later(p, reply)
        log.submit_append(p, reply)
        return None

    def submit_append_batch(self, p: AppendBatchParams, reply: Reply) -> Awaitable[None] | None:
        def batch_reply(outcome: AppendOutcome) -> None:
            if isinstance(outcome, list):  # a batch is answered with one result per event
                reply(AppendBatchResult(results=outcome))
            else:
                assert isinstance(outcome, RpcError), outcome
                reply(outcome)

        log = self._known
        if log is None or log.closed:
            return self._submit_later(p, batch_reply)
        log.submit_append(p, batch_reply)
        return None

    async def _submit_later(
        self, p: AppendParams | AppendBatchParams, on_done: Callable[[AppendOutcome], None]
    ) -> None:
        (await self.log()).submit_append(p, on_done)

    async def since(self, p: SinceParams, request: Request) -> SinceResult:
        return await (await self.log()).requests.since(p, _REPLY)

    async def latest_seq(self, p: LatestSeqParams, request: Request) -> LatestSeqResult:
        return LatestSeqResult(seq=await (await self.log()).requests.latest_seq(p))

    async def branches(self, p: BranchesParams, request: Request) -> BranchesResult:
        return BranchesResult(branches=await (await self.log()).requests.branches(p))

    async def watch(self, p: WatchParams, request: Request) -> WatchResult:
        conn = request.connection
        watching = self._watching.get(conn, 0)
        if watching >= MAX_WATCHES_PER_CONNECTION:
            raise _too_many_watches(p.from_seq)
        self._watching[conn] = watching + 1
        try:
            return await self._watch(p, request)
        finally:
            self._watching[conn] -= 1

    async def _watch(self, p: WatchParams, request: Request) -> WatchResult:
        log = await self.log()
        conn = request.connection
        budget = log.watch_buffer_bytes
        read_ahead = max(budget // 8, 1)
        sender = _WatchSender(conn, _EntryFrames(request.id), budget, read_ahead,
                              log.watch_stall_timeout, p.from_seq)
        failure: RpcError | None = None
        async with log.requests.watch(p, read_ahead) as watch:
            sender.follow(watch)
            with trio.CancelScope() as until_closing:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_when_set, conn.closing, until_closing)
                    # Given way to the log's shared budget: a send waiting
                    # for a client that does not read ends too.
                    nursery.start_soon(_cancel_when_set, watch.gave_way, until_closing)
                    try:
                        while True:
                            try:
                                # Given on only once sent: a watch that ends
                                # mid-batch names an earlier seq to resume
                                # from, and retention must keep what follows it.
                                batch, nbytes = await watch.receive_batch(given_later=True)
                            except StopAsyncIteration:
                                break
                            await sender.send(batch, nbytes)
                    except RpcError as exc:
                        # Raised outside the nursery, so it reaches the RPC layer
                        # as itself and not inside an exception group.
                        failure = exc
                    nursery.cancel_scope.cancel()
            if failure is None and watch.gave_way.is_set():
                failure = watch.error
        if failure is not None:
            raise _resumable(failure, sender.last_sent)
        return WatchResult(last_seq=sender.last_sent)

    # -- sessions --

    # A session's last_event_time goes out only to a caller that asked for it
    # (event_time: true): the answers every other caller gets keep their keys.

    async def sessions_create(self, p: SessionCreateParams, request: Request) -> Session:
        return with_event_time(await (await self.log()).requests.create_session(p), False)

    async def sessions_get(self, p: SessionGetParams, request: Request) -> SessionWithEvents:
        got = await (await self.log()).requests.get_session(p, _REPLY)
        return with_event_time(got, p.event_time)

    async def sessions_get_many(self, p: SessionsGetParams, request: Request) -> SessionsResult:
        got = await (await self.log()).requests.get_sessions(p, _REPLY)
        if not p.event_time:
            got.sessions = [with_event_time(s, False) for s in got.sessions]
        return got

    async def sessions_list(self, p: SessionListParams, request: Request) -> SessionListResult:
        got = await (await self.log()).requests.list_sessions_page(p)
        if not p.event_time:
            got.sessions = [with_event_time(s, False) for s in got.sessions]
        return got

    async def sessions_delete(self, p: SessionDeleteParams, request: Request) -> Empty:
        await (await self.log()).requests.delete_session(p)
        return Empty()

    # -- state --

    async def state_get(self, p: StateGetParams, request: Request) -> StateSnapshot:
        return await (await self.log()).requests.get_state(p)

    # -- retention --

    async def retention_set(self, p: RetentionPolicy, request: Request) -> Empty:
        await (await self.log()).requests.set_retention(p)
        return Empty()

    async def retention_get(self, p: RetentionGetParams, request: Request) -> RetentionResult:
        return RetentionResult(policies=await (await self.log()).requests.retention(p))

    async def compact(self, p: CompactParams, request: Request) -> CompactResult:
        return await (await self.log()).requests.compact(p)

    # -- leases --

    async def lease_acquire(self, p: LeaseAcquireParams, request: Request) -> LeaseAcquireResult:
        log = await self.log()
        conn = request.connection

        async def on_lost(lease: Lease) -> None:
            self._held.get(conn, {}).pop(lease.lock, None)
            await conn.notify(
                LEASE_LOST_NOTIFICATION, LeaseLostNotification(lock=lease.lock, holder=lease.holder)
            )

        acquiring = self._acquiring.get(conn, 0)
        if len(self._held.get(conn, ())) + acquiring >= MAX_LEASES_PER_CONNECTION:
            raise too_many_leases(MAX_LEASES_PER_CONNECTION, "connection")
        self._acquiring[conn] = acquiring + 1
        try:
            lease = await log.requests.acquire_lock(p, on_lost=on_lost)
        finally:
            self._acquiring[conn] -= 1
        held = self._held.get(conn)
        if held is None:
            held = self._held[conn] = {}
            conn.on_close(lambda: self._release_all(conn, log))
        held[lease.lock] = lease
        return LeaseAcquireResult(lock=lease.lock, holder=lease.holder)

    async def lease_release(self, p: LeaseReleaseParams, request: Request) -> Empty:
        log = await self.log()
        holder = next((conn for conn, held in self._held.items() if p.lock in held), None)
        lease = self._held[holder].pop(p.lock) if holder is not None else None
        await log.release_lock(p.lock)
        if holder is not None and holder is not request.connection and lease is not None:
            # Released by another client: its holder must not go on working
            # as if it held the session (another client may take it next).
            # Queued without waiting for room: the releasing client must not
            # wait for the holder (stuck, say) to read its backlog.
            holder.send_nowait(encode_notification(
                LEASE_LOST_NOTIFICATION, LeaseLostNotification(lock=lease.lock, holder=lease.holder)
            ))
        return Empty()

    async def _release_all(self, conn: Connection, log: EventLog) -> None:
        # Together, not one write each: see EventLog.release_leases.
        await log.release_leases(list(self._held.pop(conn, {}).values()))

    # -- boots and health --

    async def boot_record(self, p: BootRecordParams, request: Request) -> BootRecordResult:
        return BootRecordResult(id=await (await self.log()).requests.record_boot(p))

    async def boot_update(self, p: BootUpdateParams, request: Request) -> Empty:
        await (await self.log()).requests.update_boot(p)
        return Empty()

    async def boot_recent(self, p: BootRecentParams, request: Request) -> BootRecentResult:
        return await (await self.log()).requests.recent_boots_page(p)

    async def ping(self, p: PingParams, request: Request) -> Empty:
        await (await self.log()).ping()
        return Empty()


class _WatchSender:
    """A JSON-RPC watch's way out: each batch the watch hands over goes to the
    connection as one send, within the watch's byte budget (what the
    connection holds unwritten counts against it, so the watch never adds to a
    backlog past its budget); a consumer that leaves no room for the stall
    timeout ends the watch with ``budget_exceeded``."""

    def __init__(
        self, conn: Connection, frames: _EntryFrames, budget: int, read_ahead: int,
        timeout: float, from_seq: int,
    ) -> None:
        self._conn = conn
        self._frames = frames
        self._budget = budget
        self._queued_budget = max(budget - read_ahead, 1)
        self._timeout = timeout
        self.last_sent = from_seq
        """The seq of the last entry given to the connection."""
        self._given: Callable[[int], None] = lambda seq: None

    def follow(self, watch: Watch) -> None:
        """Send what ``watch`` hands over, and tell it what was sent as soon
        as it is (a watch that gives way mid-batch names that seq)."""
        watch.sink(self.offer)
        self._given = watch.given

    def offer(self, batch: Sequence[Committed], nbytes: int) -> bool:
        """Queue the whole batch at once if it is within the budget: the usual
        case, with no wait to bound. Every watch pays this for every commit it
        follows, so it is also the watch's sink (:meth:`Watch.sink`)."""
        conn = self._conn
        if self._frames.size(batch, nbytes) > self._queued_budget - conn.unwritten_bytes:
            return False
        conn.send_nowait(self._frames.encode(batch))
        self.last_sent = batch[-1].seq
        self._given(self.last_sent)
        return True

    async def send(self, batch: list[Committed], nbytes: int) -> None:
        if self.offer(batch, nbytes):
            return  # the watch's next receive is the checkpoint
        conn, frames = self._conn, self._frames
        start = 0
        while start < len(batch):
            with trio.move_on_after(self._timeout) as stalled:
                while True:
                    end = frames.fit(batch, start, self._queued_budget - conn.unwritten_bytes)
                    if end > start or not conn.unwritten_bytes:
                        break
                    await conn.progress()
                # An entry larger than the budget still goes out alone, once
                # the connection is drained.
                end = max(end, start + 1)
                await conn.send(frames.encode(batch[start:end]))
            if stalled.cancelled_caught:
                raise _client_stalled(
                    self.last_sent, conn.unwritten_bytes, self._budget, self._timeout
                )
            self.last_sent = batch[end - 1].seq
            self._given(self.last_sent)
            start = end


class _EntryFrames:
    """``eventlog/entry`` notifications for one watch, spliced around entries
    that are already encoded: the same bytes as
    ``encode_notification(ENTRY_NOTIFICATION, EntryNotification(watch=id, entry=e))``
    for a fraction of the cost, since only the entry differs."""

    def __init__(self, watch_id: RequestId | None) -> None:
        head, tail = encode_notification(
            ENTRY_NOTIFICATION, _SplicedEntryNotification(watch=watch_id, entry=_SPLICE)
        ).rsplit(_SPLICE_BYTES, 1)
        self._head, self._tail, self._between = head, tail, tail + head
        self._overhead = len(head) + len(tail)

    def size(self, batch: Sequence[Committed], nbytes: int) -> int:
        """The bytes of the whole batch's frames, given its entries' ``nbytes``."""
        return nbytes + len(batch) * self._overhead

    def fit(self, batch: list[Committed], start: int, room: int) -> int:
        """The end of the run of entries from ``start`` whose frames fit in ``room``."""
        end = start
        while end < len(batch):
            room -= len(batch[end].wire) + self._overhead
            if room < 0:
                break
            end += 1
        return end

    def encode(self, entries: Sequence[Committed]) -> bytes:
        # One join in C over the entries, each frame's tail and the next one's
        # head being one separator: no Python step per part, and the batch
        # (some 50 KB for a commit of 100) copied once.
        parts = [c.wire for c in entries]
        parts[0] = self._head + parts[0]
        parts[-1] = parts[-1] + self._tail
        return self._between.join(parts)


# A placeholder entry that cannot occur in an id or a method name.
_SPLICE_BYTES = rb'"\u0000splice\u0000"'
_SPLICE = msgspec.Raw(_SPLICE_BYTES)


class _SplicedEntryNotification(msgspec.Struct):
    """:class:`EntryNotification`'s shape, its entry already encoded."""

    watch: RequestId | None  # the watch request's own id, as it came
    entry: msgspec.Raw


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _resumable(exc: RpcError, last_seq: int) -> RpcError:
    """A watch's failure saying where to resume (a server that went away
    under a watch, say): the seq of the last entry it sent, as a watch's end
    says it. One that says it already is left as it is."""
    data = exc.data if isinstance(exc.data, dict) else {}
    if "last_seq" in data:
        return exc
    if data.get("reason") == LOG_WENT_BACK:
        # Where it got to, but no place to resume: the log holds other
        # events there now (the message says to read it again).
        return RpcError(exc.code, exc.message, {**data, "last_seq": last_seq})
    return RpcError(
        exc.code,
        f"{exc.message}; the watch has ended, resume with from_seq={last_seq}",
        {**data, "last_seq": last_seq} if exc.data is None or isinstance(exc.data, dict)
        else exc.data,
    )


def _too_many_watches(from_seq: int) -> RpcError:
    return RpcError(
        BUDGET_EXCEEDED,
        f"this connection has {MAX_WATCHES_PER_CONNECTION} watches open, the most one"
        " connection may have: end one first, or follow several sessions with one watch"
        f" (a filter on app, user, session_tree or branch_prefixes); resume with"
        f" from_seq={from_seq}",
        {"reason": TOO_MANY_WATCHES, "limit": MAX_WATCHES_PER_CONNECTION, "last_seq": from_seq},
    )


def _client_stalled(last_seq: int, unwritten: int, budget: int, timeout: float) -> RpcError:
    return RpcError(
        BUDGET_EXCEEDED,
        f"watch client stopped reading: {unwritten} bytes unread on the connection, no room"
        f" in the watch's {budget} byte budget for {timeout:g} s; the watch has ended,"
        f" resume with from_seq={last_seq}",
        {"last_seq": last_seq, "unwritten_bytes": unwritten, "budget_bytes": budget},
    )


def eventlog_methods(get_log: LogFactory) -> list[Method]:
    """Every ``eventlog/*`` method of the contract, served by one shared log.

    ``get_log`` returns the :class:`EventLog` (directly or as an awaitable); it
    is called by each request, so a daemon can create the log on first use
    (see :meth:`streamd.daemon.Daemon.eventlog`). Build the methods once and
    give the same list to every connection: the service keeps the table of
    which connection holds which lease.
    """
    service = _Service(get_log)
    s = service
    methods = [
        Method("eventlog/append", AppendParams, s.append, submit=s.submit_append),
        Method(
            "eventlog/append_batch",
            AppendBatchParams,
            s.append_batch,
            submit=s.submit_append_batch,
        ),
        Method("eventlog/since", SinceParams, s.since),
        Method("eventlog/watch", WatchParams, s.watch),
        Method("eventlog/latest_seq", LatestSeqParams, s.latest_seq),
        Method("eventlog/branches", BranchesParams, s.branches),
        Method("eventlog/sessions.create", SessionCreateParams, s.sessions_create),
        Method("eventlog/sessions.get", SessionGetParams, s.sessions_get),
        Method("eventlog/sessions.get_many", SessionsGetParams, s.sessions_get_many),
        Method("eventlog/sessions.list", SessionListParams, s.sessions_list),
        Method("eventlog/sessions.delete", SessionDeleteParams, s.sessions_delete),
        Method("eventlog/state.get", StateGetParams, s.state_get),
        Method("eventlog/retention.set", RetentionPolicy, s.retention_set),
        Method("eventlog/retention.get", RetentionGetParams, s.retention_get),
        Method("eventlog/compact", CompactParams, s.compact),
        Method("eventlog/lock.acquire", LeaseAcquireParams, s.lease_acquire),
        Method("eventlog/lock.release", LeaseReleaseParams, s.lease_release),
        Method("eventlog/boot.record", BootRecordParams, s.boot_record),
        Method("eventlog/boot.update", BootUpdateParams, s.boot_update),
        Method("eventlog/boot.recent", BootRecentParams, s.boot_recent),
        Method("eventlog/ping", PingParams, s.ping),
    ]
    # End of input is "no more requests" for the event log: what was asked is
    # answered (within the server's grace), a watch ends with {last_seq}. The
    # reads that answer with pages are bulk (see Method.bulk).
    return [dataclasses.replace(m, at_eof="finish", bulk=m.name in _BULK) for m in methods]


# The reads whose answer can be a page of events or sessions, up to the reply budget.
_BULK = frozenset({
    "eventlog/since", "eventlog/sessions.get", "eventlog/sessions.get_many",
    "eventlog/sessions.list", "eventlog/state.get", "eventlog/boot.recent",
    "eventlog/branches",
})


def _no_log() -> EventLog:
    raise RuntimeError("a table built for its method names serves no request")


METHOD_NAMES = frozenset(m.name for m in eventlog_methods(_no_log))
