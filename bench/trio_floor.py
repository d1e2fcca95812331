"""The floor under a request to the daemon: a bare Trio server on a Unix socket.

    python bench/trio_floor.py SOCKET

It answers every line it reads with one fixed JSON-RPC result, written at
once with a non-blocking ``os.write`` as the daemon writes the answer of a
connection's only request. No parsing, no task per request, no database:
what Trio and the kernel alone cost a round trip on this machine.
``daemon_request_cost.py`` measures it beside the daemon.
"""

from __future__ import annotations

import os
import sys

import trio

ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{}}\n'


async def answer(stream: trio.SocketStream) -> None:
    fd = stream.socket.fileno()
    pending = b""
    while data := await stream.receive_some(1 << 16):
        pending += data
        lines = pending.count(b"\n")
        pending = pending[pending.rfind(b"\n") + 1:]
        for _ in range(lines):
            os.write(fd, ANSWER)


async def main(path: str) -> None:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(128)
    await trio.serve_listeners(answer, [trio.SocketListener(sock)])


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
