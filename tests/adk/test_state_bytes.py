"""Bytes in ADK state are stored as ADK's own persistent services store them:
UTF-8 bytes as their text, other bytes as base64 text (ADK's
``make_json_safe_state``; not restored to bytes on read, by either). ADK's
``SqliteSessionService`` is the oracle: every scope, at create and in an
event's delta, read back value for value.

Before, bytes that are not UTF-8 anywhere in a state value (an image's
bytes, a pickled object a tool kept) raised ``UnicodeDecodeError`` from
``create_session`` and ``append_event``, durable and write-behind, where
ADK's services store them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.subprocess

pytest.importorskip("google.adk")

import support.adk  # noqa: E402
from google.adk.sessions.base_session_service import BaseSessionService  # noqa: E402
from google.adk.sessions.sqlite_session_service import SqliteSessionService  # noqa: E402
from support.adk import Service, event, run  # noqa: E402

VALUES: dict[str, Any] = {
    "raw": b"\x00\xffPNG",
    "text": b"caf\xc3\xa9",
    "nested": {"parts": [b"\x89\x01", {"inner": b"ok"}], "n": 1},
}


def _state(prefix: str) -> dict[str, Any]:
    return {f"{prefix}{key}": value for key, value in VALUES.items()}


@pytest.fixture(autouse=True, params=support.adk.MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(support.adk, "mode", request.param)
    return str(request.param)


async def _read_back(svc: BaseSessionService) -> tuple[dict[str, Any], dict[str, Any], Any]:
    made = await svc.create_session(
        app_name="a", user_id="u", session_id="s",
        state={**_state(""), **_state("app:"), **_state("user:")})
    s = await svc.create_session(app_name="a", user_id="u", session_id="s2")
    await svc.append_event(s, event(delta={**_state("d-"), **_state("app:d-"),
                                           **_state("user:d-")}))
    await svc.flush()
    first = await svc.get_session(app_name="a", user_id="u", session_id=made.id)
    second = await svc.get_session(app_name="a", user_id="u", session_id="s2")
    assert first is not None and second is not None
    return first.state, second.state, second.events[-1].actions.state_delta


@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
def test_bytes_in_state_are_stored_as_adks_own_services_store_them(
    tmp_path: Path, write_behind: bool
) -> None:
    oracle = SqliteSessionService(str(tmp_path / "adk.db"))
    want = asyncio.run(_read_back(oracle))
    assert want[0]["raw"] == "AP9QTkc=" and want[0]["text"] == "café"  # what ADK does

    async def body(svc: Service) -> None:
        got = await _read_back(svc)
        assert got == want

    run(tmp_path, body, write_behind=write_behind)
