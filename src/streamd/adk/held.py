"""The events each session copy holds, by id: write-behind's re-delivery check.

A write-behind ``append_event`` answers an event the copy already holds itself
(a re-delivery, or a conflict), since nothing asks the log before the event is
queued. Scanning the copy's events for the id made every append cost the
session's length, and a session's appends its length squared: at 20,000 events
an append spent milliseconds in the scan alone, more than a durable append's
commit. So each copy's events are indexed by id as they are appended, and an
append looks its id up.

The index follows the copy's list as ADK grows it (``session.events.append``):
the events past those indexed are added at the next look-up. A list replaced,
or shortened, is indexed again whole. An event found is confirmed still in the
list (re-deliveries are rare, so that scan is too); an event put in place of
another at the same position is not seen, and is then answered by the log at
its send, as a duplicate or a conflict.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from google.adk.events.event import Event
from google.adk.sessions.session import Session

from streamd import forks

__all__ = ["HeldEvents"]


class _Index:
    def __init__(self, copy: weakref.ref[Session], events: list[Event]) -> None:
        self.copy = copy
        self.events = events  # the list indexed (a copy's list may be replaced)
        self.count = 0  # how many of its events are indexed
        self.by_id: dict[str, Event] = {}


class HeldEvents:
    """Each live session copy's events by id (see the module docstring). A copy's
    index goes with the copy."""

    def __init__(self) -> None:
        self._indexes: dict[int, _Index] = {}
        # Loops in threads share the service; reentrant, as a copy collected
        # while a look-up holds it forgets its index in that thread; free in
        # a forked child, whose copies forget their indexes as they go.
        self._lock = forks.RLock()

    def find(self, session: Session, event_id: str) -> Event | None:
        """The first event of ``session`` with this id, or None."""
        events = session.events
        with self._lock:
            index = self._indexes.get(id(session))
            if (index is None or index.copy() is not session or index.events is not events
                    or len(events) < index.count):
                index = _Index(weakref.ref(session, self._forget(id(session))), events)
                self._indexes[id(session)] = index
            for event in events[index.count:]:
                index.by_id.setdefault(event.id, event)
            index.count = len(events)
            held = index.by_id.get(event_id)
        if held is None or any(e is held for e in events):
            return held
        # Not in the list any more (replaced in place): look as before.
        return next((e for e in events if e.id == event_id), None)

    def _forget(self, key: int) -> Callable[[weakref.ref[Session]], None]:
        def forget(copy: weakref.ref[Session]) -> None:
            with self._lock:
                index = self._indexes.get(key)
                if index is not None and index.copy is copy:
                    del self._indexes[key]
        return forget
