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

Locks that are not ours come across the same way. SQLite's own (its
allocator's, its table of open files') are held by whichever thread is
inside SQLite at the fork, and a child whose first open of a log needed one
waited for ever: 21 of 300 children forked while an in-process log appended
on a loop in a thread. A :class:`Gate` is work a fork waits for: the fork
waits until no thread is inside it, and holds new entrants until it is done.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["FORK_WAIT", "Gate", "Lock", "RLock", "in_child"]

FORK_WAIT = 30.0
"""How long a fork waits for the threads inside a :class:`Gate`, in seconds:
the work there ends on its own (a SQLite call waits at most its busy
timeout for another process's lock), and a fork that waited longer forks
as before rather than never."""

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


class Gate:
    """Work a fork waits for (see the module docstring): :meth:`enter`
    and :meth:`leave` around each call into a library whose locks must not
    cross a fork (a few microseconds, against the hundreds a commit takes).
    A thread already inside enters again freely; a fork made from inside
    waits for no one (it could not wait for itself)."""

    def __init__(self) -> None:
        self._renew()
        os.register_at_fork(
            before=self._before_fork, after_in_parent=self._after_fork,
            after_in_child=self._renew,
        )

    def _renew(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._inside = 0  # threads inside
        self._forking = False  # a fork waits: hold new entrants
        self._depth = threading.local()

    def enter(self) -> None:
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            with self._cond:
                while self._forking:
                    self._cond.wait()
                self._inside += 1
        self._depth.n = depth + 1

    def leave(self) -> None:
        depth = self._depth.n = self._depth.n - 1
        if depth == 0:
            with self._cond:
                self._inside -= 1
                if self._forking and self._inside == 0:
                    self._cond.notify_all()

    def _before_fork(self) -> None:
        if getattr(self._depth, "n", 0):
            return
        with self._cond:
            self._forking = True
            self._cond.wait_for(lambda: self._inside == 0, FORK_WAIT)

    def _after_fork(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()


def _after_fork_in_child() -> None:
    for owner, reset in list(_resets.items()):
        reset(owner)


os.register_at_fork(after_in_child=_after_fork_in_child)
