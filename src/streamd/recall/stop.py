"""How an answer computed on a worker thread learns that its request is over.

A search or an expand is sans-I/O work that can take long on hostile
params: a query of a hundred thousand terms, or of one common term repeated
a hundred thousand times, costs seconds to minutes of scoring at a million
records, and a ``context`` expand whose 15-minute window holds a hundred
thousand records seconds of parsing. The Trio layer runs that work on a
thread (the event loop keeps serving every other request meanwhile) and,
when the request is cancelled or its deadline passes, answers at once and
sets its :class:`Stop`; the work looks at it between steps (per query term,
per record read back, and in the compiled core between windows of records
and between query positions) and raises :class:`Stopped`, so a cancelled
request does not go on burning a core for nobody.

Rules: a Stop is set once and never cleared; looking at it costs an
attribute read (Python) or one relaxed atomic load (the compiled core,
which reads the one-byte ``flag`` with the GIL released). Sans-I/O: nothing
here knows of threads or Trio.
"""

from __future__ import annotations

import numpy as np


class Stopped(Exception):
    """The work's request is over: nobody wants its result any more."""


class Stop:
    __slots__ = ("_set", "flag")

    def __init__(self) -> None:
        self._set = False
        # What the compiled core reads (``rank_search``'s ``stop``).
        self.flag = np.zeros(1, dtype=np.uint8)

    def set(self) -> None:
        self._set = True
        self.flag[0] = 1

    def is_set(self) -> bool:
        return self._set

    def check(self) -> None:
        """Raise :class:`Stopped` once the stop is set."""
        if self._set:
            raise Stopped


def check(stop: Stop | None) -> None:
    """``stop.check()``, for work that may run without a stop (the CLI's)."""
    if stop is not None and stop.is_set():
        raise Stopped
