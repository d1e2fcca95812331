"""The real daemon on pipes, for the Recall tests that spawn it.

Imported as a plain module (pytest puts ``tests/`` on ``sys.path``). Stderr
goes to a file so a chatty process can never block on a full pipe; a test
shows it when it fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio


class Proc:
    def __init__(self, process: trio.Process, stderr: Path) -> None:
        self.process = process
        self.stderr = stderr
        self.buf = bytearray()
        self.raw_out = bytearray()

    async def send(self, *frames: dict[str, Any]) -> None:
        await self.process.stdin.send_all(
            b"".join(json.dumps(f).encode() + b"\n" for f in frames)
        )

    async def recv(self) -> dict[str, Any] | None:
        while b"\n" not in self.buf:
            chunk = await self.process.stdout.receive_some(1 << 16)
            if not chunk:
                assert not self.buf, f"unterminated output: {bytes(self.buf)!r}"
                return None
            self.buf += chunk
            self.raw_out += chunk
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        return json.loads(line)

    async def drain(self) -> list[dict[str, Any]]:
        frames = []
        while (frame := await self.recv()) is not None:
            frames.append(frame)
        return frames

    async def close_stdin(self) -> None:
        await self.process.stdin.aclose()

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


@asynccontextmanager
async def spawn(tmp_path: Path, argv: list[str] | None = None):
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            argv or [sys.executable, "-m", "streamd"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=tmp_path,
        )
    proc = Proc(process, stderr_path)
    try:
        yield proc
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stdout.aclose()
        if process.stdin is not None:
            await process.stdin.aclose()


def req(id: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
