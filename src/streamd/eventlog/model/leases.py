"""Leases: acquire, release, loss, and what a lease looks like when listed.

The wire calls a lease a lock (``eventlog/lock.acquire``,
``eventlog/lock.release``, ``eventlog/lock_lost``, the ``lock`` field);
inside the code it is a lease. The ``Lock*`` names are aliases of the
``Lease*`` Structs for code that still spells them so.

No I/O here, and no trio.
"""

from __future__ import annotations

import datetime as _dt

from streamd.eventlog.model.base import (
    DEFAULT_STALE_AFTER_MS,
    MAX_DERIVED_HEARTBEAT_MS,
    MIN_HEARTBEAT_MS,
    MIN_STALE_AFTER_MS,
    Millis,
    NonEmpty,
    Params,
    Result,
)


class LeaseAcquireParams(Params, kw_only=True):
    """``stale_after_ms`` is the requester's promise: "if my heartbeat is older
    than this, consider me dead". It is stored with the lease and judges only
    this lease; it never shortens the window of a lease someone else holds.

    ``heartbeat_ms`` omitted is derived from the window (a third of it, at most
    :data:`MAX_DERIVED_HEARTBEAT_MS`), so a default can never make a valid
    window invalid; after decoding it always holds the interval in use. Only
    explicit values that break the floors are invalid: ``heartbeat_ms`` >=
    :data:`MIN_HEARTBEAT_MS`, ``stale_after_ms`` >= :data:`MIN_STALE_AFTER_MS`
    and at least twice the heartbeat (one missed beat must not make a healthy
    holder stale).
    """

    app: NonEmpty
    user: NonEmpty
    session: NonEmpty
    stale_after_ms: Millis = DEFAULT_STALE_AFTER_MS
    heartbeat_ms: Millis | None = None

    def __post_init__(self) -> None:
        if self.stale_after_ms < MIN_STALE_AFTER_MS:
            raise ValueError(
                f"stale_after_ms must be at least {MIN_STALE_AFTER_MS}, not {self.stale_after_ms}"
            )
        if self.heartbeat_ms is None:
            # >= MIN_HEARTBEAT_MS because the window is >= 3 * MIN_HEARTBEAT_MS.
            self.heartbeat_ms = min(self.stale_after_ms // 3, MAX_DERIVED_HEARTBEAT_MS)
            return
        if self.heartbeat_ms < MIN_HEARTBEAT_MS:
            raise ValueError(
                f"heartbeat_ms must be at least {MIN_HEARTBEAT_MS}, not {self.heartbeat_ms}"
            )
        if self.stale_after_ms < 2 * self.heartbeat_ms:
            # A lease that can go stale between two beats is stealable while its
            # holder is healthy; refuse it rather than hand out a lease that lies.
            raise ValueError(
                f"stale_after_ms ({self.stale_after_ms}) must be at least twice"
                f" heartbeat_ms ({self.heartbeat_ms})"
            )

    @property
    def interval_ms(self) -> int:
        """The heartbeat interval in use (explicit or derived)."""
        assert self.heartbeat_ms is not None
        return self.heartbeat_ms


class LeaseAcquireResult(Result):
    lock: str
    holder: str


class LeaseReleaseParams(Params):
    lock: NonEmpty


class LeaseLostNotification(Result):
    lock: str
    holder: str


class LeaseInfo(Result, kw_only=True):
    """A lease row as stored (for ``streamd log locks`` and diagnostics)."""

    app: str
    user: str
    session: str
    holder: str
    acquired_at: _dt.datetime | None
    heartbeat_at: _dt.datetime | None
    """Null only for a damaged row (as ``acquired_at``)."""
    stale_after_ms: int
    """The window the holder declared: the lease is stale once its heartbeat is
    older than this."""


# The wire's word, for callers that still use it.
LockAcquireParams = LeaseAcquireParams
LockAcquireResult = LeaseAcquireResult
LockReleaseParams = LeaseReleaseParams
LockLostNotification = LeaseLostNotification
