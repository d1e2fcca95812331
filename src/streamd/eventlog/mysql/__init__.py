"""The event log on MySQL and MariaDB, through mysqlclient: everything that
imports ``MySQLdb``, which is an optional extra (``recall-streamd[mysql]``).

* :class:`MysqlStore` - the :class:`~streamd.eventlog.store.backend.Backend`;
* :class:`MysqlRunner` - a store on its own worker thread, the Runner;
* :class:`PolledChanges` - the :class:`~streamd.eventlog.store.backend.ChangeSource`
  (a poll of the newest seq that backs off while the log is idle);
* :class:`MysqlOptions`.

Inside: :mod:`.url` (the ``mysql://`` URL, read without the driver),
:mod:`.schema`, :mod:`.migrate`, :mod:`.sql`, :mod:`.store`, :mod:`.runner`, :mod:`.changes`.
Names are imported on first use (PEP 562), so the database target can read a
URL with no driver installed. Tested on MariaDB; MySQL 8 is written for
(no MariaDB-only syntax) but untested.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamd.eventlog.mysql.changes import PolledChanges as PolledChanges
    from streamd.eventlog.mysql.runner import MysqlRunner as MysqlRunner
    from streamd.eventlog.mysql.store import MysqlOptions as MysqlOptions
    from streamd.eventlog.mysql.store import MysqlStore as MysqlStore

__all__ = ["MysqlOptions", "MysqlRunner", "MysqlStore", "PolledChanges"]

_EXPORTS = {
    "PolledChanges": "streamd.eventlog.mysql.changes",
    "MysqlOptions": "streamd.eventlog.mysql.store",
    "MysqlRunner": "streamd.eventlog.mysql.runner",
    "MysqlStore": "streamd.eventlog.mysql.store",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
