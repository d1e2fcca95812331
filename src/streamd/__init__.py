"""streamd: a Recall stream adapter and a durable event log, on Trio.

How the layers stack, bottom up:

* Sans-I/O core, no Trio: ``framing`` (newline frames with a size limit),
  ``gotime`` / ``tokenize`` / ``variants`` / ``relevance`` / ``records``
  (the reference's parsing and scoring rules), ``segment`` / ``index``
  (immutable posting segments and the generation views over them),
  ``builder`` (the per-line rules of a pass), ``search`` (ranking),
  ``render`` (wire text), ``settings`` / ``checkpoint`` (the settings block,
  ``cursor.json``), ``adapter`` (the Recall adapter's state and rules),
  ``eventlog.filters`` / ``eventlog.store``.
* Blocking helpers the core calls: ``catchup`` (reading appended lines),
  ``durable`` (the index in the workdir), ``parallel`` (worker processes for
  large passes).
* Trio layer, which only moves bytes and owns tasks: ``rpc`` (JSON-RPC
  connection: reader, writer, a cancel scope per request), ``recall_service``
  (Recall methods and the refresh scanner), ``eventlog.log`` /
  ``eventlog.service`` (the event log's async API and methods), ``daemon``
  (transports: stdio and a Unix socket).
* ``cli``: the ``streamd`` command.
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
