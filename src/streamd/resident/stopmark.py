"""A stop outlives the daemon it stopped, for the daemons spawned before it.

Clients racing to start the resident daemon each spawn one; the flock lets
one serve, and the others exit when they find it taken. But a spawned
daemon reaches the lock only after its interpreter has started and its
imports are done: a second or two when a dozen start at once on two cores.
If ``streamd stop`` runs in that time, the daemon it stops releases the lock
and a latecomer takes it, so a daemon serves again seconds after ``stop``
said it had stopped (and a restore that relies on no daemon running reads a
file a daemon has open).

So a stop leaves a mark: the daemon asked to stop (``streamd/stop``, SIGTERM,
SIGINT; not the idle timer or a retirement, which ask for no daemon-free
time) writes the moment of the request into ``streamd.stopped`` in its socket
directory before it lets go of the lock. A daemon a client spawned is told
when (:data:`SPAWNED_AT_ENV`), and once it holds the lock it declines to
serve if a stop was asked after that moment: it was started for a client
that asked before the stop. A daemon started by hand is told nothing and
always serves.

Times are ``CLOCK_BOOTTIME`` seconds: one clock for every process of the
machine, never set back, counting suspended time. That clock starts again at
a reboot, so the mark names its boot (the kernel's boot id), and a mark of
another boot counts as none.

Standard library only: ``streamd attach`` imports it on every spawn.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from streamd.resident import paths

__all__ = ["SPAWNED_AT_ENV", "StoppedSinceSpawn", "mark_stopped", "now", "stopped_since"]

SPAWNED_AT_ENV = "STREAMD_SPAWNED_AT"
MARK_NAME = "streamd.stopped"


class StoppedSinceSpawn(Exception):
    """This daemon was spawned before a stop of its directory's daemon."""

    def __init__(self) -> None:
        super().__init__("not starting: this directory's daemon was stopped (streamd stop "
                         "or a signal) after this one was spawned; start it again if wanted")


def now() -> float:
    """The machine's boot-time clock, in seconds (see the module docstring)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def mark_path(directory: str) -> str:
    return os.path.join(directory, MARK_NAME)


def boot_id() -> str:
    """This boot's id (Linux); empty where there is none to read."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return ""


def mark_stopped(directory: str, at: float | None = None) -> None:
    """Record that a stop was asked ``at`` (now by default). Written to a
    temporary name and renamed, so a reader sees a whole mark or the one
    before it. Raises OSError."""
    text = f"{boot_id()} {now() if at is None else at:.6f}\n".encode()
    target = mark_path(directory)
    partial = f"{target}.{os.getpid()}.tmp"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text)
    finally:
        os.close(fd)
    try:
        os.replace(partial, target)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise


def spawned_at(env: Mapping[str, str]) -> float | None:
    """When a client spawned this process, if one did and said so."""
    try:
        return float(env.get(SPAWNED_AT_ENV, ""))
    except ValueError:
        return None


def stopped_since(directory: str, env: Mapping[str, str]) -> bool:
    """Whether this process, spawned by a client (``env`` says when), was
    spawned before the last stop asked of ``directory``'s daemon. A mark that
    cannot be read or parsed counts as none: it only ever holds back a
    latecomer, and must never keep a daemon from starting for good."""
    spawned = spawned_at(env)
    if spawned is None:
        return False
    try:
        # Not a plain open: a FIFO in the mark's place would block it.
        with os.fdopen(paths.open_regular(mark_path(directory), os.O_RDONLY), "rb") as f:
            boot, when = f.read(128).decode("ascii").split()
        stopped = float(when)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return boot == boot_id() and stopped > spawned

