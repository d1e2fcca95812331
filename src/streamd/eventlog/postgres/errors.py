"""What a PostgreSQL fault says to a client: the shared words of
:mod:`streamd.eventlog.store.outages` with the SQLSTATE as ``postgres_error``,
and what PostgreSQL text cannot store.

Which kind a driver error is needs the connection's state, so the decision stays
with :class:`~streamd.eventlog.postgres.store.PostgresStore`.
"""

from __future__ import annotations

from streamd.errors import RpcError
from streamd.eventlog.filters import POSTGRES
from streamd.eventlog.store import outages, rows, rules

__all__ = [
    "cannot_connect", "cannot_set_up", "connection_lost", "database_error", "refuse_nul",
    "unresponsive",
]


def unresponsive(where: str) -> RpcError:
    return outages.unresponsive(where, {"postgres_error": "unresponsive"})


def connection_lost(where: str, detail: str, state: str) -> RpcError:
    return outages.connection_lost(where, detail, {"postgres_error": state})


def cannot_connect(where: str, detail: str, state: str) -> RpcError:
    return outages.cannot_connect(where, detail, {"postgres_error": state})


def cannot_set_up(where: str, detail: str, state: str) -> RpcError:
    return outages.cannot_set_up(where, detail, {"postgres_error": state})


def database_error(detail: str, state: str) -> RpcError:
    return outages.database_error(detail, {"postgres_error": state})


def refuse_nul(item: rows.Prepared) -> None:
    """PostgreSQL text cannot hold U+0000 (SQLite's can): refused as the
    database would refuse it, before anything is sent. JSON texts escape it."""
    p, ev = item.params, item.params.event
    rules.check_held(POSTGRES, "event", [
        ("app", p.app), ("user", p.user), ("session", p.session), ("event.id", ev.id),
        ("event.author", ev.author), ("event.branch", ev.branch),
        ("event.invocation_id", ev.invocation_id),
    ])
