"""A StreamdSessionService on a scratch daemon (or on a log in this process),
and ADK events."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types

from streamd.adk import StreamdSessionService
from streamd.adk.clients import Client
from streamd.client import AsyncClient
from streamd.client.local import LocalClient

Service = StreamdSessionService

MODES = ("daemon", "in-process")
"""Where the service's log is: a ``streamd`` spawned on stdio, or this
process (``database=``). A test module's fixture may set :data:`mode`."""

mode = "daemon"


def run(
    tmp_path: Path, body: Callable[[Service], Awaitable[Any]], *, timeout: float = 60,
    **options: Any,
) -> Any:
    """``body(service)`` on a fresh database, through a daemon of its own or
    in this process (:data:`mode`), bounded."""
    db = tmp_path / "events.db"

    async def main() -> Any:
        async with asyncio.timeout(timeout):
            if mode == "in-process":
                service = StreamdSessionService(database=db, synchronous="NORMAL", **options)
                try:
                    return await body(service)
                finally:
                    await service.close()
            client = await AsyncClient.spawn(["--db", str(db), "--synchronous", "NORMAL"])
            async with client:
                return await body(StreamdSessionService(client, **options))

    return asyncio.run(main())


def run_with_client(
    tmp_path: Path, body: Callable[[Service, Client], Awaitable[Any]], *,
    timeout: float = 60, **options: Any,
) -> Any:
    """``body(service, client)``: as :func:`run`, the service given its
    client, which the body may also use straight (the log under the service)."""
    db = tmp_path / "events.db"

    async def main() -> Any:
        async with asyncio.timeout(timeout):
            client: Client
            if mode == "in-process":
                client = await LocalClient.open(db, synchronous="NORMAL")
            else:
                client = await AsyncClient.spawn(["--db", str(db), "--synchronous", "NORMAL"])
            async with client:
                return await body(StreamdSessionService(client, **options), client)

    return asyncio.run(main())


def event(author: str = "user", *, ts: float | None = None, delta: dict[str, Any] | None = None,
          **kw: Any) -> Event:
    fields: dict[str, Any] = {"invocation_id": "inv-1", "author": author, **kw}
    if ts is not None:
        fields["timestamp"] = ts
    if delta is not None:
        fields["actions"] = EventActions(state_delta=delta)
    return Event(**fields)


def said(text: str, **kw: Any) -> Event:
    """A user's event saying ``text`` (``kw`` as for :func:`event`)."""
    return event(content=types.Content(role="user", parts=[types.Part(text=text)]), **kw)


def texts(session: Any) -> list[str]:
    """What each of ``session``'s events says, in order."""
    return [e.content.parts[0].text for e in session.events]

