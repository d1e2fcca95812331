"""Clients of the streamd daemon, for the frameworks agents are written in.

The layers stack bottom-up:

* :mod:`~streamd.client.protocol` - the protocol core every client shares:
  requests and their typed answers, watches and their byte budget, leases and
  their loss, the end of a connection; bytes in, events out, no I/O.
* :mod:`~streamd.client.calls` - each ``eventlog/*`` method as a typed call
  (params Struct in, result type known), and the one method table
  (``EventLogMethods``) every client inherits.
* :mod:`~streamd.client.awaitable` - the async shell: what the asyncio and
  Trio clients share (answers to waiters, watches, abandoning, leases), each
  supplying only its I/O adapter.
* :mod:`~streamd.client.transport` - where the bytes go: the resident daemon's
  socket (started when none runs, by :mod:`streamd.resident.attach`), a
  ``streamd serve --socket``, or a ``streamd`` spawned on stdio.
* :mod:`~streamd.client.sync`, :mod:`~streamd.client.asyncio_client`,
  :mod:`~streamd.client.trio_client` - :class:`Client` (threads),
  :class:`AsyncClient` (asyncio) and :class:`TrioClient` (Trio): the same
  methods, each only moving bytes and waking waiters its own way.

Results are the wire Structs of :mod:`streamd.eventlog.model`; failures are
:class:`streamd.errors.RpcError` with the daemon's code.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # What the lazy names below resolve to, for type checkers (X as X:
    # an explicit re-export). Kept equal to _EXPORTS by a test.
    from streamd.client.asyncio_client import (
        AsyncClient as AsyncClient,
    )
    from streamd.client.asyncio_client import (
        AsyncLease as AsyncLease,
    )
    from streamd.client.asyncio_client import (
        AsyncWatch as AsyncWatch,
    )
    from streamd.client.protocol import (
        Call as Call,
    )
    from streamd.client.protocol import (
        ClientProtocol as ClientProtocol,
    )
    from streamd.client.sync import (
        Client as Client,
    )
    from streamd.client.sync import (
        Lease as Lease,
    )
    from streamd.client.sync import (
        Watch as Watch,
    )
    from streamd.client.trio_client import (
        TrioClient as TrioClient,
    )
    from streamd.client.trio_client import (
        TrioLease as TrioLease,
    )
    from streamd.client.trio_client import (
        TrioWatch as TrioWatch,
    )

# Imported on first use, so naming one client does not load the others. (Every
# client does load trio and numpy today, about 0.27 s cold: the protocol core
# reuses streamd.rpc's framing and envelope, and streamd.rpc's package imports
# its Trio server eagerly.)
_EXPORTS = {
    "AsyncClient": "streamd.client.asyncio_client",
    "AsyncLease": "streamd.client.asyncio_client",
    "AsyncWatch": "streamd.client.asyncio_client",
    "Call": "streamd.client.protocol",
    "Client": "streamd.client.sync",
    "ClientProtocol": "streamd.client.protocol",
    "Lease": "streamd.client.sync",
    "TrioClient": "streamd.client.trio_client",
    "TrioLease": "streamd.client.trio_client",
    "TrioWatch": "streamd.client.trio_client",
    "Watch": "streamd.client.sync",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AsyncClient",
    "AsyncLease",
    "AsyncWatch",
    "Call",
    "Client",
    "ClientProtocol",
    "Lease",
    "TrioClient",
    "TrioLease",
    "TrioWatch",
    "Watch",
]
