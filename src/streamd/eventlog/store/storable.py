"""Text no database can store: a surrogate code point, refused before any SQL.

A Python ``str`` may hold a surrogate code point (U+D800 to U+DFFF) alone, as
``"\\ud800"``, or as two code points that only look like a pair: no UTF-8
encoder takes either, so no backend can store one or even send it as a
parameter. The drivers find out while binding, and raise
``UnicodeEncodeError``: a raw exception out of the storage boundary, or worse,
a fault a caller would read as the database being down.

The JSON-RPC decoder already refuses such an escape in any request's params
(-32602), so only in-process callers reach the store with one (the keyword
API of :class:`~streamd.eventlog.log.EventLog`, the in-process ADK session
service, the typed clients). They get the wire's answer, from here:

**Refused, never absent.** A lookup naming such a text (``sessions.get``,
a filter, a lease heartbeat) answers -32602 naming the field, as a write
does, on every backend; it does not answer as a key no row has, the way a
text holding U+0000 does on PostgreSQL. U+0000 is text that two of the three
databases store, so "absent" there is the answer the other two give; a
surrogate is text on none of them and is refused by the wire whatever the
method, so "refused" is the one answer every face of the log and every
backend can agree on, and it points the caller at its own bug (bytes decoded
with ``surrogateescape``, a string cut inside a pair) instead of at an empty
log.

:func:`checked_texts` wraps each shared operation
(:class:`~streamd.eventlog.store.operations.SqlOperations`) whose arguments
carry text, and appends are checked by :func:`~streamd.eventlog.store.rows.prepare`:
both look for the field (:func:`surrogate_path`) only once encoding has failed.
Looked for first, it cost every read some 9 us (a ``sessions.get``'s params
walked field by field), spent in vain on every request that came over the
wire, whose decoder has refused them already; a driver refuses the text while
binding it, before its statement runs, and the transaction it was in is
rolled back, so nothing is read or written either way.
The faces that encode params before the store sees them (the keyword API's
check, the clients' request encoding) name it the same way when their encoder
fails. Values only: no connection, no Trio.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

import msgspec

from streamd.errors import RpcError, invalid_params

__all__ = ["checked_texts", "refusal_of", "refused", "surrogate_path"]

_SURROGATE = re.compile("[\ud800-\udfff]")

_S = TypeVar("_S")
_P = ParamSpec("_P")
_T = TypeVar("_T")

# How a message names an operation's argument: its params Struct (``p``,
# ``policy``) is the request's params themselves, whose fields are named as
# the wire names them; a filter is the params' ``filter``.
_SPELLED = {"p": "", "policy": "", "flt": "filter"}


def surrogate_path(value: object, path: str = "") -> str | None:
    """Where in ``value`` a text holds a surrogate (``session``,
    ``filter.app``, ``sessions[1].user``, ``state.k``), or None where none
    does. Texts are strings, a Struct's fields, a list's items, a dict's keys
    and values; anything else (numbers, ``msgspec.Raw``) holds no text."""
    if isinstance(value, str):
        return (path or "value") if _SURROGATE.search(value) else None
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            found = surrogate_path(getattr(value, name), _joined(path, name))
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = surrogate_path(item, f"{path}[{i}]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and _SURROGATE.search(key):
                return _joined(path, ascii(key)) + " (a key)"
            found = surrogate_path(item, _joined(path, str(key)))
            if found is not None:
                return found
    return None


def refusal_of(exc: Exception, value: object) -> RpcError | None:
    """The refusal (:func:`refused`) for ``exc``, an encoding of ``value`` that
    failed, when a surrogate in ``value`` is why; None when something else is."""
    if not isinstance(exc, UnicodeEncodeError):
        return None
    path = surrogate_path(value)
    return None if path is None else refused(path)


def refused(path: str) -> RpcError:
    """The -32602 for a text at ``path`` that holds a surrogate."""
    return invalid_params(
        f"{path} is not text any database can store: it holds a lone surrogate"
        " (U+D800 to U+DFFF), which UTF-8 cannot encode; nothing was read or written"
    )


def checked_texts(
    op: Callable[Concatenate[_S, _P], _T],
) -> Callable[Concatenate[_S, _P], _T]:
    """``op``, refusing (:func:`refused`) an argument that holds a surrogate
    when a driver could not encode it; see the module docstring."""
    names = list(inspect.signature(op).parameters)[1:]  # after self

    @functools.wraps(op)
    def checked(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return op(self, *args, **kwargs)
        except UnicodeEncodeError:
            for name, value in (*zip(names, args, strict=False), *kwargs.items()):
                found = surrogate_path(value, _SPELLED.get(name, name))
                if found is not None:
                    raise refused(found) from None
            raise

    return checked


def _joined(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
