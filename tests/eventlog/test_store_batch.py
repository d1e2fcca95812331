"""The SQLite store's group commit skips a session's upsert after the first
append of the batch that made it (``sqlite.batch.append_one``): the batch must leave every
session exactly as appending one by one would, refused items included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from streamd.errors import EVENT_CONFLICT, RpcError
from streamd.eventlog.model import AppendParams, SessionGetParams, to_us
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore
from streamd.eventlog.store import AppendGroup

NOW = 1_750_000_000 * 1_000_000


def params(event_id: str, session: str, content: Any = None) -> AppendParams:
    return msgspec.json.decode(
        msgspec.json.encode(
            {
                "app": "app",
                "user": "u",
                "session": session,
                "event": {
                    "id": event_id,
                    "author": "agent",
                    "content": content or {"id": event_id},
                },
            }
        ),
        type=AppendParams,
    )


@pytest.fixture
def store(tmp_path: Path):
    store = SqliteStore.open(str(tmp_path / "events.db"), SqliteOptions(synchronous="NORMAL"))
    yield store
    store.close()


def test_a_batch_of_appends_to_few_sessions_leaves_them_as_single_appends_would(store) -> None:
    store.append_batch([params("old", "a")], NOW - 10)
    batch = [params(f"e{i}", "ab"[i % 2]) for i in range(10)]
    results = store.append_batch(batch, NOW)
    assert [r.seq for r in results] == list(range(2, 12))
    for name, last in (("a", 10), ("b", 11)):
        s = store.get_session(SessionGetParams(app="app", user="u", session=name))
        assert s.last_seq == last
        assert to_us(s.updated_at) == NOW
        assert s.events[-1].event.id == f"e{last - 2}"
    assert (
        to_us(store.get_session(SessionGetParams(app="app", user="u", session="a")).created_at)
        == NOW - 10
    )
    assert (
        to_us(store.get_session(SessionGetParams(app="app", user="u", session="b")).created_at)
        == NOW
    )


def test_a_session_made_by_a_refused_group_is_made_again_by_a_later_append(store) -> None:
    store.append_batch([params("x", "other", {"v": 1})], NOW - 10)
    group = AppendGroup([params("g1", "g"), params("x", "other", {"v": 2})])
    outcome = store.append_commit([group, params("g2", "g")], NOW, capture=False)
    refused, single = outcome.results
    assert isinstance(refused, RpcError) and refused.code == EVENT_CONFLICT
    s = store.get_session(SessionGetParams(app="app", user="u", session="g"))
    assert s.last_seq == single.seq
    assert [e.event.id for e in s.events] == ["g2"]
    assert to_us(s.created_at) == NOW


def test_a_refused_append_does_not_count_its_session_as_made(store) -> None:
    store.append_batch([params("x", "other", {"v": 1})], NOW - 10)
    # The conflict is refused before any write, in its own savepoint; the
    # append after it, to a session nobody wrote yet, must still create it.
    outcome = store.append_commit(
        [params("x", "h", {"v": 2}), params("h1", "h")], NOW, capture=False
    )
    refused, single = outcome.results
    assert isinstance(refused, RpcError) and refused.code == EVENT_CONFLICT
    assert (
        store.get_session(SessionGetParams(app="app", user="u", session="h")).last_seq == single.seq
    )


def test_a_batch_that_holds_a_refusal_commits_the_rest_as_one_without_would(store) -> None:
    # Run first without savepoints per append, the batch is run again with
    # them once something in it is refused: only the refused append is missing.
    store.append_batch([params("x", "s", {"v": 1})], NOW - 10)
    outcome = store.append_commit(
        [params("a", "s"), params("x", "s", {"v": 2}), params("b", "s")], NOW, capture=True
    )
    first, refused, last = outcome.results
    assert isinstance(refused, RpcError) and refused.code == EVENT_CONFLICT
    assert (first.seq, last.seq) == (2, 3)
    assert (outcome.before_seq, outcome.after_seq) == (1, 3)
    assert outcome.entries is not None and [e.seq for e in outcome.entries] == [2, 3]
    assert [
        e.event.id
        for e in store.get_session(SessionGetParams(app="app", user="u", session="s")).events
    ] == [
        "x",
        "a",
        "b",
    ]


def test_a_group_pipelined_behind_one_expected_seq_reads_the_session_once(store) -> None:
    from support.sqlite_cost import statements

    def group(tag: str, expected: int | None) -> AppendGroup:
        appends = [params(f"{tag}{i}", "s") for i in range(100)]
        appends[0] = msgspec.structs.replace(appends[0], expected_seq=expected)
        return AppendGroup(appends)

    store.append_batch([params("first", "s")], NOW)
    (free,), plain = statements(store, lambda: store.append_batch([group("p", None)], NOW))
    (checked,), pipelined = statements(
        store, lambda: store.append_batch([group("c", free[-1].seq)], NOW))
    assert not any(r.duplicate for r in checked) and checked[0].seq == free[-1].seq + 1
    # The first append's expectation is one read; its later appends follow
    # new events of the same transaction, where the session is for certain.
    assert pipelined == plain + 1
