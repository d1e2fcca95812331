"""How a client puts a session read in parts back together
(:class:`~streamd.client.calls.SessionAssembler`), sans I/O: the answers are
built here, as the daemon would send them."""

from __future__ import annotations

import datetime as dt

import pytest

from streamd import errors
from streamd.client import calls
from streamd.errors import RpcError
from streamd.eventlog.model import SessionWithEvents

BORN = dt.datetime(2026, 12, 7, 1, 0, tzinfo=dt.UTC)
AGAIN = BORN + dt.timedelta(microseconds=1)


def part(*, created: dt.datetime, last_seq: int, cut_at: int | None) -> SessionWithEvents:
    return SessionWithEvents(
        app="a", user="u", session="s", state={}, created_at=created, updated_at=created,
        last_seq=last_seq, events=[], truncated=cut_at is not None, next_seq=cut_at,
    )


def test_the_rest_of_one_session_is_asked_for_after_the_last_seq_returned() -> None:
    first = calls.get_session("a", "u", "s")
    whole = calls.SessionAssembler(first)
    rest = whole.feed(part(created=BORN, last_seq=10, cut_at=4))
    assert rest is not None and rest.params.after_seq == 4
    assert whole.feed(part(created=BORN, last_seq=12, cut_at=None)) is None
    assert whole.result.last_seq == 10  # the first answer's moment


@pytest.mark.parametrize(
    ("created", "last_seq"), [(AGAIN, 12), (BORN, 0)], ids=["created-again", "seq-went-back"])
def test_a_session_made_anew_between_parts_is_read_again_from_the_start(
    created: dt.datetime, last_seq: int
) -> None:
    first = calls.get_session("a", "u", "s", recent=50)
    whole = calls.SessionAssembler(first)
    assert whole.feed(part(created=BORN, last_seq=10, cut_at=4)) is not None
    again = whole.feed(part(created=created, last_seq=last_seq, cut_at=None))
    assert again is first  # the first call, its bounds and all
    assert whole.feed(part(created=created, last_seq=last_seq, cut_at=None)) is None
    assert whole.result.created_at == created and whole.result.last_seq == last_seq


def test_a_session_made_anew_at_every_part_ends_the_read_with_a_reason() -> None:
    whole = calls.SessionAssembler(calls.get_session("a", "u", "s"))
    born = BORN
    assert whole.feed(part(created=born, last_seq=10, cut_at=4)) is not None
    for _ in range(calls.SessionAssembler.RESTARTS):
        born += dt.timedelta(seconds=1)
        assert whole.feed(part(created=born, last_seq=10, cut_at=4)) is not None  # again
        assert whole.feed(part(created=born, last_seq=10, cut_at=4)) is not None  # its rest
    with pytest.raises(RpcError) as ended:
        whole.feed(part(created=born + dt.timedelta(seconds=1), last_seq=10, cut_at=4))
    assert ended.value.code == errors.SOURCE_UNAVAILABLE
    assert "created again 5 times while it was read in parts" in ended.value.message
