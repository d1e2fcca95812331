"""Boots: a client's record of each start and the session ids it attempted.

``boot.update`` of an unknown id is an error; a row whose attempted list
cannot be parsed reads back with ``attempted: null``
(:func:`~streamd.eventlog.store.rows.to_boot`), never dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import closing

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.eventlog.model import REPLY_BUDGET_BYTES, Boot, BootRecentResult, wire_size
from streamd.eventlog.store import rows
from streamd.eventlog.store.sql import Sql

__all__ = ["recent_boots", "recent_boots_page", "record_boot", "update_boot"]


def record_boot(db: Sql, at_us: int, attempted: Sequence[str]) -> int:
    with db.write(single=True):
        return db.insert_id(
            "INSERT INTO boots (boot_at, attempted) VALUES (?, ?)",
            (at_us, rows.json_text(list(attempted))),
        )


def update_boot(db: Sql, boot_id: int, attempted: Sequence[str]) -> None:
    with db.write(single=True):
        changed = db.run(
            "UPDATE boots SET attempted = ? WHERE id = ?",
            (rows.json_text(list(attempted)), boot_id),
        )
        if changed == 0:
            raise RpcError(INVALID_PARAMS, f"no boot with id {boot_id}", {"id": boot_id})


def recent_boots(db: Sql, since_us: int) -> list[Boot]:
    found = db.rows(
        "SELECT id, boot_at, attempted FROM boots WHERE boot_at >= ? ORDER BY boot_at, id",
        (since_us,),
    )
    return [rows.to_boot(row) for row in found]


def recent_boots_page(
    db: Sql, since_us: int, after: int | None, max_bytes: int = REPLY_BUDGET_BYTES
) -> BootRecentResult:
    """The boots at or after ``since_us`` that follow boot ``after`` in
    ``(boot_at, id)`` order (a range of ``boots_by_time``), up to
    ``max_bytes`` on the wire and always one. Boots are never removed, and
    each may name thousands of sessions: read whole, a client that restarted
    often made every answer over the frame limit, for good."""
    sql = "SELECT id, boot_at, attempted FROM boots WHERE boot_at >= ?"
    args: tuple[int, ...] = (since_us,)
    with db.snapshot():
        if after is not None:
            found = db.one("SELECT boot_at FROM boots WHERE id = ?", (after,))
            if found is None:
                raise RpcError(INVALID_PARAMS, f"no boot with id {after}", {"after": after})
            sql += " AND (boot_at, id) > (?, ?)"
            args += (found[0], after)
        page: list[Boot] = []
        used = 0
        with closing(db.scan(sql + " ORDER BY boot_at, id", args)) as rows_found:
            for row in rows_found:
                boot = rows.to_boot(row)
                size = wire_size(boot) + 1
                if page and used + size > max_bytes:
                    return BootRecentResult(boots=page, next=page[-1].id)
                used += size
                page.append(boot)
    return BootRecentResult(boots=page)

