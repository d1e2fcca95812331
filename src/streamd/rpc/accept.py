"""Accepting connections on a listening socket, through a shortage of descriptors.

* ``accept(2)`` failing because the system is short of something (``EMFILE``
  when connections hold every descriptor the process may open, ``ENFILE``,
  ``ENOMEM``, ``ENOBUFS``) is retried every :data:`RETRY_S`: the connections
  being served are untouched, and the waiting one is taken once one closes.
  Any other error ends the loop.
* Such failures are logged at most once in :data:`LOG_EVERY_S`, with their
  count: a client that leaks connections keeps the process short for as long
  as it holds them, and a line (or, through ``trio.serve_listeners``, a whole
  traceback) every 0.1 s must not rotate the log away.
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Awaitable, Callable

import trio

__all__ = ["LOG_EVERY_S", "RETRY_S", "accept_forever"]

log = logging.getLogger("streamd.rpc")

SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
RETRY_S = 0.1
LOG_EVERY_S = 10.0


async def accept_forever(
    listener: trio.SocketListener,
    handler: Callable[[trio.SocketStream], Awaitable[object]],
    nursery: trio.Nursery,
) -> None:
    """Accept connections on ``listener`` (closed at the end) and run
    ``handler(stream)`` for each in ``nursery``; the handler closes its stream."""
    failed = 0  # since the last log line about it
    logged_at = -math.inf
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in SHORT_OF:
                    raise
                failed += 1
                now = trio.current_time()
                if now - logged_at >= LOG_EVERY_S:
                    # The failures counted are those since the last line, which
                    # may be long ago: the period named is that one.
                    log.error(
                        "accept failed %d time%s in the last %.3g s, retried every %g s: %s",
                        failed,
                        "" if failed == 1 else "s",
                        LOG_EVERY_S if logged_at == -math.inf else now - logged_at,
                        RETRY_S,
                        exc,
                    )
                    failed, logged_at = 0, now
                await trio.sleep(RETRY_S)
                continue
            nursery.start_soon(handler, stream)
