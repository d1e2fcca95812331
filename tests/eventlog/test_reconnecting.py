"""The kept connection of the server backends (``store.reconnecting``): its
check of a connection that sat idle. A dead one is replaced before the call;
a check cut short by a cancel's ``sever`` or by a close fails the call, as
the call itself would have failed, instead of connecting again (a cancelled
call then waited out a whole connect timeout, and a close with it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from streamd.errors import SOURCE_UNAVAILABLE, RpcError
from streamd.eventlog.store.reconnecting import (
    Backoff,
    Reconnecting,
    newest_outage,
    reconnecting_s,
)


class Gone(Exception):
    """The driver's error for a connection that no longer answers."""


class Cancelled(Exception):
    """The driver's error for a statement the server cancelled."""


class Server:
    def __init__(self) -> None:
        self.made: list[object] = []
        self.answers = True
        self.cancels = False  # the call's cancel reaches the check's statement
        self.during_check: Any = None  # what happens to the link while a check runs

    def connect(self) -> object:
        conn = object()
        self.made.append(conn)
        return conn

    def alive(self, conn: object) -> None:
        if self.during_check is not None:
            self.during_check()
        if self.cancels:
            raise Cancelled("canceling statement due to user request")
        if not self.answers:
            raise Gone("server closed the connection unexpectedly")


def link_to(server: Server) -> Reconnecting[object]:
    return Reconnecting(
        connect=server.connect, usable=lambda c: True, alive=server.alive,
        gone=lambda c, exc: isinstance(exc, Gone),
        fileno=lambda c: -1, close=lambda c: None,
        refused=lambda exc: RpcError(SOURCE_UNAVAILABLE, f"cannot connect: {exc}"),
        errors=(Gone, Cancelled), where="test server", data_key="test_error",
        min_s=0.05, max_s=0.1, idle_check_s=0.0,  # every call comes "after an idle second"
    )


def connecting_by(connect: Callable[[], object]) -> Reconnecting[object]:
    """A link that makes its connection with ``connect``, every attempt at
    once (no wait between them), its connections never checked."""
    return Reconnecting(
        connect=connect, usable=lambda c: True, alive=lambda c: None,
        gone=lambda c, exc: False, fileno=lambda c: -1, close=lambda c: None,
        refused=lambda exc: RpcError(SOURCE_UNAVAILABLE, f"cannot connect: {exc}"),
        errors=(Gone,), where="test server", data_key="test_error", min_s=0.0, max_s=0.0,
    )

def test_an_idle_connection_that_answers_is_kept() -> None:
    server = Server()
    link = link_to(server)
    first = link.get()
    assert link.get() is first and len(server.made) == 1


def test_an_idle_connection_that_no_longer_answers_is_replaced_before_the_call() -> None:
    server = Server()
    link = link_to(server)
    first = link.get()
    server.answers = False
    second = link.get()  # the check failed; the call goes on, on a new connection
    assert second is not first and len(server.made) == 2


def test_a_check_cut_by_sever_fails_the_call_and_connects_no_more() -> None:
    server = Server()
    link = link_to(server)
    link.get()
    server.answers = False
    server.during_check = link.sever  # a cancelled call's grace ran out meanwhile
    with pytest.raises(Gone):
        link.get()
    assert len(server.made) == 1
    assert link.cut()  # the store words it as the cut it is


def test_a_check_interrupted_by_a_close_fails_the_call_and_connects_no_more() -> None:
    server = Server()
    link = link_to(server)
    link.get()
    server.answers = False
    server.during_check = link.abort
    with pytest.raises(Gone):
        link.get()
    assert len(server.made) == 1 and link.closed


def test_a_check_cancelled_with_its_call_fails_the_call_on_the_connection_it_had() -> None:
    # The call's cancel reached the check's statement: the connection is
    # fine, and the cancelled call must not go on, on a new one.
    server = Server()
    link = link_to(server)
    first = link.get()
    server.cancels = True
    with pytest.raises(Cancelled):
        link.get()
    server.cancels = False
    assert link.get() is first and len(server.made) == 1


@pytest.mark.parametrize("cut", ["sever", "cut_if_connecting"])
def test_a_connect_cut_by_sever_closes_what_it_made_and_the_call_writes_nothing(cut: str) -> None:
    # A server that accepts and answers only when let: the call is inside the
    # driver's connect when its cancel's grace runs out.
    entered, let_go = threading.Event(), threading.Event()
    made: list[object] = []
    closed: list[object] = []

    def connect() -> object:
        entered.set()
        assert let_go.wait(10), "the test never let the connect end"
        conn = object()
        made.append(conn)
        return conn

    link = Reconnecting(
        connect=connect, usable=lambda c: True, alive=lambda c: None,
        gone=lambda c, exc: False, fileno=lambda c: -1, close=closed.append,
        refused=lambda exc: RpcError(SOURCE_UNAVAILABLE, f"cannot connect: {exc}"),
        errors=(Gone,), where="test server", data_key="test_error",
        min_s=0.05, max_s=0.1,
    )
    failure: list[BaseException] = []

    def call() -> None:
        try:
            link.get()
        except RpcError as exc:
            failure.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert entered.wait(10)
    if cut == "sever":
        link.sever()
    else:
        assert link.cut_if_connecting() is True
    let_go.set()
    caller.join(10)
    assert not caller.is_alive()
    (error,) = failure
    assert isinstance(error, RpcError) and error.data == {"test_error": "cut"}
    assert "wrote nothing" in error.message
    assert closed == made and len(made) == 1 and link.current is None
    # The cut is not an outage: the next call connects at once, and keeps it.
    entered.clear()
    second = link.get()
    assert second is made[1] and closed == made[:1] and link.get() is second


def test_a_cut_asked_for_with_no_call_connecting_cuts_nothing() -> None:
    # The runner asks "still connecting? then cut it" in one step: with no
    # connect under way (none yet, or one already adopted) the answer is
    # False and the connection is left alone, the call then cancelled on the
    # server like any other.
    server = Server()
    link = link_to(server)
    assert link.cut_if_connecting() is False  # no call at all
    conn = link.get()
    assert link.cut_if_connecting() is False and link.get() is conn
    assert not link.cut()  # the adopted connection was not cut either


def test_the_outage_is_the_newest_failure_unless_a_connection_was_made_since() -> None:
    writer, reader, opener = Backoff(0.25, 5.0), Backoff(0.25, 5.0), Backoff(0.25, 5.0)
    every = [writer, reader, opener]
    assert newest_outage(every) is None
    opener.succeeded()
    writer.failed("writer: cannot connect")
    assert newest_outage(every) == "writer: cannot connect"
    reader.failed("reader: cannot connect")
    assert newest_outage(every) == "reader: cannot connect"
    # The reader reached the server: the writer's failure is older news,
    # though the writer has not tried since.
    reader.succeeded()
    assert writer.error == "writer: cannot connect"
    assert newest_outage(every) is None
    writer.failed("writer: refused again")
    assert newest_outage(every) == "writer: refused again"


def test_an_outage_lasts_from_the_first_attempt_through_failures_until_a_connection_is_back(
        ) -> None:
    # What streamd status shows as db_reconnecting_s, and db_connecting_s.
    now = [0.0]
    writer, reader, opener = (Backoff(0.25, 5.0, clock=lambda: now[0]) for _ in range(3))
    opener.succeeded()  # the log's first connections
    assert reconnecting_s([writer, reader], [opener]) is None
    writer.began()  # the writer's connection broke; the server does not answer
    now[0] = 3.0
    assert writer.attempt_s() == 3.0 and reconnecting_s([writer, reader], [opener]) == 3.0
    writer.failed("cannot connect")
    now[0] = 10.0
    # No attempt under way between two, and the outage goes on through them.
    assert writer.attempt_s() is None and reconnecting_s([writer, reader], [opener]) == 10.0
    writer.began()
    writer.ended()  # interrupted: says nothing of the server
    assert writer.attempt_s() is None and reconnecting_s([writer, reader], [opener]) == 10.0
    reader.began()
    reader.succeeded()  # the server is back, though the writer has not tried since
    assert reconnecting_s([writer, reader], [opener]) is None
    assert writer.trying_s() == 10.0  # until it tries again, and fails or not


def test_a_reconnect_cut_once_the_server_answered_ends_the_outage() -> None:
    # A cancelled call's reconnect is cut while it connects: the connection
    # it makes is closed unused, and still says that the server is back.
    answers = False
    link: Reconnecting[object]

    def connect() -> object:
        if not answers:
            raise Gone("connection refused")
        assert link.cut_if_connecting()  # the call's cancel, meanwhile
        return object()

    link = connecting_by(connect)
    with pytest.raises(RpcError):
        link.get()
    assert reconnecting_s([link.attempts]) is not None
    answers = True
    with pytest.raises(RpcError) as cut:
        link.get()
    assert cut.value.data == {"test_error": "cut"}
    assert reconnecting_s([link.attempts]) is None and link.attempts.error is None


@pytest.mark.parametrize("end", ["close", "abort"])
def test_a_link_closed_while_it_reconnects_no_longer_counts_an_outage(end: str) -> None:
    # A store closed between two failed attempts (a log closed, a daemon
    # switching stores): before, its outage clock ran on, and status showed
    # a reconnect time growing for a connection nobody would make again.
    def refused() -> object:
        raise Gone("connection refused")

    link = connecting_by(refused)
    with pytest.raises(RpcError):
        link.get()
    assert link.attempts.trying_s() is not None
    getattr(link, end)()
    assert link.attempts.trying_s() is None and link.attempts.attempt_s() is None
    assert reconnecting_s([link.attempts]) is None


@pytest.mark.parametrize("outcome", ["fails", "connects"])
def test_a_link_closed_under_its_reconnect_no_longer_counts_an_outage_whatever_the_connect_does(
        outcome: str) -> None:
    # Closed while the driver connects: the connect may still fail after the
    # close (a server that refuses at last), which must not start the clock again.
    link: Reconnecting[object]

    def connect() -> object:
        link.abort()  # the log closes under the connect
        if outcome == "fails":
            raise Gone("connection refused")
        return object()

    link = connecting_by(connect)
    with pytest.raises(RpcError):
        link.get()
    assert link.attempts.trying_s() is None and reconnecting_s([link.attempts]) is None
