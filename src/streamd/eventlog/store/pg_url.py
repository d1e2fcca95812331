"""The old names of :mod:`streamd.eventlog.dbtarget`, for callers written
before it: each is that module's answer, so there is still one reading of a
database string."""

from __future__ import annotations

import os

from streamd.eventlog import dbtarget

__all__ = ["db_description", "db_flag_error", "is_postgres_url", "url_has_password"]


def is_postgres_url(value: object) -> bool:
    """Whether ``value`` names a PostgreSQL database (a URL or a libpq string)."""
    try:
        return isinstance(value, str) and dbtarget.classify(value).kind == "postgres"
    except dbtarget.DbTargetError:
        return False


def url_has_password(url: str) -> bool:
    """Whether it carries a credential; one that cannot be read is taken to."""
    try:
        return bool(dbtarget.classify(url).secret_keys)
    except dbtarget.DbTargetError:
        return True


def db_flag_error(value: object) -> str | None:
    return dbtarget.command_line_error(value) if isinstance(value, str) else None


def db_description(target: os.PathLike[str] | str) -> str:
    return dbtarget.describe(target)
