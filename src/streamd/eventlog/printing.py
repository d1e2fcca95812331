"""What ``streamd log`` prints: lines for people, JSON objects for scripts.

Stored text reaches a terminal only through :func:`out`, which makes it
printable (an event's content cannot drive the terminal). A session is
printed as it is read, a page at a time (:func:`print_session`): held whole,
a session of a million events took 1.67 GB to print.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from streamd.cli.terminal import printable
from streamd.eventlog.log import EventLog
from streamd.eventlog.model import (
    REPLY_BUDGET_BYTES,
    Boot,
    Entry,
    LeaseInfo,
    Session,
    SessionWithEvents,
)

__all__ = [
    "CONTENT_WIDTH", "boot_line", "encode", "entry_line", "json_line", "lease_line", "out",
    "print_session", "session_line", "when",
]

encode = msgspec.json.Encoder().encode
CONTENT_WIDTH = 160


def out(line: str) -> None:
    """A line for people: stored text in it cannot drive the terminal."""
    sys.stdout.write(printable(line) + "\n")


def json_line(value: Any) -> None:
    sys.stdout.write(encode(value).decode() + "\n")


def when(t: dt.datetime | None) -> str:
    if t is None:
        return "(unreadable time)"  # a damaged row: see streamd.eventlog.model
    t = t.astimezone(dt.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _content(content: Any, full: bool) -> str:
    text = content if isinstance(content, str) else encode(content).decode()
    text = text.replace("\n", "\\n")
    if not full and len(text) > CONTENT_WIDTH:
        text = text[: CONTENT_WIDTH - 1] + "…"
    return text


def entry_line(entry: Entry, full: bool) -> str:
    """An entry for people; its content cut at :data:`CONTENT_WIDTH` unless ``full``."""
    ev = entry.event
    branch = f" [{ev.branch}]" if ev.branch else ""
    meta = ""
    if entry.metadata:
        meta = "  {" + ", ".join(f"{k}={v}" for k, v in sorted(entry.metadata.items())) + "}"
    return (
        f"{entry.seq:>7}  {when(ev.timestamp)}  "
        f"{entry.app}/{entry.user}/{entry.session}{branch}  "
        f"{ev.author}: {_content(ev.content, full)}{meta}"
    )


def session_line(s: Session) -> str:
    return (
        f"{s.app}/{s.user}/{s.session}  created {when(s.created_at)}  "
        f"updated {when(s.updated_at)}"
    )


def lease_line(lease: LeaseInfo, now: dt.datetime) -> str:
    beat = lease.heartbeat_at
    age = f"{(now - beat).total_seconds():.1f}s ago" if beat is not None else when(beat)
    return (
        f"{lease.app}/{lease.user}/{lease.session}  held by {lease.holder}  "
        f"since {when(lease.acquired_at)}  heartbeat {age}"
    )


def boot_line(boot: Boot) -> str:
    attempted = "(unreadable)" if boot.attempted is None else ", ".join(boot.attempted) or "-"
    return f"{boot.id:>5}  {when(boot.boot_at)}  attempted: {attempted}"


async def print_session(
    log: EventLog, app: str, user: str, session: str, after_seq: int, recent: int | None,
    *, as_json: bool, full: bool,
) -> None:
    """``sessions get``: the session, its state and its events, read a page
    (the reply budget) at a time and printed as read. ``as_json``: one
    object, the shape of an answer that holds everything (no ``truncated``,
    no ``next_seq``), its events written as their pages come."""
    first = await log.get_session(app, user, session, after_seq, recent,
                                  max_bytes=REPLY_BUDGET_BYTES)
    whole = msgspec.structs.replace(first, events=[], truncated=False, next_seq=None)
    entries = _entries(log, first, recent)
    del first  # its events go with the page, once printed
    if not as_json:
        out(session_line(whole) + f"  state {encode(whole.state).decode()}")
        async for entry in entries:
            out(entry_line(entry, full))
        return
    fields = msgspec.json.decode(encode(whole))  # the answer's keys, in order
    write = sys.stdout.write
    write("{")
    for i, (key, value) in enumerate(fields.items()):
        write(("," if i else "") + encode(key).decode() + ":")
        if key != "events":
            write(encode(value).decode())
            continue
        write("[")
        n = 0
        async for entry in entries:
            write(("," if n else "") + encode(entry).decode())
            n += 1
        write("]")
    write("}\n")


async def _entries(
    log: EventLog, page: SessionWithEvents, recent: int | None
) -> AsyncIterator[Entry]:
    """The events of ``page`` and of the pages after it: a truncated answer
    is continued after its ``next_seq`` with the same ``recent``."""
    while True:
        for entry in page.events:
            yield entry
        if not page.truncated or page.next_seq is None:
            return
        page = await log.get_session(page.app, page.user, page.session, page.next_seq,
                                     recent, max_bytes=REPLY_BUDGET_BYTES)
