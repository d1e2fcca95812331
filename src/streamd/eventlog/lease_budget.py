"""How many leases may be held at once, and the error past that.

A held lease costs its log for as long as it is held: a row rewritten every
heartbeat (one store call a tick for up to
:data:`~streamd.eventlog.heartbeats.LEASES_A_CALL` leases of one interval, on
the writer every append waits for), a task in the log's nursery, and some
4 KiB of memory. Unbounded, one client could hold any number, and the
daemon's 512 connections could make it hold 512 times that. Two bounds:

* :data:`MAX_LEASES_PER_CONNECTION` on the wire, counted with the acquires
  the connection has in flight, so 256 sent at once cannot pass it;
* ``max_leases`` for the whole log (:data:`DEFAULT_MAX_LEASES`, the daemon's
  ``--max-leases``), counted with every acquire in flight (not the row a
  cancelled acquire may have left: it has no heartbeat and goes stale, and
  counted while its delete kept failing, such rows filled the bound in an
  outage and the log refused every acquire while it held none).

An acquire past either is refused before anything is written, with -32006
``budget_exceeded``, as a watch past its bound is (``data.reason``
``too_many_leases``, ``data.limit``, and ``data.scope``, ``connection`` or
``log``: what to release first). No I/O here, and no trio.
"""

from __future__ import annotations

from typing import Literal

from streamd.errors import BUDGET_EXCEEDED, TOO_MANY_LEASES, RpcError

__all__ = ["DEFAULT_MAX_LEASES", "MAX_LEASES_PER_CONNECTION", "too_many_leases"]

MAX_LEASES_PER_CONNECTION = 1000
"""One heartbeat call's worth (``LEASES_A_CALL``): a connection's leases of
one interval beat in one store call a tick. A client driving more sessions
than that at once opens more connections (the log's bound still holds)."""

DEFAULT_MAX_LEASES = 10_000
"""Some 40 MiB, and ten store calls a round at each interval in use. At the
1 s heartbeat of a 3 s window, 10,000 leases on one SQLite log kept every
heartbeat inside its window; at the 50 ms floor a log keeps some 3,000
fresh (``bench/lease_heartbeats.py``), so a daemon whose clients beat that
fast may want a lower bound."""

Scope = Literal["connection", "log"]


def too_many_leases(limit: int, scope: Scope) -> RpcError:
    """The refusal of an acquire past ``limit`` leases held by ``scope``."""
    held_by = "this connection holds" if scope == "connection" else "the event log holds"
    then = (
        "release one first, or take more on another connection"
        if scope == "connection"
        else "release some first (the daemon's --max-leases sets the bound)"
    )
    return RpcError(
        BUDGET_EXCEEDED,
        f"{held_by} {limit} leases (with the acquires in flight), the most it may: {then}",
        {"reason": TOO_MANY_LEASES, "limit": limit, "scope": scope},
    )
