"""When a store call may run on the event loop's own thread: the numbers.

Both faces of a SQLite log run short store calls inline, on the event loop
thread, when the connection is free (two wake-ups of a worker thread cost
more than such a call): the daemon's Trio layer
(:mod:`~streamd.eventlog.writer`, :mod:`~streamd.eventlog.connections`,
:mod:`~streamd.eventlog.requests`) and the in-process client
(:mod:`streamd.client.local`). One place for the limits keeps them alike.
"""

from __future__ import annotations

__all__ = [
    "BACKOFF_S",
    "MAX_INLINE_GROUP",
    "SLOW_READ_S",
    "SLOW_WRITE_S",
    "SMALL_READ_ROWS",
]

MAX_INLINE_GROUP = 16
"""The largest group of appends committed inline."""

SLOW_WRITE_S = 0.02
"""An inline commit slower than this sends the next ones to the worker for
:data:`BACKOFF_S`. An fsync is 0.1-0.3 ms on an idle SSD and a few ms on a
busy disk; past 20 ms the disk is struggling, and the event loop should not
wait on it."""

SLOW_READ_S = 0.005
"""An inline read slower than this (a cold page cache, a slow disk) keeps
the next reads on the worker for :data:`BACKOFF_S`: the event loop serves
every caller, and one read must not stall them twice."""

BACKOFF_S = 1.0

SMALL_READ_ROWS = 100
"""Reads that answer at most this many rows are small: a session's newest
events as an agent's turn loads them, a page of sessions. Measured on a
2-core VM, a 20-event read took ~100 us inline; the two thread wake-ups it
saves cost about as much again."""
