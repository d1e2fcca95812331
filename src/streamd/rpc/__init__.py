"""JSON-RPC 2.0 over newline-delimited frames.

* :mod:`~streamd.rpc.framing` - newline frames with a size limit, and the
  nesting scan that refuses a deep frame before anything recurses (sans-I/O).
* :mod:`~streamd.rpc.footprint` - what a request's params take once decoded,
  estimated from its frame before decoding (sans-I/O).
* :mod:`~streamd.rpc.protocol` - bytes in, events out: a frame becomes a call,
  a notification, a cancel, a shutdown or an answered fault; and the encoders
  (sans-I/O, tested without an event loop).
* :mod:`~streamd.rpc.methods` - what a service registers (``Method``, the
  method table) and what its handlers see (``Request``, ``Connection``).
* :mod:`~streamd.rpc.server` - the Trio layer: one reader, one writer, a task
  and a cancel scope per request, bounded work in flight, EOF and shutdown.
* :mod:`~streamd.rpc.outbox` - a connection's outgoing frames, in order, for
  its one writer task.
* :mod:`~streamd.rpc.inflight` - a connection's requests in flight, and the
  bound its reader waits on.
* :mod:`~streamd.rpc.queued` - a queued request (an append) and the reply its
  method calls once the work is done.
* :mod:`~streamd.rpc.bounds` - what one connection may hold, and why.
* :mod:`~streamd.rpc.held` - what all connections hold together, and who
  waits past the daemon-wide bound.
* :mod:`~streamd.rpc.accept` - accepting connections, short of descriptors too.
* :mod:`~streamd.rpc.limit` - how many connections a server serves at once,
  and the one error past that.
* :mod:`~streamd.rpc.stdio` - stdin and stdout as Trio streams that never make
  the shared descriptors non-blocking.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # What the lazy names below resolve to, for type checkers (X as X:
    # an explicit re-export). Kept equal to _EXPORTS by a test.
    from streamd.rpc.methods import (
        Connection as Connection,
    )
    from streamd.rpc.methods import (
        Method as Method,
    )
    from streamd.rpc.methods import (
        MethodTable as MethodTable,
    )
    from streamd.rpc.methods import (
        Request as Request,
    )
    from streamd.rpc.protocol import (
        RequestId as RequestId,
    )
    from streamd.rpc.protocol import (
        encode_error as encode_error,
    )
    from streamd.rpc.protocol import (
        encode_notification as encode_notification,
    )
    from streamd.rpc.protocol import (
        encode_result as encode_result,
    )
    from streamd.rpc.server import (
        Server as Server,
    )

# Imported on first use (PEP 562): the clients use the protocol core alone and
# must not pay for Trio's server (nor Trio, which methods needs).
_EXPORTS = {
    "Connection": "streamd.rpc.methods",
    "Method": "streamd.rpc.methods",
    "MethodTable": "streamd.rpc.methods",
    "Request": "streamd.rpc.methods",
    "RequestId": "streamd.rpc.protocol",
    "Server": "streamd.rpc.server",
    "encode_error": "streamd.rpc.protocol",
    "encode_notification": "streamd.rpc.protocol",
    "encode_result": "streamd.rpc.protocol",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = sorted(_EXPORTS)
