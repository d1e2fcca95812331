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

# Imported on first use (PEP 562): the clients use the protocol core alone and
# must not pay for Trio's server.
_EXPORTS = {
    "Connection": "streamd.rpc.server",
    "Method": "streamd.rpc.protocol",
    "MethodTable": "streamd.rpc.protocol",
    "Request": "streamd.rpc.server",
    "RequestId": "streamd.rpc.protocol",
    "Server": "streamd.rpc.server",
    "encode_error": "streamd.rpc.protocol",
    "encode_notification": "streamd.rpc.protocol",
    "encode_result": "streamd.rpc.protocol",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = sorted(_EXPORTS)
