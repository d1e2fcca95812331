"""SIGTERM and SIGINT, the way every streamd process ends on request."""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("streamd")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def cancel_on_signal(
    scope: trio.CancelScope, wind_down: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Cancel ``scope`` at the first SIGTERM or SIGINT, after ``wind_down``.

    The receiver stays open while ``wind_down`` runs, so a second signal
    cannot kill the process by the default handler before it has finished
    (a daemon closing its event log, say); it is ignored instead. Run it as a
    task of the nursery whose scope it cancels.
    """
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async for signum in signals:
            log.info("received %s, exiting", signal.Signals(signum).name)
            break
        if wind_down is not None:
            await wind_down()
    scope.cancel()
