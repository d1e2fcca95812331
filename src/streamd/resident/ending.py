"""Whether the daemon's close ends a relayed session cleanly, told from frames.

``streamd attach`` relays bytes without parsing them, but when the daemon
closes the connection it must tell a session the peer ended (exit 0, nothing
on stderr) from a daemon that went away (one line, exit 1). The daemon closes
a session after answering ``recall/shutdown``, and that answer is the
connection's last frame. So the close is clean exactly when the last frame
relayed to stdout answers a ``recall/shutdown`` request relayed from stdin:
the method name quoted in a search, an event or a partial frame is not one.

Sans-I/O and standard library only. Only lines that contain the method name
and are short enough to be a shutdown request are decoded, so the relay
still never parses the frames it carries.
"""

from __future__ import annotations

import json

METHOD = "recall/shutdown"
_MARK = METHOD.encode()
# A shutdown request is a few dozen bytes; a line longer than this is some
# other frame that mentions the name (an event's content, a query).
MAX_SHUTDOWN_LINE = 1 << 16
# Nothing was sent with this id: JSON has no value that decodes to it.
_NO_ID = object()


class SessionEnd:
    """Fed what goes to the daemon (:meth:`sent`, in order, from one thread)
    and asked, at the close, about the last frame that came back."""

    def __init__(self) -> None:
        self._line = bytearray()  # the current line while it may be a shutdown
        self._long = False  # the current line is past MAX_SHUTDOWN_LINE
        self._ids: list[object] = []  # the ids of the shutdown requests sent

    def sent(self, data: bytes) -> None:
        start = 0
        while True:
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            if not self._long:
                if len(self._line) + len(piece) > MAX_SHUTDOWN_LINE:
                    self._long = True
                    self._line.clear()
                else:
                    self._line += piece
            if end < 0:
                return
            if not self._long and _MARK in self._line:
                self._note(bytes(self._line))
            self._line.clear()
            self._long = False
            start = end + 1

    def _note(self, line: bytes) -> None:
        try:
            frame = json.loads(line)
        except ValueError:
            return
        if isinstance(frame, dict) and frame.get("method") == METHOD:
            self._ids.append(frame.get("id"))

    @property
    def shutdown_sent(self) -> bool:
        return bool(self._ids)

    def answered(self, last_frame: bytes | bytearray | memoryview) -> bool:
        """Whether ``last_frame`` (one line, no newline) answers a shutdown
        request that was sent."""
        if not self._ids or len(last_frame) > MAX_SHUTDOWN_LINE:
            return False
        try:
            frame = json.loads(bytes(last_frame))
        except ValueError:
            return False
        if not isinstance(frame, dict) or "method" in frame:
            return False
        if "result" not in frame and "error" not in frame:
            return False
        answered = frame.get("id", _NO_ID)
        return any(answered == sent and type(answered) is type(sent) for sent in self._ids)


def last_line(written: bytes | bytearray) -> memoryview:
    """The last complete line of ``written`` (which ends with a newline), without it."""
    end = len(written) - 1
    start = written.rfind(b"\n", 0, end) + 1
    return memoryview(written)[start:end]
