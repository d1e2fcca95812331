"""The thin commands stay thin: ``streamd attach``, ``--help``, ``status`` and
``stop`` load the standard library only (never Trio, msgspec, numpy, APSW or the
daemon), because a Recall core pays for every import on every spawn.

Each command runs in a fresh interpreter through the package's ``__main__``,
as ``python -m streamd`` does, and reports what ``sys.modules`` holds at exit.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import as_main
from support.resident import World, make_world

pytestmark = pytest.mark.subprocess

REPORT = as_main.script("""heavy = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("trio", "msgspec", "numpy", "apsw", "outcome", "sniffio")
    or m.startswith(("streamd.daemon", "streamd.rpc", "streamd.recall", "streamd.eventlog",
                     "streamd.resident.server"))
)
sys.stderr.write("HEAVY=" + ",".join(heavy) + "\\n")""")


@pytest.fixture
def world():
    yield from make_world()


def heavy_modules(world: World, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", REPORT, *args], env=world.env,
                          input=b"", capture_output=True, timeout=60)
    lines = [ln for ln in done.stderr.decode().splitlines() if ln.startswith("HEAVY=")]
    assert lines, done.stderr
    return lines[-1].removeprefix("HEAVY=")


@pytest.mark.parametrize("args", [
    ("--help",), ("attach", "--help"), ("status",), ("status", "--json"), ("stop",),
])
def test_help_status_and_stop_import_nothing_heavy(world: World, args: tuple[str, ...]) -> None:
    assert heavy_modules(world, *args) == ""


def test_attach_to_a_running_daemon_imports_nothing_heavy(world: World) -> None:
    world.start_daemon()
    assert heavy_modules(world, "attach") == ""
    assert heavy_modules(world, "status") == ""


def test_attach_that_starts_the_daemon_imports_nothing_heavy(world: World) -> None:
    assert world.daemons() == []
    assert heavy_modules(world, "attach") == ""
    assert len(world.daemons()) == 1  # it did start one, in another process


def test_a_daemon_that_finds_the_lock_taken_exits_before_importing_the_daemon(
    world: World,
) -> None:
    # Clients racing to start the daemon each spawn one, and all but one lose
    # the lock. A loser that imported Trio, numpy and the daemon first (0.4 s
    # of CPU each) slowed the winner: 50 attaches at once on two cores, 11
    # failed their 5 s start timeout. The claim now comes before those imports.
    # (Its option parser reads --db with streamd.eventlog.dbtarget, which is
    # light: the standard library's URL parsing.)
    first = world.start_daemon()
    loaded = heavy_modules(world, "daemon").split(",")
    assert [m for m in loaded if m and not m.startswith("streamd.eventlog")] == []
    assert world.daemons() == [first.pid]
