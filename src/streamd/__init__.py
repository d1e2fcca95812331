"""streamd: a Recall stream adapter and a durable event log, on Trio.

How the packages stack, bottom up (none imports one above it):

* :mod:`streamd.errors` - the one exception that crosses the wire.
* :mod:`streamd.golang` - Go's quoting, time and Unicode rules, byte for byte.
* :mod:`streamd.rpc` - JSON-RPC: a sans-I/O protocol core (frames in, events
  out) under a Trio server (reader, writer, a cancel scope per request).
* :mod:`streamd.recall` - the Recall adapter: a sans-I/O core (records,
  index, query, adapter rules) and a Trio service that owns the scanner.
* :mod:`streamd.eventlog` - the durable event log: model, storage backends,
  the Trio API, its wire methods.
* :mod:`streamd.client` - clients of the daemon's socket (threads, asyncio,
  Trio) over a sans-I/O protocol; :mod:`streamd.adk` - a Google ADK session
  service on the asyncio client.
* :mod:`streamd.daemon` - transports (stdio, a Unix socket) and the method
  table a connection serves; :mod:`streamd.resident` - the per-user daemon
  and its stdlib-only clients; :mod:`streamd.conformance` - the transcript
  recorder and replayer.
* :mod:`streamd.cli` - the ``streamd`` command; :mod:`streamd.demo`,
  :mod:`streamd.logsink` and :mod:`streamd.signals` are its demo, its
  non-blocking logging and its way of ending on a signal.

The names below are what a Python caller needs to tell failures apart.
"""

from streamd.errors import (
    RpcError,
    is_closed,
    is_event_conflict,
    is_session_locked,
    is_session_not_found,
)

__all__ = [
    "RpcError",
    "is_closed",
    "is_event_conflict",
    "is_session_locked",
    "is_session_not_found",
]
__version__ = "0.1.0"

# The name to pip install: "streamd" on the package index is an unrelated
# project, so every install hint names this one (the command and the import
# package stay streamd).
DISTRIBUTION = "recall-streamd"
