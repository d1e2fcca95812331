"""A throwaway MariaDB server for the tests: private, on a Unix socket only.

:func:`start` finds ``mariadbd`` (installing Debian's ``mariadb-server``
package with apt when it is missing and apt is usable), creates a fresh data
directory with ``mariadb-install-db`` and starts the server with no TCP
listener, its socket in that directory, every commit on disk
(``innodb_flush_log_at_trx_commit=1``: the tests measure durability) and the
server's root account reachable over the socket without a password. The server
never runs as root: as root, it runs as the unprivileged system user
``streamd-db``, created once. :meth:`Server.stop` stops it and deletes the
directory; an ``atexit`` hook does it too.

Anything that makes a server impossible raises :class:`Unavailable` with the
reason in words; the conftest fixture turns that into a loud skip of the MySQL
tests only (a failure with ``CI=true``).

Run alone (``python tests/support/mariadb_server.py``) it starts a server,
prints a URL of a fresh database and waits for Enter.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script (the conformance tests' adapter): find support/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.os_packages import Unavailable, apt_install, unprivileged_user

__all__ = ["SERVER_USER", "Server", "Unavailable", "start"]

SERVER_USER = "streamd-db"
PASSWORD_USER = "streamd_pw"
"""An account that must give a password, for the credential tests."""
PASSWORD = "s3cret?#&pw"
"""Its password: the characters a URL would mangle."""


def _binaries() -> tuple[str, str] | None:
    server = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/bin")
    install = shutil.which("mariadb-install-db") or shutil.which(
        "mariadb-install-db", path="/usr/bin:/usr/sbin")
    return (server, install) if server and install else None


@dataclass
class Server:
    """A running server; :meth:`url` reaches a database on it as root."""

    binary: str
    install_db: str
    root: Path
    user: pwd.struct_passwd | None
    proc: subprocess.Popen[bytes] | None = None
    _databases: int = 0
    data: Path = field(init=False)
    socket: Path = field(init=False)
    log: Path = field(init=False)
    tmp: Path = field(init=False)

    def __post_init__(self) -> None:
        self.data = self.root / "data"
        self.socket = self.root / "mysqld.sock"
        self.log = self.root / "server.log"
        # The server's temporary files in a directory of its own: in the shared
        # /tmp, a bootstrap beside other servers and test runs failed on its
        # internal temporary tables ("Error on delete of
        # '/tmp/#sql-temptable-...MAI'"), and every MySQL test was skipped.
        self.tmp = self.root / "tmp"

    def _as_server(self) -> dict[str, object]:
        # An environment of its own, not the test's that happened to start it
        # (the server lives for the whole run): a resident-daemon test's
        # teardown kills every process whose environment names its world, and
        # a server started inside such a test carried that name, and was
        # stopped under every later MySQL test of the run.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
        if self.user is None:
            return {"env": env}
        return {"env": env, "user": self.user.pw_uid, "group": self.user.pw_gid,
                "extra_groups": []}

    def init(self) -> None:
        self.tmp.mkdir(exist_ok=True)
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
            os.chown(self.tmp, self.user.pw_uid, self.user.pw_gid)
        done = subprocess.run(
            [self.install_db, "--no-defaults", f"--datadir={self.data}", f"--tmpdir={self.tmp}",
             "--auth-root-authentication-method=normal", "--skip-test-db",
             "--skip-name-resolve"],
            capture_output=True, text=True, cwd=self.root, **self._as_server(),  # type: ignore[call-overload]
        )
        if done.returncode != 0:
            raise Unavailable(f"mariadb-install-db failed: {(done.stderr or done.stdout)[-1500:]}")

    def start(self) -> None:
        argv = [
            self.binary, "--no-defaults", f"--datadir={self.data}", f"--tmpdir={self.tmp}",
            f"--socket={self.socket}",
            "--skip-networking", f"--pid-file={self.root / 'mysqld.pid'}",
            f"--log-error={self.log}", "--innodb-flush-log-at-trx-commit=1",
            "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=48M",
            "--character-set-server=utf8mb4", "--skip-name-resolve", "--max-connections=300",
        ]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, cwd=self.root,
                                     **self._as_server())  # type: ignore[call-overload]
        deadline = time.monotonic() + 60
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
                self.stop()
                raise Unavailable(f"mariadbd did not start:\n{log}")
            time.sleep(0.05)  # a process's start: there is no event to wait on
        self.sql(f"CREATE USER IF NOT EXISTS '{PASSWORD_USER}'@'localhost'"
                 f" IDENTIFIED BY '{PASSWORD}'")
        self.sql(f"GRANT ALL ON *.* TO '{PASSWORD_USER}'@'localhost'")

    def _answers(self) -> bool:
        import MySQLdb

        try:
            MySQLdb.connect(unix_socket=str(self.socket), user="root", connect_timeout=2).close()
        except MySQLdb.Error:
            return False
        return True

    def sql(self, statement: str, database: str | None = None) -> list[tuple[object, ...]]:
        """Run one statement as root; its rows."""
        import MySQLdb

        kw = {"database": database} if database else {}
        conn = MySQLdb.connect(unix_socket=str(self.socket), user="root", autocommit=True, **kw)
        try:
            cur = conn.cursor()
            cur.execute(statement)
            return list(cur.fetchall() or ())
        finally:
            conn.close()

    def url(self, database: str, user: str = "root") -> str:
        return f"mysql://{user}@/{database}?unix_socket={self.socket}"

    def fresh_database(self) -> str:
        """A new empty database; its URL."""
        self._databases += 1
        name = f"t{self._databases}_{os.getpid()}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.split("/")[3].split("?")[0]
        self.sql(f"DROP DATABASE IF EXISTS {name}")

    def kill(self) -> None:
        """SIGKILL the server (a crash), leaving its files for :meth:`start`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc = None

    def destroy(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def start(root: Path | None = None) -> Server:
    """A new running server (see the module docstring); raises :class:`Unavailable`."""
    found = _binaries()
    if found is None:
        apt_install("mariadb-server", "no MariaDB server (mariadbd)")
        found = _binaries()
        if found is None:
            raise Unavailable("apt-get installed mariadb-server but no mariadbd was found")
    user = unprivileged_user(SERVER_USER, "MariaDB")
    base = Path(tempfile.mkdtemp(prefix="streamd-my-", dir=root))
    server = Server(found[0], found[1], base, user)
    atexit.register(server.destroy)
    try:
        server.init()
        server.start()
    except BaseException:
        server.destroy()
        raise
    return server


def adapter(argv: list[str]) -> int:
    """``mariadb_server.py adapter SOCKET [streamd args...]``: run ``python -m
    streamd`` on a new database of its own instead of the SQLite file a case
    names (``--db ${WORKDIR}/events.db``, a fresh directory per run), so every
    replayed case starts from an empty log on MariaDB as it would from a new
    file. The database is named for the workdir."""
    import hashlib

    import MySQLdb

    sock, rest = argv[0], argv[1:]
    if "--db" in rest:
        i = rest.index("--db")
        name = "c" + hashlib.blake2b(rest[i + 1].encode(), digest_size=8).hexdigest()
        conn = MySQLdb.connect(unix_socket=sock, user="root", autocommit=True)
        try:
            conn.query(f"CREATE DATABASE {name}")
        finally:
            conn.close()
        rest[i + 1] = f"mysql://root@/{name}?unix_socket={sock}"
    os.execv(sys.executable, [sys.executable, "-m", "streamd", *rest])
    return 1  # not reached


if __name__ == "__main__":
    if sys.argv[1:2] == ["adapter"]:
        raise SystemExit(adapter(sys.argv[2:]))
    s = start()
    print(s.fresh_database(), flush=True)
    with contextlib.suppress(EOFError, KeyboardInterrupt):
        input()
    s.destroy()
