"""How the ADK service loads a session: what it does when the log's answer is
not a session, and when the cached events it counts on are evicted while it
reads the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

pytestmark = pytest.mark.subprocess

adk = pytest.importorskip("google.adk")

import asyncio  # noqa: E402

import support.adk  # noqa: E402
from google.genai import types  # noqa: E402
from support.adk import Service, event, run  # noqa: E402

from streamd import errors  # noqa: E402
from streamd.adk import StreamdSessionService  # noqa: E402
from streamd.adk.loading import SessionLoader  # noqa: E402
from streamd.client.protocol import Call  # noqa: E402
from streamd.errors import RpcError  # noqa: E402


@pytest.fixture(params=support.adk.MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(support.adk, "mode", request.param)
    return str(request.param)


def text(t: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=t)])


async def _session_of(svc: Service, n: int) -> tuple[Any, Any]:
    """The service's client, and session "s" holding messages m0 to m{n-1}."""
    client = await svc._client()
    s = await svc.create_session(app_name="app", user_id="u", session_id="s")
    for i in range(n):
        await svc.append_event(s, event(ts=float(i + 1), content=text(f"m{i}")))
    return client, s


class _Garbled:
    """A client whose every answer is JSON but not a session."""

    async def call(self, call: Call[Any]) -> Any:
        return msgspec.Raw(b'{"session": 5, "events": "none"}')


def test_an_answer_that_is_not_a_session_is_an_internal_error_not_a_crash() -> None:
    service = StreamdSessionService(_Garbled())  # type: ignore[arg-type]

    async def main() -> None:
        with pytest.raises(RpcError) as raised:
            await service.get_session(app_name="app", user_id="u", session_id="s")
        assert raised.value.code == errors.INTERNAL_ERROR
        assert "eventlog/sessions.get: the answer does not decode" in raised.value.message

    asyncio.run(main())


class _Evicting:
    """The service's client, emptying a loader's cache while it reads an
    answer with content: another load evicting the events meanwhile."""

    def __init__(self, client: Any, loader: SessionLoader) -> None:
        self.client, self.loader = client, loader

    async def call(self, call: Call[Any]) -> Any:
        if call.method == "eventlog/sessions.get" and call.params.content:
            self.loader.forget()
        return await self.client.call(call)


def test_cached_events_evicted_while_the_rest_is_read_are_still_loaded(
    tmp_path: Path, mode: str
) -> None:
    """A reload reads the seqs, then the content the cache lacks; another
    load may evict the cached ones meanwhile (on the same loop between the
    two reads, or on another loop's thread): the reload still has them."""

    async def body(svc: Service) -> None:
        client, _ = await _session_of(svc, 5)
        loader = SessionLoader()
        evicting = _Evicting(client, loader)
        first = await loader.load(evicting, "app", "u", "s", None, None)  # type: ignore[arg-type]
        assert first is not None and len(first.events) == 5
        await svc.append_event(first, event(ts=9.0, content=text("new")))
        again = await loader.load(evicting, "app", "u", "s", None, None)  # type: ignore[arg-type]
        truth = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert again is not None and truth is not None
        assert [e.model_dump() for e in again.events] == [e.model_dump() for e in truth.events]
        assert [e.content.parts[0].text for e in again.events  # type: ignore[union-attr,index]
                ] == ["m0", "m1", "m2", "m3", "m4", "new"]

    run(tmp_path, body)


class _Deleting:
    """The service's client, deleting the session just before the read of
    the content its cache lacks: a delete_session racing the load."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def call(self, call: Call[Any]) -> Any:
        if call.method == "eventlog/sessions.get" and call.params.content:
            await self.client.delete_session("app", "u", "s")
        return await self.client.call(call)


def test_a_session_deleted_between_a_reloads_two_reads_is_none(tmp_path: Path, mode: str) -> None:
    # The first read listed its seqs (some cached, some not); what it listed
    # is no session once deleted: half of it, with its state, was returned.
    async def body(svc: Service) -> None:
        client, s = await _session_of(svc, 3)
        loader = SessionLoader()
        assert await loader.load(client, "app", "u", "s", None, None) is not None
        await svc.append_event(s, event(ts=9.0, content=text("uncached")))
        deleting = _Deleting(client)
        assert await loader.load(deleting, "app", "u", "s", None, None) is None  # type: ignore[arg-type]

    run(tmp_path, body)


class _MakingAnew:
    """The service's client, deleting session "s" and creating it anew with
    one event ("fresh") just before the first read that continues another
    (``after_seq`` past 0): another process racing a load."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.done = False

    async def call(self, call: Call[Any]) -> Any:
        if call.method == "eventlog/sessions.get" and call.params.after_seq and not self.done:
            self.done = True
            await self.client.delete_session("app", "u", "s")
            await self.client.create_session("app", "u", "s", {})
            svc = StreamdSessionService(self.client)
            made = await svc.get_session(app_name="app", user_id="u", session_id="s")
            assert made is not None
            await svc.append_event(made, event(ts=20.0, content=text("fresh")))
        return await self.client.call(call)


def test_a_session_made_anew_between_the_parts_of_a_long_read_is_read_anew(
    tmp_path: Path,
) -> None:
    """Through the daemon a session longer than one answer (the reply budget
    is 4 MiB) is read in parts (in process it is read whole, in one
    transaction); made anew between them, its first part was kept and the
    rest (deleted with it) silently missing. The read starts over on the new
    one."""
    big = "x" * (700 << 10)

    async def body(svc: Service) -> None:
        client = await svc._client()
        s = await svc.create_session(app_name="app", user_id="u", session_id="s")
        for i in range(8):
            await svc.append_event(s, event(ts=float(i + 1), content=text(f"{i}{big}")))
        racing = _MakingAnew(client)
        got = await SessionLoader().load(racing, "app", "u", "s", None, None)  # type: ignore[arg-type]
        assert racing.done
        assert got is not None
        assert [e.content.parts[0].text for e in got.events] == ["fresh"]  # type: ignore[union-attr,index]

    run(tmp_path, body)


def test_a_session_made_anew_between_a_reloads_two_reads_is_read_anew(
    tmp_path: Path, mode: str
) -> None:
    # The first read listed the old session's seqs, the cache held most of
    # them: the old session, which no longer exists, was returned.
    async def body(svc: Service) -> None:
        client, s = await _session_of(svc, 3)
        loader = SessionLoader()
        assert await loader.load(client, "app", "u", "s", None, None) is not None
        await svc.append_event(s, event(ts=9.0, content=text("uncached")))
        racing = _MakingAnew(client)
        got = await loader.load(racing, "app", "u", "s", None, None)  # type: ignore[arg-type]
        assert racing.done
        assert got is not None
        assert [e.content.parts[0].text for e in got.events] == ["fresh"]  # type: ignore[union-attr,index]

    run(tmp_path, body)

