"""A surrogate code point (``"\\ud800"``) through the in-process faces: the
event log's keyword API, the typed clients' request encoding and the
in-process :class:`~streamd.client.local.LocalClient`. Each answers -32602
naming the field, as the store does (``tests/eventlog/test_store_surrogate.py``),
never the encoder's ``UnicodeEncodeError``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import trio

from streamd.client import calls
from streamd.client.local import LocalClient
from streamd.client.protocol import ClientProtocol
from streamd.errors import INVALID_PARAMS, RpcError
from streamd.eventlog.log import EventLog
from streamd.eventlog.model import Filter

LONE = "s\ud800"
REFUSED = "is not text any database can store"


def _refused(exc: RpcError, field: str, method: str = "") -> None:
    assert exc.code == INVALID_PARAMS
    prefix = f"{method} params: " if method else ""
    assert exc.message.startswith(f"{prefix}{field} {REFUSED}"), exc.message


def test_a_typed_client_refuses_a_request_it_cannot_encode_and_sends_nothing() -> None:
    proto = ClientProtocol()
    with pytest.raises(RpcError) as info:
        proto.start(calls.get_session("app", "u", LONE))
    _refused(info.value, "session", "eventlog/sessions.get")
    with pytest.raises(RpcError) as info:
        proto.start(calls.since(0, filter=Filter(branch_prefixes=["main", LONE])))
    _refused(info.value, "filter.branch_prefixes[1]", "eventlog/since")
    _, frame = proto.start(calls.ping())  # the protocol is still usable
    assert b"eventlog/ping" in frame


def test_the_in_process_client_refuses_naming_the_field(tmp_path: Path) -> None:
    async def scenario() -> list[RpcError]:
        got = []
        async with await LocalClient.open(tmp_path / "local.db") as client:
            for call in (client.get_session("app", "u", LONE),
                         client.delete_session("app", LONE, "s"),
                         client.list_sessions("app", LONE)):
                try:
                    await call
                except RpcError as exc:
                    got.append(exc)
            await client.ping()
        return got

    got = asyncio.run(scenario())
    assert len(got) == 3
    _refused(got[0], "session", "eventlog/sessions.get")
    _refused(got[1], "user", "eventlog/sessions.delete")
    _refused(got[2], "user", "eventlog/sessions.list")


async def test_the_event_log_keyword_api_refuses_naming_the_field(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with EventLog(tmp_path / "e.db", synchronous="NORMAL") as log:
            with pytest.raises(RpcError) as info:
                await log.get_session("app", "u", LONE)
            _refused(info.value, "session")
            with pytest.raises(RpcError) as info:
                await log.acquire_lock("app", "u", LONE)
            _refused(info.value, "session")
            with pytest.raises(RpcError) as info:
                await log.since(0, filter=Filter(author_suffix=LONE))
            _refused(info.value, "filter.author_suffix")
            with pytest.raises(RpcError) as info:
                async with log.watch(0, filter=Filter(session=LONE)) as w:
                    async for _ in w:
                        break
            _refused(info.value, "filter.session")
