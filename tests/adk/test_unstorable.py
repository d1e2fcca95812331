"""What the log cannot hold is refused by the ADK service with a ``ValueError``
that says why, before anything is written: an empty app or user name, and a
NaN or an infinity in state (JSON has no such numbers; they were stored as
null). A read of an empty name finds nothing, as a read of any session that
was never stored. Through a daemon and in process, durable and write-behind."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

pytest.importorskip("google.adk")

import support.adk  # noqa: E402
from support.adk import Service, event, run  # noqa: E402


@pytest.fixture(autouse=True, params=support.adk.MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(support.adk, "mode", request.param)
    return str(request.param)


@pytest.mark.parametrize("names", [("", "u"), ("app", "")], ids=["no-app", "no-user"])
def test_an_empty_app_or_user_is_refused_at_create_and_found_nowhere(
    tmp_path: Path, names: tuple[str, str]
) -> None:
    app, user = names
    which = "app_name" if not app else "user_id"

    async def body(svc: Service) -> None:
        with pytest.raises(ValueError, match=f"^{which} must not be empty"):
            await svc.create_session(app_name=app, user_id=user, session_id="s")
        assert await svc.get_session(app_name=app, user_id=user, session_id="s") is None
        assert (await svc.list_sessions(app_name=app, user_id=user)).sessions == []
        assert await svc.get_user_state(app_name=app, user_id=user) == {}
        await svc.delete_session(app_name=app, user_id=user, session_id="s")
        # The other names are untouched and still work.
        kept = await svc.create_session(app_name="app", user_id="u", session_id="s")
        assert [s.id for s in (await svc.list_sessions(app_name="app")).sessions] == [kept.id]

    run(tmp_path, body)


@pytest.mark.parametrize(
    ("key", "value", "where"),
    [
        ("x", float("nan"), "'x' holds nan"),
        ("app:x", float("inf"), "'app:x' holds inf"),
        ("user:x", {"deep": [1, float("-inf")]}, r"'user:x\.deep\[1\]' holds -inf"),
    ],
    ids=["session-nan", "app-inf", "user-nested"],
)
def test_a_non_finite_number_in_state_is_refused_at_create(
    tmp_path: Path, key: str, value: object, where: str
) -> None:
    async def body(svc: Service) -> None:
        with pytest.raises(ValueError, match=f"state key {where}"):
            await svc.create_session(
                app_name="app", user_id="u", session_id="s", state={"ok": 1, key: value})
        assert await svc.get_session(app_name="app", user_id="u", session_id="s") is None

    run(tmp_path, body)


@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
def test_a_non_finite_number_in_a_delta_is_refused_and_nothing_is_stored(
    tmp_path: Path, write_behind: bool
) -> None:
    async def body(svc: Service) -> None:
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        await svc.append_event(s, event(delta={"n": 1}))
        with pytest.raises(ValueError, match="state key 'n' holds nan"):
            await svc.append_event(s, event(delta={"n": float("nan")}))
        # The copy is still current: nothing of the refused event reached it
        # or the log, and the next append goes on from it.
        await svc.append_event(s, event(delta={"m": 2}))
        await svc.flush()
        got = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert got.state == {"n": 1, "m": 2}
        assert [e.id for e in got.events] == [e.id for e in s.events]
        assert len(got.events) == 2

    run(tmp_path, body, write_behind=write_behind)


def test_a_state_past_the_logs_limit_is_a_value_error_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    # The log refuses a state grown past MAX_STATE_BYTES (-32602), at create
    # and at append; the service raised that raw RpcError, where ADK callers
    # catch a ValueError for a write refused.
    from streamd.eventlog.model import MAX_STATE_BYTES

    big = "x" * MAX_STATE_BYTES

    async def body(svc: Service) -> None:
        with pytest.raises(ValueError, match=r"state would be \d+ bytes of JSON, over the"):
            await svc.create_session(
                app_name="app", user_id="u", session_id="big", state={"doc": big})
        assert await svc.get_session(app_name="app", user_id="u", session_id="big") is None
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        await svc.append_event(s, event(delta={"n": 1}))
        with pytest.raises(ValueError, match=r"state would be \d+ bytes of JSON, over the"):
            await svc.append_event(s, event(delta={"app:doc": big}))
        await svc.append_event(s, event(delta={"m": 2}))
        got = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None and got.state == {"n": 1, "m": 2}
        assert [e.id for e in got.events] == [e.id for e in s.events]

    run(tmp_path, body)
