"""The event-log source before its handshake, as the stream adapter (and the
reference) answer there: a probe is answered, everything else refused."""

from __future__ import annotations

from pathlib import Path

import trio
from support.recall import FAR, req

from .conftest import call, expand, search, served


async def test_before_the_handshake_health_is_unavailable_and_the_rest_refused(
        tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with served(tmp_path / "events.db") as (peer, _):
            probe = await call(peer, req(1, "recall/health", deadline=FAR))
            refused = [await call(peer, frame) for frame in (
                search(2, "zeta"), expand(3, "log:v2/e1"),
                req(4, "recall/refresh", deadline=FAR))]
    h = probe["result"]
    assert (h["status"], h["coverage"]) == ("unavailable", "unknown")
    assert h["diagnostics"] == {"reason": "unreachable"}
    for answer in refused:
        assert answer["error"]["code"] == -32000
        assert answer["error"]["message"] == "eventlog adapter has not completed a handshake"
