"""The expectation a batch's appends of one session carry after the first.

A writer that pipelines a session's events sends them as one ordered batch
and gives ``expected_seq`` to the first only: the others were computed from
the session as the batch's earlier appends leave it. Within one transaction
nobody else writes, so a new append always leaves the session right after
itself; the one way the writer's view and the log part is an append
answered as a duplicate: the event was stored before, and where it was
stored is where the session is, not where the writer put it.

So, per session, a group keeps the seq its appends were computed from (the
"view"). An append without an ``expected_seq`` of its own, after one that had
(or inherited) one, inherits the view, and is refused ``stale_session`` like
any append when the session's last seq is elsewhere. After an append:

* new, stored at ``seq``: the view is ``seq``;
* a duplicate at or before the view: the view had it, and stays;
* a duplicate after the view: the view moves to it only when it is the
  session's next event after the view (a retry whose answer was lost);
  otherwise the view stays where it was, behind events the writer never saw,
  and the next new append of the session is refused as stale.

"Next" is read from the events the session still holds, and retention
removes a session's events from the oldest (``max_events``, an idle
session's drop): once it has removed the event at the view, it may have
removed events after it that the writer never saw, and the duplicate would
pass for the next. So the duplicate is the next only while the event at the
view is held (at view 0, the session's first event: nothing tells there); a
retry whose session was cut past its view is refused as stale, as the ADK
session service's own check (``SessionLoader.follows``) refuses it.

A duplicate itself is answered as such whatever it expected, as a lone
append's is.

A view set by a new append of this transaction is the session's last seq
for certain (nobody else writes meanwhile, and a duplicate never moves it):
an append inheriting it is not checked again. Checked, each later append of
a pipelined batch read the session's row once more, on SQLite a statement
per append: a group of 100 appends of one session ran 305 statements where
the same group without ``expected_seq`` ran 205, and a group of 1000 took
a tenth longer (40.8 ms against 36.6, the median of six processes' best of
40 batches; with this, 35.1, as without the chain).

Backends apply this with :class:`Chain`; ``from_seq`` is the one read it
may need: the session's first two seqs from a given one on.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from streamd.eventlog.model import AppendResult
from streamd.eventlog.store import rows

__all__ = ["Chain", "FromSeq", "SessionKey", "next_after"]

SessionKey = tuple[str, str, str]
FromSeq = Callable[[SessionKey, int], list[int]]
"""The session's first two event seqs at or after the given one, in order
(fewer when it holds fewer), as the writing transaction sees them."""


def next_after(view: int, held: list[int]) -> int | None:
    """The seq of the session's next event after its event at ``view``, from
    ``held`` (what :data:`FromSeq` read at ``view``); None when there is none
    or the event at ``view`` is gone (see the module docstring)."""
    if view == 0:
        return held[0] if held else None
    return held[1] if len(held) == 2 and held[0] == view else None


class Chain:
    """The views of one group's sessions (see the module docstring)."""

    __slots__ = ("_at_head", "_views")

    def __init__(self) -> None:
        self._views: dict[SessionKey, int] = {}
        self._at_head: set[SessionKey] = set()
        """Sessions whose view a new append of this group set: their last seq."""

    def expecting(self, item: rows.Prepared) -> rows.Prepared:
        """``item`` with the expectation it carries or inherits (none to
        check when its session is at the view for certain)."""
        p = item.params
        if p.expected_seq is not None or not self._views:
            return item
        key = (p.app, p.user, p.session)
        view = self._views.get(key)
        if view is None or key in self._at_head:
            return item
        return msgspec.structs.replace(
            item, params=msgspec.structs.replace(p, expected_seq=view))

    def took(self, item: rows.Prepared, result: AppendResult, from_seq: FromSeq) -> None:
        """Move the view of ``item``'s session past its append (``item`` as
        :meth:`expecting` gave it)."""
        p = item.params
        key = (p.app, p.user, p.session)
        view = p.expected_seq if p.expected_seq is not None else self._views.get(key)
        if view is None:
            return
        if not result.duplicate:
            self._views[key] = result.seq
            self._at_head.add(key)
            return
        # A duplicate that is the session's next event after the view (a retry
        # whose answer was lost) moves the view to itself; the session may
        # hold events after it, so the view is checked again.
        if result.seq > view and next_after(view, from_seq(key, view)) == result.seq:
            self._views[key] = result.seq
            self._at_head.discard(key)
        elif self._views.get(key) != view:  # an expectation of its own, kept
            self._views[key] = view
            self._at_head.discard(key)
