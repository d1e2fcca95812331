"""Starting a resident daemon for a client: its paths, its startup pipe.

Standard library only (``streamd attach`` imports it on every spawn).

* **Paths mean what they meant to the caller.** The daemon runs in ``/`` (it
  must not pin the caller's directory), so every path a client hands it is
  made absolute against the client's working directory first: the values of
  ``--db``, ``--log-file`` and ``--runtime-dir`` among its arguments (in any
  spelling argparse takes: ``--db=X``, ``--d X``), and ``STREAMD_DB`` and
  ``STREAMD_RUNTIME_DIR`` in its environment, and a relative ``HOME`` (the
  default directories hang off it). ``~`` is expanded first, as the daemon
  would; a PostgreSQL URL and ``--log-file -`` are not paths.
* **What the client asks of a running daemon** (:func:`asks`): its working
  directory, against which the daemon resolves a relative ``location`` or
  ``workdir`` in ``recall/initialize``, and the event log it was told to use
  (``--db``, else ``STREAMD_DB``), which a daemon serving another refuses.
* **A daemon that cannot start says why.** Its stderr is a pipe to the
  client until it serves (:data:`STARTUP_PIPE_ENV` tells it so); then it
  points stderr at /dev/null (:func:`detach_startup_pipe`) and the pipe
  reaches end of file with the daemon alive. A daemon that exits first
  leaves what it said in the pipe: its one-line refusal, argparse's usage
  error, or a traceback.
"""

from __future__ import annotations

import os
import re
import select
import sys
from collections.abc import Mapping, Sequence

from streamd.resident import paths, stopmark

# Set in the environment of a daemon whose stderr is a client's startup pipe.
STARTUP_PIPE_ENV = "STREAMD_STARTUP_PIPE"
# What a daemon's early words may take; more is cut (a traceback's last line,
# the one that says what failed, is kept).
MAX_SAID = 1 << 16
# The daemon's options that take a path, and every other that takes a value
# (so that ``--d`` can be told to abbreviate ``--db``, as argparse does).
PATH_OPTIONS = ("--db", "--log-file", "--runtime-dir")
VALUE_OPTIONS = (
    *PATH_OPTIONS, "--watch-interval-ms", "--watch-buffer-bytes", "--watch-total-bytes",
    "--synchronous", "--max-leases", "--max-held-bytes",
    "--idle-exit", "--source-idle", "--max-sources", "--max-connections", "--announce-version",
)
FLAG_OPTIONS = ("--verbose", "-v", "--help", "-h")


_SERVER = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://|[a-z_]+\s*=")


def _is_url(value: str) -> bool:
    """A database server's address, not a path: a ``scheme://`` URL
    (``postgresql://``, ``mysql://``...) or a libpq ``keyword=value`` string
    (a file whose name holds ``=`` is written ``./NAME``, as the database
    target asks)."""
    return _SERVER.match(value) is not None


def absolute(value: str, cwd: str) -> str:
    """``value`` as a path the daemon reads the same from ``/``."""
    if not value or _is_url(value):
        return value
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(value)))


def _option(name: str) -> str | None:
    """The daemon option ``name`` spells (itself, or an unambiguous prefix)."""
    if name in VALUE_OPTIONS or name in FLAG_OPTIONS:
        return name
    if not name.startswith("--") or len(name) < 3:
        return None
    matches = [opt for opt in (*VALUE_OPTIONS, *FLAG_OPTIONS) if opt.startswith(name)]
    return matches[0] if len(matches) == 1 else None


def absolute_args(args: Sequence[str], cwd: str) -> list[str]:
    """The daemon's arguments with every path value made absolute; anything
    else (a mistake included, which the daemon then reports) unchanged."""
    out: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            out += [arg, *rest]
            break
        name, eq, value = arg.partition("=")
        option = _option(name)
        if option in PATH_OPTIONS:
            if eq:
                arg = f"{name}={_path_value(option, value, cwd)}"
            elif rest:
                out.append(arg)
                arg = _path_value(option, rest.pop(0), cwd)
        elif option in VALUE_OPTIONS and not eq and rest:
            out.append(arg)
            arg = rest.pop(0)
        out.append(arg)
    return out


def _path_value(option: str, value: str, cwd: str) -> str:
    if option == "--log-file" and value == "-":
        return value
    return absolute(value, cwd)


def _given(args: Sequence[str], wanted: str) -> str | None:
    """The last value of option ``wanted`` among ``args`` (argparse's rule)."""
    found = None
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        option = _option(name)
        if option in VALUE_OPTIONS and not eq:
            if not rest:
                break
            value = rest.pop(0)
        if option == wanted:
            found = value
    return found


def runtime_dir_of(args: Sequence[str], cwd: str | None) -> str | None:
    """The socket directory a daemon started with ``args`` serves: its last
    ``--runtime-dir``, absolute as :func:`absolute_args` hands it over; None
    when they name none. A client must look for the daemon there, or it
    starts one it never finds."""
    value = _given(args, "--runtime-dir")
    return absolute(value, cwd if cwd is not None else "/") if value else None


def absolute_env(env: Mapping[str, str], cwd: str) -> dict[str, str]:
    """The daemon's environment, its path variables made absolute."""
    out = dict(env)
    for name in ("STREAMD_DB", "STREAMD_RUNTIME_DIR"):
        if out.get(name):
            out[name] = absolute(out[name], cwd)
    # The default runtime directory, log and event log all hang off HOME: a
    # relative one would name them under "/" for the daemon and under the
    # caller's directory for the client, which then never finds it.
    home = out.get("HOME")
    if home and not os.path.isabs(home):
        out["HOME"] = os.path.normpath(os.path.join(cwd, home))
    return out


def asks(args: Sequence[str], env: Mapping[str, str], cwd: str | None) -> dict[str, str]:
    """What a client says in ``streamd/hello`` besides its version."""
    out: dict[str, str] = {}
    if cwd is not None:
        out["cwd"] = cwd
    db = _given(args, "--db") or env.get("STREAMD_DB") or ""
    if db and (cwd is not None or os.path.isabs(os.path.expanduser(db)) or _is_url(db)):
        out["db"] = absolute(db, cwd or "/")
    return out


def log_file(args: Sequence[str]) -> str:
    """Where a daemon started with ``args`` logs (for messages)."""
    given = _given(args, "--log-file")
    if given == "-":
        return "its stderr"
    return given or paths.log_path()


def caller_cwd() -> str | None:
    """This process's working directory, or None when it was removed."""
    try:
        return os.getcwd()
    except OSError:
        return None


class Launched:
    """A ``streamd daemon`` this process started, with its startup pipe."""

    def __init__(self, daemon_args: Sequence[str], cwd: str | None) -> None:
        import subprocess  # only here: most spawns find a daemon already

        base = cwd if cwd is not None else "/"
        env = absolute_env(os.environ, base)
        env[STARTUP_PIPE_ENV] = "1"
        # Before the spawn: a stop asked from here on holds it back (stopmark).
        env[stopmark.SPAWNED_AT_ENV] = f"{stopmark.now():.6f}"
        read_end, write_end = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "streamd", "daemon", *absolute_args(daemon_args, base)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=write_end,
                close_fds=True, start_new_session=True, cwd="/", env=env,
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        # Popen would warn at exit about a child still running; the daemon is
        # meant to outlive us (it is reparented to init when we exit).
        proc.returncode = 0
        self.pid = proc.pid
        self._pipe: int | None = read_end
        self._said = bytearray()
        self.status: int | None = None  # its wait status, once it has exited

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the daemon to say something or detach;
        True once its pipe has ended (it serves, or it exited: :attr:`exited`)."""
        if self._pipe is None:
            return True
        ready, _, _ = select.select([self._pipe], [], [], max(timeout, 0))
        if not ready:
            return False
        chunk = os.read(self._pipe, MAX_SAID)
        if chunk:
            self._said += chunk
            del self._said[:-MAX_SAID]
            return False
        os.close(self._pipe)
        self._pipe = None
        return True

    @property
    def exited(self) -> bool:
        """Whether the daemon has exited (and is reaped)."""
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid:
                self.status = status
        return self.status is not None

    def reason(self) -> str:
        """How it ended and the last thing it said, in one line."""
        how = "exited"
        if self.status is not None:
            if os.WIFSIGNALED(self.status):
                how = f"was killed by signal {os.WTERMSIG(self.status)}"
            else:
                how = f"exited with status {os.waitstatus_to_exitcode(self.status)}"
        lines = [ln.strip() for ln in self._said.decode(errors="replace").splitlines()]
        lines = [ln for ln in lines if ln]
        said = f": {lines[-1]}" if lines else ", saying nothing"
        return f"the daemon it started (pid {self.pid}) {how}{said}"

    def close(self) -> None:
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None
        self.exited  # noqa: B018 - reaps a daemon that lost the lock race


def detach_startup_pipe() -> None:
    """In the daemon, once it serves: stop writing to the client's startup
    pipe (the client stops reading it, so later writes would fail)."""
    if os.environ.pop(STARTUP_PIPE_ENV, None) is None:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
    finally:
        os.close(devnull)
