"""JSON-RPC 2.0 over newline-delimited frames.

* :mod:`~streamd.rpc.framing` - newline frames with a size limit, and the
  nesting scan that refuses a deep frame before anything recurses (sans-I/O).
* :mod:`~streamd.rpc.protocol` - bytes in, events out: a frame becomes a call,
  a notification, a cancel, a shutdown or an answered fault; and the encoders
  (sans-I/O, tested without an event loop).
* :mod:`~streamd.rpc.server` - the Trio layer: one reader, one writer, a task
  and a cancel scope per request, bounded work in flight, EOF and shutdown.
* :mod:`~streamd.rpc.stdio` - stdin and stdout as Trio streams that never make
  the shared descriptors non-blocking.
"""

from streamd.rpc.protocol import (
    Method,
    MethodTable,
    RequestId,
    encode_error,
    encode_notification,
    encode_result,
)
from streamd.rpc.server import Connection, Request, Server

__all__ = [
    "Connection",
    "Method",
    "MethodTable",
    "Request",
    "RequestId",
    "Server",
    "encode_error",
    "encode_notification",
    "encode_result",
]
