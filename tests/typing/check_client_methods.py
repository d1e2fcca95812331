"""The one method table (``streamd.client.calls.EventLogMethods``) as a user's
type checker sees it: each client's method keeps the builder's parameters, and
answers the wire Struct (blocking) or a coroutine of it (asyncio, Trio).
Checked by mypy (``mypy tests/typing``), never run."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, assert_type

from streamd.client import AsyncClient, Client, TrioClient
from streamd.client.local import LocalClient
from streamd.eventlog.model import AppendResult, Empty, Event, SinceResult


async def method_table(
    sync: Client, aio: AsyncClient, trio_client: TrioClient, local: LocalClient
) -> None:
    event = Event(id="e", author="a", content=None)
    assert_type(sync.append("app", "u", "s", event, expected_seq=0), AppendResult)
    assert_type(sync.ping(), Empty)
    pending: Coroutine[Any, Any, AppendResult] = aio.append("app", "u", "s", event)
    assert_type(await pending, AppendResult)
    assert_type(await aio.since(0), SinceResult)
    assert_type(await trio_client.since(0), SinceResult)
    assert_type(await trio_client.ping(), Empty)
    assert_type(await local.append("app", "u", "s", event), AppendResult)
    assert_type(await local.since(0), SinceResult)
