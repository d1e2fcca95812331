"""A watched commit's entries, encoded from the values the append prepared
(``rows.just_written``), are byte for byte what a read of the same rows gives
(``rows.committed``, which ``since`` with ``encoded=True`` returns): the
watchers fed from memory and those reading the store must get the same frames.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamd.eventlog.model import AppendParams
from streamd.eventlog.store import rows

NOW_US = 1_765_000_000_123_456


@pytest.fixture(autouse=True, params=["compiled", "plain"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a row is encoded: the compiled core's (where it is built) and
    the Python one (``STREAMD_NATIVE=0``)."""
    if request.param == "plain":
        monkeypatch.setenv("STREAMD_NATIVE", "0")
    return str(request.param)

# JSON values the wire can carry back unchanged (msgspec's floats, any text).
_text = st.text(max_size=12)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_scope = st.none() | st.dictionaries(_text, _json, max_size=3)


def written(p: AppendParams, seq: int) -> tuple[Any, ...]:
    """The row an append of ``p`` writes, as the store hands it to the capture."""
    item = rows.prepare(p, NOW_US)
    ev = p.event
    return (
        seq, p.app, p.user, p.session, ev.id, ev.invocation_id, ev.author, ev.branch,
        item.event_time, item.content, item.metadata, item.state_delta_text,
    )  # fmt: skip


def params(i: int, **extra: Any) -> AppendParams:
    event = {"id": f"e{i}", "author": "agent", "content": {"text": f"hello {i}"}}
    event.update(extra.pop("event", {}))
    return msgspec.convert(
        {"app": "a", "user": "u", "session": "s", "event": event, **extra}, AppendParams
    )


def same_as_read(rows_: list[tuple[Any, ...]]) -> None:
    fast = rows.just_written(rows_)
    assert fast == [rows.committed(row) for row in rows_]


def test_a_batch_whose_events_share_the_commits_time_or_carry_their_own() -> None:
    given_time = dt.datetime(2026, 12, 6, 8, 0, 1, 500, tzinfo=dt.UTC)
    batch = [
        params(1),
        params(2, metadata={"caller": "bench"}),
        params(3, event={"timestamp": given_time.isoformat()}),
        params(4, event={"branch": "root.plan", "invocation_id": "inv-1"}),
        params(5, metadata={}),
        params(6, state_delta={"session": {"k": [1, 2.5, None]}, "app": {}}),
        params(7, event={"timestamp": "1999-12-31T23:59:59Z"}),
        params(8),
    ]
    same_as_read([written(p, seq) for seq, p in enumerate(batch, 1)])


def test_a_row_whose_time_cannot_be_rendered_goes_the_general_way() -> None:
    row = list(written(params(1), 1))
    row[8] = 2**62  # past year 9999: read as null, flagged damaged
    same_as_read([tuple(row), written(params(2), 2)])
    assert b'"damaged":["event.timestamp"]' in rows.just_written([tuple(row)])[0].wire


@settings(max_examples=200, deadline=None)
@given(
    content=_json,
    metadata=st.none() | st.dictionaries(_text, _text, max_size=3),
    app=_scope,
    session=_scope,
    text=_text,
)
def test_any_content_metadata_and_state_delta_encode_as_a_read_would(
    content: Any, metadata: Any, app: Any, session: Any, text: str
) -> None:
    delta = {k: v for k, v in (("app", app), ("session", session)) if v is not None}
    p = params(
        1,
        event={"content": content, "author": text or "x", "branch": text},
        metadata=metadata,
        state_delta=delta or None,
    )
    same_as_read([written(p, 7)])
