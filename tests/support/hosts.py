"""A streamd daemon process on a "host" of its own (its own home, state and
runtime directories), spoken to over stdio: for tests of two daemons sharing
one server-backed log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

__all__ = ["Host", "append_params"]

REPO = Path(__file__).resolve().parents[2]


class Host:
    """``python -m streamd --db URL`` on stdio, with a state directory (and
    so a default SQLite log, resident socket, ...) of its own: another host, as
    far as the log can tell."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = bytearray()
        self.next_id = 0
        self.notes: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, url: str, home: Path) -> Host:
        home.mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO / "src"),
            "HOME": str(home),
            "XDG_STATE_HOME": str(home / "state"),
            "XDG_RUNTIME_DIR": str(home),
        }
        env.pop("STREAMD_DB", None)
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "streamd", "--db", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        return cls(proc)

    async def frame(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while b"\n" not in self.buffer:
            chunk = await self.proc.stdout.receive_some(65536)
            if not chunk:
                raise EOFError("the daemon closed stdout")
            self.buffer += chunk
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer[:] = rest
        return json.loads(line)

    async def send(self, method: str, params: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        self.next_id += 1
        await self.proc.stdin.send_all(
            json.dumps(
                {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
            ).encode()
            + b"\n"
        )
        return self.next_id

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        want = await self.send(method, params)
        while True:
            frame = await self.frame()
            if frame.get("id") == want:
                return frame
            self.notes.append(frame)

    async def note(self, method: str) -> dict[str, Any]:
        while True:
            for i, frame in enumerate(self.notes):
                if frame.get("method") == method:
                    return self.notes.pop(i)
            self.notes.append(await self.frame())

    async def stop(self) -> int:
        assert self.proc.stdin is not None
        await self.proc.stdin.aclose()
        return await self.proc.wait()



def append_params(event_id: str, session: str = "s") -> dict[str, Any]:
    return {
        "app": "app",
        "user": "u",
        "session": session,
        "event": {"id": event_id, "author": "agent", "content": event_id},
    }
