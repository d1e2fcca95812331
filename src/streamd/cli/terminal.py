"""What is written to a person at a terminal.

* The one line a person gets who starts a program's command at a terminal.
  Plain ``streamd`` and ``streamd attach`` are what a Recall core (or an
  agent) spawns: they read JSON-RPC frames on stdin and print nothing of their
  own, so a person who types them sees a silent, apparently hung command. When
  stdin is a terminal, which a spawning program never gives, they say on
  stderr, once, what they wait for and how to leave. stdout stays the
  protocol's.
* Stored text made safe to print (:func:`printable`): an event's content, an
  author, a record's title come from models, tools and other people, and a
  control character in them would drive the terminal (set its title, clear
  it, move the cursor, hide what follows, reorder text).

Standard library only, and cheap: ``streamd attach`` imports it on every spawn.
"""

from __future__ import annotations

import os
import sys

# C0 controls, DEL, the C1 controls (U+0080-U+009F, which some terminals take
# as ESC sequences) and the bidirectional overrides and isolates, each shown
# as its escape instead.
_UNPRINTABLE = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
                for c in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F),
                          *range(0x2066, 0x206A))}


_UNPRINTABLE_BUT_LINES = {c: e for c, e in _UNPRINTABLE.items() if c not in (0x09, 0x0A)}


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character that would drive a terminal (an escape,
    a carriage return, a bell; newlines and tabs too, unless ``lines``)
    written as its escape."""
    return text.translate(_UNPRINTABLE_BUT_LINES if lines else _UNPRINTABLE)


def waiting_line(command: str) -> str:
    where = "relays them to the resident daemon" if command == "attach" else "answers them"
    return (f"streamd{' attach' if command == 'attach' else ''}: waiting for JSON-RPC 2.0 "
            f"requests on stdin, one per line, and {where} on stdout; Ctrl-D ends it "
            "('streamd demo' shows it at work, 'streamd --help' lists the commands)")


def notice(command: str, fd: int = 0) -> None:
    """Say :func:`waiting_line` on stderr if ``fd`` (stdin) is a terminal."""
    try:
        on_terminal = os.isatty(fd)
    except OSError:
        return
    if on_terminal:
        sys.stderr.write(waiting_line(command) + "\n")
        sys.stderr.flush()
