"""``streamd.adk.StreamdSessionService`` states ADK's documented session-service
behaviour, test by test, against a real ``streamd`` spawned on stdio and again
on a log in the test's own process (``database=``).

The facts come from ADK's public source (google-adk 2.13): ``BaseSessionService``
and ``GetSessionConfig`` (their docstrings), ``State``'s prefixes, and what
``InMemorySessionService`` and ``DatabaseSessionService`` do. Where ADK's own
services agree, the last tests run one scenario against ADK's in-memory service
and ours and compare what comes out.

Each test is a plain function running its own ``asyncio.run`` (ADK is asyncio).
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.subprocess

adk = pytest.importorskip("google.adk")

import support.adk  # noqa: E402
from google.adk.errors import StaleSessionError  # noqa: E402
from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions, EventCompaction  # noqa: E402
from google.adk.sessions import InMemorySessionService, Session  # noqa: E402
from google.adk.sessions.base_session_service import (  # noqa: E402
    BaseSessionService,
    GetSessionConfig,
)
from google.genai import types  # noqa: E402
from support.adk import Service, event, run  # noqa: E402

from streamd.adk import StreamdSessionService  # noqa: E402


@pytest.fixture(autouse=True, params=support.adk.MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: through a daemon, and on a log in this process."""
    monkeypatch.setattr(support.adk, "mode", request.param)
    return str(request.param)


def text(t: str, role: str = "user") -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=t)])




# --- create / get ----------------------------------------------------------------


def test_get_of_a_session_never_created_is_none(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        assert await svc.get_session(app_name="app", user_id="u", session_id="nope") is None

    run(tmp_path, body)


def test_create_keeps_the_given_id_or_generates_one_and_refuses_an_existing_id(
    tmp_path: Path,
) -> None:
    async def body(svc: Service) -> None:
        given = await svc.create_session(app_name="app", user_id="u", session_id="s1")
        generated = await svc.create_session(app_name="app", user_id="u")
        assert given.id == "s1" and generated.id and generated.id != "s1"
        assert (given.app_name, given.user_id, given.events) == ("app", "u", [])
        assert given.last_update_time > 0
        with pytest.raises(AlreadyExistsError):
            await svc.create_session(app_name="app", user_id="u", session_id="s1")
        got = await svc.get_session(app_name="app", user_id="u", session_id=generated.id)
        assert got is not None and got.id == generated.id

    run(tmp_path, body)


def test_state_prefixes_scope_state_to_the_app_the_user_or_the_session_and_temp_is_not_kept(
    tmp_path: Path,
) -> None:
    async def body(svc: Service) -> None:
        s11 = await svc.create_session(
            app_name="app", user_id="u1", session_id="s11",
            state={"key11": "v11", "app:key": "app-v", "user:key1": "u1-v", "temp:key": "t"},
        )
        assert s11.state == {"key11": "v11", "app:key": "app-v", "user:key1": "u1-v"}
        # The user's other sessions see user: and app: state, not another session's.
        s12 = await svc.create_session(app_name="app", user_id="u1", session_id="s12")
        assert s12.state == {"app:key": "app-v", "user:key1": "u1-v"}
        # Another user of the app sees the app's state only.
        s2 = await svc.create_session(app_name="app", user_id="u2", session_id="s2")
        assert s2.state == {"app:key": "app-v"}
        # Another app sees nothing.
        other = await svc.create_session(app_name="other", user_id="u1", session_id="x")
        assert other.state == {}

    run(tmp_path, body)


def test_append_applies_the_delta_by_prefix_and_temp_only_in_memory(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s",
                                     state={"n": 0})
        e = event(delta={"n": 1, "app:a": 1, "user:u": 1, "temp:t": "scratch"})
        returned = await svc.append_event(s, e)
        assert returned is e
        # In memory, temp state lasts for the rest of the invocation ...
        assert s.state == {"n": 1, "app:a": 1, "user:u": 1, "temp:t": "scratch"}
        # ... but is never stored: not in the state, not in the stored event.
        assert e.actions.state_delta == {"n": 1, "app:a": 1, "user:u": 1}
        got = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert got.state == {"n": 1, "app:a": 1, "user:u": 1}
        assert got.events[0].actions.state_delta == {"n": 1, "app:a": 1, "user:u": 1}
        assert await svc.get_user_state(app_name="app", user_id="u") == {"u": 1}
        fresh = await svc.create_session(app_name="app", user_id="u", session_id="t")
        assert fresh.state == {"app:a": 1, "user:u": 1}

    run(tmp_path, body)


def test_a_partial_event_is_returned_and_never_stored(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        partial = event("model", content=text("half", "model"), partial=True,
                        delta={"x": 1})
        assert await svc.append_event(s, partial) is partial
        got = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None and got.events == [] and got.state == {} and s.events == []

    run(tmp_path, body)


def test_every_field_of_an_event_round_trips(tmp_path: Path) -> None:
    rich = Event(
        invocation_id="inv-9",
        author="planner",
        branch="root.planner",
        content=types.Content(
            role="model",
            parts=[
                types.Part(text="thinking", thought=True),
                types.Part(function_call=types.FunctionCall(id="fc-1", name="search",
                                                            args={"q": "x", "n": [1, 2]})),
                types.Part(inline_data=types.Blob(mime_type="image/png", data=b"\x89PNG\x00\xff")),
            ],
        ),
        actions=EventActions(
            skip_summarization=True,
            state_delta={"plan": {"steps": [1, 2]}, "app:v": 2},
            artifact_delta={"report.md": 3},
            transfer_to_agent="writer",
            escalate=False,
            compaction=EventCompaction(start_timestamp=1.5, end_timestamp=2.5,
                                       compacted_content=text("summary", "model")),
            end_of_agent=True,
            agent_state={"i": 1},
            route=["a", 2],
            set_model_response={"answer": 42},
        ),
        long_running_tool_ids={"fc-1", "fc-0"},
        partial=False,
        turn_complete=True,
        error_code="E1",
        error_message="a message",
        interrupted=False,
        custom_metadata={"trace": "t-1"},
        model_version="m-1",
        finish_reason=types.FinishReason.STOP,
        usage_metadata=types.GenerateContentResponseUsageMetadata(prompt_token_count=7),
        output={"result": [1, "two"]},
        timestamp=1_700_000_000.123456,
    )
    original = copy.deepcopy(rich)

    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        await svc.append_event(s, rich)
        svc._loader.forget()  # decoded from storage, not the cache
        got = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        (stored,) = got.events
        assert stored == original
        assert stored.model_dump() == original.model_dump()

    run(tmp_path, body)


def test_get_session_config_bounds_the_events_it_returns(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        for i in range(1, 11):
            await svc.append_event(s, event(ts=float(i), content=text(f"m{i}")))

        async def times(**config: Any) -> list[float]:
            got = await svc.get_session(app_name="app", user_id="u", session_id="s",
                                        config=GetSessionConfig(**config))
            assert got is not None
            return [e.timestamp for e in got.events]

        assert await times() == [float(i) for i in range(1, 11)]
        assert await times(num_recent_events=3) == [8.0, 9.0, 10.0]
        assert await times(num_recent_events=0) == []  # "if 0, no events are returned"
        assert await times(num_recent_events=50) == [float(i) for i in range(1, 11)]
        # "returns events with timestamp >= the given time"
        assert await times(after_timestamp=7.0) == [7.0, 8.0, 9.0, 10.0]
        assert await times(after_timestamp=7.5) == [8.0, 9.0, 10.0]
        assert await times(after_timestamp=4.0, num_recent_events=2) == [9.0, 10.0]
        assert await times(after_timestamp=9.0, num_recent_events=5) == [9.0, 10.0]
        with pytest.raises(ValueError):
            GetSessionConfig(num_recent_events=-1)
        # A bounded read still carries the whole state and where the session stands.
        latest = await svc.get_session(app_name="app", user_id="u", session_id="s",
                                       config=GetSessionConfig(num_recent_events=0))
        assert latest is not None and latest._storage_update_marker == s._storage_update_marker

    run(tmp_path, body)


# --- list / delete -------------------------------------------------------------------


def test_list_sessions_has_no_events_merges_state_and_is_oldest_update_first(
    tmp_path: Path,
) -> None:
    async def body(svc: Service) -> None:
        a = await svc.create_session(app_name="app", user_id="u1", session_id="a",
                                     state={"user:who": "u1", "own": "a"})
        b = await svc.create_session(app_name="app", user_id="u2", session_id="b",
                                     state={"app:shared": 1})
        await svc.create_session(app_name="other", user_id="u1", session_id="c")
        await svc.append_event(a, event(content=text("later")))  # a is now the newest
        listed = (await svc.list_sessions(app_name="app")).sessions
        assert [s.id for s in listed] == ["b", "a"]
        assert all(s.events == [] for s in listed)
        assert listed[1].state == {"own": "a", "user:who": "u1", "app:shared": 1}
        assert listed[0].state == {"app:shared": 1}
        mine = (await svc.list_sessions(app_name="app", user_id="u1")).sessions
        assert [s.id for s in mine] == ["a"]
        assert (await svc.list_sessions(app_name="none")).sessions == []
        assert b.id == "b"

    run(tmp_path, body)


def test_list_sessions_reads_past_one_page(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        for i in range(1203):
            await svc._client()  # one connection, reused
            await (await svc._client()).create_session("app", "u", f"s{i:04d}")
        listed = (await svc.list_sessions(app_name="app", user_id="u")).sessions
        assert len(listed) == 1203 and len({s.id for s in listed}) == 1203

    run(tmp_path, body, timeout=120)


def test_delete_removes_the_session_and_keeps_the_users_and_apps_state(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s",
                                     state={"user:k": 1, "app:k": 2, "own": 3})
        await svc.delete_session(app_name="app", user_id="u", session_id="s")
        await svc.delete_session(app_name="app", user_id="u", session_id="s")  # idempotent
        assert await svc.get_session(app_name="app", user_id="u", session_id="s") is None
        assert await svc.get_user_state(app_name="app", user_id="u") == {"k": 1}
        again = await svc.create_session(app_name="app", user_id="u", session_id="s")
        assert again.state == {"user:k": 1, "app:k": 2}
        # Appending to the deleted copy is refused, not a silent re-creation.
        await svc.delete_session(app_name="app", user_id="u", session_id="s")
        with pytest.raises(SessionNotFoundError):
            await svc.append_event(s, event())
        assert await svc.get_session(app_name="app", user_id="u", session_id="s") is None

    run(tmp_path, body)


def test_get_user_state_is_the_raw_keys_and_empty_for_a_user_without_any(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        assert await svc.get_user_state(app_name="app", user_id="nobody") == {}
        await svc.create_session(app_name="app", user_id="u", state={"user:lang": "fr"})
        assert await svc.get_user_state(app_name="app", user_id="u") == {"lang": "fr"}

    run(tmp_path, body)


# --- stale sessions --------------------------------------------------------------------


def test_an_append_computed_on_a_session_that_moved_on_raises_stale_and_writes_nothing(
    tmp_path: Path,
) -> None:
    async def body(svc: Service) -> None:
        await svc.create_session(app_name="app", user_id="u", session_id="s")
        mine = await svc.get_session(app_name="app", user_id="u", session_id="s")
        theirs = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert mine is not None and theirs is not None
        await svc.append_event(theirs, event(content=text("theirs"), delta={"who": "them"}))
        with pytest.raises(StaleSessionError):
            await svc.append_event(mine, event(content=text("mine"), delta={"who": "me"}))
        stored = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert stored is not None
        assert [e.content.parts[0].text for e in stored.events] == ["theirs"]
        assert stored.state == {"who": "them"}
        # Reloaded, the append goes through; and a session keeps appending in order.
        await svc.append_event(stored, event(content=text("mine"), delta={"who": "me"}))
        await svc.append_event(stored, event(content=text("more")))
        final = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert final is not None and len(final.events) == 3 and final.state == {"who": "me"}

    run(tmp_path, body)


def test_a_session_built_by_hand_is_current_only_if_its_last_event_is_the_stored_last(
    tmp_path: Path,
) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        first = event(content=text("one"))
        await svc.append_event(s, first)
        by_hand = Session(id="s", app_name="app", user_id="u", events=[first])
        await svc.append_event(by_hand, event(content=text("two")))
        outdated = Session(id="s", app_name="app", user_id="u", events=[first])
        with pytest.raises(StaleSessionError):
            await svc.append_event(outdated, event(content=text("three")))

    run(tmp_path, body)


def test_retrying_an_append_that_was_written_stores_it_once(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        e = event(content=text("once"), delta={"count": 1})
        snapshot = copy.deepcopy(s)
        await svc.append_event(s, e)
        # The caller never heard back and retries on its copy of the session.
        await svc.append_event(snapshot, copy.deepcopy(e))
        got = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None and [x.id for x in got.events] == [e.id]
        assert [x.id for x in snapshot.events] == [e.id]
        # Both copies may go on appending.
        await svc.append_event(snapshot, event(content=text("next")))

    run(tmp_path, body)


@pytest.mark.parametrize("cache", [20_000, 3, 0])
def test_a_reloaded_session_is_what_a_fresh_service_reads_whatever_the_cache_holds(
    tmp_path: Path, cache: int
) -> None:
    """Reloads read seqs first and only the content the cache lacks: new
    events at the end, or scattered ones a small cache evicted."""

    async def body(svc: Service) -> None:
        other = StreamdSessionService(await svc._client(), event_cache=0)
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        for i in range(10):
            await svc.append_event(s, event(ts=float(i + 1), content=text(f"m{i}")))
        for round_ in range(3):
            moved = await other.get_session(app_name="app", user_id="u", session_id="s")
            assert moved is not None
            await other.append_event(moved, event(ts=20.0 + round_, content=text(f"x{round_}")))
            for config in (None, GetSessionConfig(num_recent_events=4),
                           GetSessionConfig(after_timestamp=5.0)):
                mine = await svc.get_session(app_name="app", user_id="u", session_id="s",
                                             config=config)
                truth = await other.get_session(app_name="app", user_id="u",
                                                session_id="s", config=config)
                assert mine is not None and truth is not None
                assert [e.model_dump() for e in mine.events] == [
                    e.model_dump() for e in truth.events
                ]
                assert mine.state == truth.state
                assert mine._storage_update_marker == truth._storage_update_marker

    run(tmp_path, body, event_cache=cache)


@pytest.mark.parametrize("cache", [20_000, 0])
def test_a_session_longer_than_one_answer_loads_whole(tmp_path: Path, cache: int) -> None:
    """The daemon cuts a session's answer at its reply budget (4 MiB); the
    service reads on from where each part ends, cold and again warm (where
    the content the cache lacks is itself longer than one answer)."""
    from streamd.eventlog.model import REPLY_BUDGET_BYTES

    big = REPLY_BUDGET_BYTES * 3 // 8  # three of these pass the budget

    async def body(svc: Service) -> None:
        other = StreamdSessionService(await svc._client(), event_cache=0)
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        for i in range(4):
            await svc.append_event(s, event(ts=float(i + 1), content=text(f"{i}" * big)))
        cold = await StreamdSessionService(await svc._client()).get_session(
            app_name="app", user_id="u", session_id="s")
        assert cold is not None
        assert [e.content.parts[0].text for e in cold.events if e.content and e.content.parts] \
            == [f"{i}" * big for i in range(4)]
        first = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert first is not None and len(first.events) == 4
        moved = await other.get_session(app_name="app", user_id="u", session_id="s")
        assert moved is not None
        for i in range(4, 7):
            await other.append_event(moved, event(ts=float(i + 1), content=text(f"{i}" * big)))
        again = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert again is not None
        assert [e.content.parts[0].text for e in again.events if e.content and e.content.parts] \
            == [f"{i}" * big for i in range(7)]
        assert again._storage_update_marker == moved._storage_update_marker

    run(tmp_path, body, event_cache=cache, timeout=120)


def test_loaded_events_are_copies_that_a_caller_may_reassign(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        await svc.append_event(s, event(content=text("kept")))
        one = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert one is not None
        one.events[0].author = "changed"
        one.events.append(event())
        two = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert two is not None and [e.author for e in two.events] == ["user"]

    run(tmp_path, body)


# --- write-behind ---------------------------------------------------------------------


def test_write_behind_stores_every_event_in_order_by_flush(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        sent = [event(content=text(f"m{i}"), delta={"i": i, "user:last": i}) for i in range(300)]
        for e in sent:
            assert await svc.append_event(s, e) is e
        assert s.state == {"i": 299, "user:last": 299} and len(s.events) == 300
        await svc.flush()
        client = await svc._client()
        stored = await client.get_session("app", "u", "s")
        assert [e.event.id for e in stored.events] == [e.id for e in sent]
        assert stored.state == {"i": 299}
        assert stored.last_seq == 300

    run(tmp_path, body, write_behind=True)


def test_write_behind_reads_its_own_writes(tmp_path: Path) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        for i in range(50):
            await svc.append_event(s, event(content=text(f"m{i}"), delta={"user:n": i}))
        got = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None and len(got.events) == 50 and got.state["user:n"] == 49
        assert await svc.get_user_state(app_name="app", user_id="u") == {"n": 49}
        # The reloaded copy appends after everything queued before it.
        await svc.append_event(got, event(content=text("after")))
        await svc.append_event(s, event(content=text("stale")))  # queued, refused later
        with pytest.raises(StaleSessionError):
            await svc.flush()
        stored = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert stored is not None and len(stored.events) == 51
        assert stored.events[-1].content.parts[0].text == "after"

    run(tmp_path, body, write_behind=True)


def test_write_behind_refuses_a_stale_copy_at_its_next_append_and_drops_what_followed(
    tmp_path: Path,
) -> None:
    async def body(svc: Service) -> None:
        await svc.create_session(app_name="app", user_id="u", session_id="s")
        mine = await svc.get_session(app_name="app", user_id="u", session_id="s")
        theirs = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert mine is not None and theirs is not None
        await svc.append_event(theirs, event(content=text("theirs")))
        await svc.flush()
        # Queued behind a session that moved on: refused when sent.
        await svc.append_event(mine, event(content=text("mine-1"), delta={"who": "me"}))
        await svc.append_event(mine, event(content=text("mine-2")))
        await svc._drain()
        with pytest.raises(StaleSessionError):
            await svc.append_event(mine, event(content=text("mine-3")))
        with pytest.raises(StaleSessionError):  # and stays refused: reload it
            await svc.append_event(mine, event(content=text("mine-4")))
        await svc.flush()  # already raised by the appends: nothing left to raise
        stored = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert stored is not None
        assert [e.content.parts[0].text for e in stored.events] == ["theirs"]
        assert stored.state == {}

    run(tmp_path, body, write_behind=True)


# --- the same scenario against ADK's own in-memory service -----------------------------


async def _scenario(svc: BaseSessionService) -> dict[str, Any]:
    s = await svc.create_session(app_name="app", user_id="u", session_id="s",
                                 state={"a": 1, "app:x": 1, "user:y": 1, "temp:z": 1})
    other = await svc.create_session(app_name="app", user_id="v", session_id="o")
    for i in range(5):
        await svc.append_event(s, event(ts=100.0 + i, content=text(f"m{i}"),
                                        delta={"i": i, "user:y": i, "temp:t": i}))
    await svc.append_event(other, event(ts=200.0, delta={"app:x": 9}))
    got = await svc.get_session(app_name="app", user_id="u", session_id="s")
    recent = await svc.get_session(app_name="app", user_id="u", session_id="s",
                                   config=GetSessionConfig(num_recent_events=2))
    after = await svc.get_session(app_name="app", user_id="u", session_id="s",
                                  config=GetSessionConfig(after_timestamp=103.0))
    listed = await svc.list_sessions(app_name="app")
    assert got is not None and recent is not None and after is not None
    return {
        "in_memory_state": s.state,
        "state": got.state,
        "events": [e.model_dump() for e in got.events],
        "recent": [e.id for e in recent.events],
        "after": [e.id for e in after.events],
        "listed": [(x.id, x.user_id, x.state, x.events) for x in listed.sessions],
        "user_state": await svc.get_user_state(app_name="app", user_id="u"),
        "missing": await svc.get_session(app_name="app", user_id="u", session_id="nope"),
    }


@pytest.mark.parametrize("write_behind", [False, True])
def test_the_same_scenario_gives_what_adks_in_memory_service_gives(
    tmp_path: Path, write_behind: bool
) -> None:
    import uuid

    counter = iter(range(10**6))
    ids = lambda: f"id-{next(counter)}"  # noqa: E731

    def deterministic() -> Any:
        return pytest.MonkeyPatch.context()

    with deterministic() as mp:
        mp.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(counter)))
        mp.setattr(Event, "new_id", staticmethod(ids))
        theirs = asyncio.run(_scenario(InMemorySessionService()))
    counter = iter(range(10**6))
    with deterministic() as mp:
        mp.setattr(Event, "new_id", staticmethod(ids))
        ours = run(tmp_path, _scenario, write_behind=write_behind)
    assert ours == theirs
