"""Boots: a client's record of each start and the session ids it attempted.

``boot.update`` of an unknown id is an error; a row whose attempted list
cannot be parsed reads back with ``attempted: null``
(:func:`~streamd.eventlog.store.rows.to_boot`), never dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamd.errors import INVALID_PARAMS, RpcError
from streamd.eventlog.model import Boot
from streamd.eventlog.store import rows
from streamd.eventlog.store.sql import Sql

__all__ = ["recent_boots", "record_boot", "update_boot"]


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
