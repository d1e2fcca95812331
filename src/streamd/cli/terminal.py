"""The one line a person gets who starts a program's command at a terminal.

Plain ``streamd`` and ``streamd attach`` are what a Recall core (or an agent)
spawns: they read JSON-RPC frames on stdin and print nothing of their own, so
a person who types them sees a silent, apparently hung command. When stdin is
a terminal, which a spawning program never gives, they say on stderr, once,
what they wait for and how to leave. stdout stays the protocol's.

Standard library only, and cheap: ``streamd attach`` imports it on every spawn.
"""

from __future__ import annotations

import os
import sys


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
