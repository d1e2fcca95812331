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
    cross a fork. A thread already inside enters again freely; a fork made
    from inside waits for no one (it could not wait for itself).

    A pass while no fork waits takes no lock, as it runs around every call
    of an in-process log: a condition's lock taken at each enter and each
    leave cost a ``latest_seq`` on the event loop 4 of its 33 us (alternated
    rounds). A thread marks itself in ``_inside`` (one store: atomic under
    the GIL), then reads ``_forking``; a fork sets ``_forking``, then waits
    for ``_inside`` to empty. Whichever of the two comes second sees the
    other: the thread steps out again and waits for the fork to end, or the
    fork waits for the thread to leave.
    """

    def __init__(self) -> None:
        self._inside: dict[int, int] = {}
        """The threads inside, by ident: how deep (a thread's own key is
        written by that thread alone, or by a fork's child)."""
        self._forking = False  # a fork waits: entrants step out until it is done
        self._cond = threading.Condition(threading.Lock())  # a fork's waits and its entrants'
        os.register_at_fork(
            before=self._before_fork, after_in_parent=self._after_fork,
            after_in_child=self._after_fork_in_child,
        )

    def enter(self) -> None:
        me = threading.get_ident()
        depth = self._inside.get(me, 0)
        self._inside[me] = depth + 1
        if self._forking and depth == 0:
            self._wait_for_fork(me)

    def leave(self) -> None:
        me = threading.get_ident()
        depth = self._inside[me] - 1
        if depth:
            self._inside[me] = depth
            return
        del self._inside[me]
        if self._forking:
            with self._cond:
                self._cond.notify_all()

    def _wait_for_fork(self, me: int) -> None:
        """Out of the way of the fork that waits, and in again once it is done."""
        with self._cond:
            while self._forking:
                del self._inside[me]
                self._cond.notify_all()
                while self._forking:
                    self._cond.wait()
                # Under the lock, where no fork can begin before this is seen.
                self._inside[me] = 1

    def _before_fork(self) -> None:
        if threading.get_ident() in self._inside:
            return
        with self._cond:
            self._forking = True
            self._cond.wait_for(lambda: not self._inside, FORK_WAIT)

    def _after_fork(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    def _after_fork_in_child(self) -> None:
        # Only the thread that forked came across; one that forked from
        # inside leaves as usual.
        me = threading.get_ident()
        self._inside = {me: self._inside[me]} if me in self._inside else {}
        self._forking = False
        self._cond = threading.Condition(threading.Lock())


def _after_fork_in_child() -> None:
    for owner, reset in list(_resets.items()):
        reset(owner)


os.register_at_fork(after_in_child=_after_fork_in_child)
