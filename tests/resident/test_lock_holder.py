"""Who holds the daemon's lock, where ``/proc`` is another pid namespace's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_HOLD_AND_ASK = """
import fcntl, os, sys
from streamd.resident import lock, paths
directory = sys.argv[1]
fd = os.open(paths.lock_path(directory), os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()}\\n".encode())
print(os.getpid(), lock.lock_holder(directory),
      lock.lock_holder(directory, confirmed=True))
"""


def test_the_holder_is_named_in_a_pid_namespace_whose_proc_is_the_parents(
    tmp_path: Path,
) -> None:
    # A sandbox that made a pid namespace without mounting its own /proc (as
    # `unshare -p` does without --mount-proc): /proc/locks names the holder by
    # its pid in the parent namespace, the lock file by its pid in its own.
    # Every client there found no daemon holding the lock, and so none to
    # connect to, while one served.
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare")
    probe = subprocess.run([unshare, "-Urpf", "--kill-child", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no pid namespace for this user: {probe.stderr.decode().strip()}")
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run(
        [unshare, "-Urpf", "--kill-child", sys.executable, "-c", _HOLD_AND_ASK, str(tmp_path)],
        capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    pid, holder, confirmed = done.stdout.split()
    assert pid == "1"  # the namespace's first process
    assert holder == pid
    # No lock table of this namespace to confirm it by: a caller about to send
    # the holder a signal (stop, with the socket file gone) is told of none,
    # as a pid left in the file by a killed daemon may now be a stranger's.
    assert confirmed == "None"
