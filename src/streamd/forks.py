"""What a child forked from this process starts with: our locks free.

A fork copies the one thread that forked, and every lock as it was at that
moment. A lock another thread held then (a blocking client's reader taking
an answer, a session load on a turn's loop, an event-loop thread choosing its
client) stays held in the child by a thread that does not exist there, and
the child's first use of what it guards waits for ever: a pre-fork server
that forks while an agent's turn runs in a thread hangs its worker. So our
locks are :class:`Lock` and :class:`RLock`, which a child finds free, and an
object whose state was its threads' (calls in flight, clients of the parent's
event loops) registers with :func:`in_child` how a child sets that aside.

The parent's threads were between two steps of Python when it forked, so
what a lock guarded is whole in the child, if perhaps half way through a
change of several steps: what guards a connection of the parent's refuses
the child anyway (``forked``), and the rest holds values that stay true.

A reset runs in the child, in the thread that forked, before ``os.fork``
returns there, and in no order among the others: it only replaces values. It
takes no lock, runs no finalizer (dropping the last reference to a client
would), starts no thread and makes no call into SQLite.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Lock", "RLock", "in_child"]

_T = TypeVar("_T")

# Each owner's reset, while the owner lives (weakly: registering keeps
# nothing alive).
_resets: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def in_child(owner: _T, reset: Callable[[_T], None]) -> None:
    """Call ``reset(owner)`` in every child forked while ``owner`` lives (see
    the module docstring for what a reset may do)."""
    _resets[owner] = reset


class Lock:
    """A ``threading.Lock`` that a forked child finds free, whoever held it
    when the parent forked."""

    __slots__ = ("__weakref__", "_lock")

    _new: Callable[[], Any] = staticmethod(threading.Lock)

    def __init__(self) -> None:
        self._lock = self._new()
        in_child(self, Lock._renew)

    def _renew(self) -> None:
        self._lock = self._new()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return bool(self._lock.acquire(blocking, timeout))

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return bool(self._lock.acquire())

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class RLock(Lock):
    """A ``threading.RLock`` that a forked child finds free."""

    __slots__ = ()

    _new = staticmethod(threading.RLock)


def _after_fork_in_child() -> None:
    for owner, reset in list(_resets.items()):
        reset(owner)


os.register_at_fork(after_in_child=_after_fork_in_child)
