"""One pause of the cyclic garbage collector, shared by every thread.

A session's load makes tens of thousands of small objects, none of them
garbage, and every collection their allocation triggers walks them again (and,
in a process that has imported ADK, some 90,000 objects besides): the clients
decode a large answer, and the ADK service builds a session's events, with the
collector paused. Nothing awaits inside a pause, so it ends with the work.
Measured before the pauses, a cold 2,000-event load spent about a third of its
time in the collector. (Filing a load's objects with the oldest at once,
through ``gc.freeze``/``gc.unfreeze``, was tried and dropped: it moves every
object of the user's process, and another thread's freeze could be undone
between the calls.)

The collector's switch is the process's, and the clients run on several
threads (ADK runs each turn on an event loop of its own). A pause that
remembered ``gc.isenabled()`` for itself could be undone by another's: one
thread pauses, a second sees the collector off and remembers that, the first
resumes it, the second pauses it again and, remembering it off, never resumes
it; the collector stayed off for good. So the pauses are counted under one
lock: the first one turns the collector off (if it was on), the last one to end
turns it back on.

A child forked while another thread was in a pause has neither that thread
nor its end of the pause: its collector would stay off for good, and the
lock, if held at the fork, would never come free. So a child starts with no
pause, its collector as it was before the first (see :mod:`streamd.forks`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

__all__ = ["paused"]

_lock = threading.Lock()
_depth = 0
_resume = False  # whether the last pause to end turns the collector back on


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector off for the block (see the module docstring). A
    ``gc.disable()`` made meanwhile by other code is undone when the last
    pause ends, as it would be by any pause."""
    global _depth, _resume
    counted = False
    try:
        with _lock:
            if _depth == 0:
                _resume = gc.isenabled()
                gc.disable()
            _depth, counted = _depth + 1, True
        yield
    finally:
        if counted:
            with _lock:
                _depth -= 1
                if _depth == 0 and _resume:
                    gc.enable()


def _forget_parents_pauses() -> None:
    global _lock, _depth
    _lock = threading.Lock()
    if _depth:
        _depth = 0
        if _resume:
            gc.enable()


os.register_at_fork(after_in_child=_forget_parents_pauses)
