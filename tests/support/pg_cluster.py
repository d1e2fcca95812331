"""A throwaway PostgreSQL cluster for the tests: private, on a Unix socket only.

:func:`start` finds the server binaries (installing the ``postgresql`` OS
package with apt when none are found and apt is usable), runs ``initdb`` into a
fresh temporary directory and starts the server with no TCP listener, its
socket in a private directory of that cluster, ``fsync=on`` (the tests measure
durability, not a RAM disk) and trust authentication for the local socket only.
PostgreSQL refuses to run as root, and CI runs as root: then the cluster belongs
to an unprivileged system user, ``streamd-pg``, created once. :meth:`Cluster.stop`
stops the server and deletes the directory; an ``atexit`` hook does it too, so a
killed test run leaves no server behind it.

Anything that makes a cluster impossible raises :class:`Unavailable` with the
reason in words; the fixture in ``conftest.py`` turns that into a loud skip of
the PostgreSQL tests only.

Run alone (``python tests/support/pg_cluster.py``) it starts a cluster, prints its
conninfo and waits for Enter: for trying the backend by hand or for the bench.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script (the conformance tests' adapter): find support/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.os_packages import Unavailable, apt_install, unprivileged_user

__all__ = ["CLUSTER_USER", "SUPERUSER", "Cluster", "Unavailable", "find_bindir", "start"]

CLUSTER_USER = "streamd-pg"
"""The OS user that owns the cluster when the tests run as root."""
SUPERUSER = "streamd"
"""The cluster's superuser role (a role name, not an OS user)."""
PORT = 5432  # only names the socket file inside the private directory: no TCP
PASSWORD_ROLE = "streamd_pw"
"""A role that must give a password (scram-sha-256), for the credential tests."""


def find_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: PATH first, then Debian's
    ``/usr/lib/postgresql/<version>/bin``, newest version first."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


@dataclass
class Cluster:
    """A running cluster. ``conninfo(dbname)`` reaches it as the superuser."""

    bindir: Path
    root: Path
    user: pwd.struct_passwd | None
    socket_dir: Path = field(init=False)
    data: Path = field(init=False)
    log: Path = field(init=False)
    running: bool = False
    _databases: int = 0
    _templates: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.socket_dir = self.root / "socket"
        self.data = self.root / "data"
        self.log = self.root / "server.log"

    def conninfo(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        return f"host={self.socket_dir} port={PORT} user={user} dbname={dbname}"

    def url(self, dbname: str = "postgres") -> str:
        """The same, as the ``postgresql://`` URL that ``--db`` takes."""
        return f"postgresql://{SUPERUSER}@/{dbname}?host={self.socket_dir}&port={PORT}"

    def _run(self, *argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        kw: dict[str, object] = {}
        if self.user is not None:
            kw = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
        done = subprocess.run(
            [str(a) for a in argv], capture_output=True, text=True, env=env, cwd=self.root, **kw
        )
        if check and done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise Unavailable(
                f"{Path(str(argv[0])).name} failed ({done.returncode}):"
                f" {(done.stderr or done.stdout).strip()[-1500:]}\n{log}"
            )
        return done

    def init(self) -> None:
        self.socket_dir.mkdir(mode=0o700)
        if self.user is not None:
            for path in (self.root, self.socket_dir):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        self._run(
            self.bindir / "initdb",
            "-D", self.data,
            "-U", SUPERUSER,
            "-E", "UTF8",
            "--locale=C",
            "-A", "trust",
            "--no-instructions",
        )
        # Local socket only, trust for everyone but the role that must give a
        # password; no host lines at all (there is no TCP listener anyway).
        (self.data / "pg_hba.conf").write_text(
            f"local all {PASSWORD_ROLE} scram-sha-256\nlocal all all trust\n"
        )

    def start(self) -> None:
        options = (
            f"-k {self.socket_dir} -p {PORT} -c listen_addresses='' -c fsync=on"
            " -c synchronous_commit=on -c max_connections=200"
        )
        self._run(self.bindir / "pg_ctl", "start", "-w", "-t", "60", "-D", self.data,
                  "-l", self.log, "-o", options)
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        if self.running:
            self.running = False
            self._run(self.bindir / "pg_ctl", "stop", "-w", "-m", mode, "-D", self.data,
                      check=False)

    def pids(self) -> list[int]:
        """The server's processes: the postmaster, then its children (every
        backend, the checkpointer and the rest), for freezing it whole."""
        main = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
            except (OSError, ValueError):
                continue  # not a process, or gone meanwhile
            # The parent is the second field after the command's ")".
            if entry.name.isdigit() and int(stat.rpartition(")")[2].split()[1]) == main:
                children.append(int(entry.name))
        return [main, *children]

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def fresh_database(self, prepare: Callable[[str], None] | None = None) -> str:
        """A new empty database, or a copy of a template that ``prepare`` (given
        the template's conninfo) set up once: ``CREATE DATABASE ... TEMPLATE``
        copies a migrated schema in milliseconds. Its conninfo."""
        import psycopg

        with psycopg.connect(self.conninfo(), autocommit=True) as admin:
            template = "template0"
            if prepare is not None:
                template = "streamd_template"
                if template not in self._templates:
                    admin.execute(f"DROP DATABASE IF EXISTS {template}")
                    admin.execute(f"CREATE DATABASE {template}")
                    prepare(self.conninfo(template))
                    self._templates.add(template)
            self._databases += 1
            name = f"t{self._databases}"
            admin.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
        return self.conninfo(name)

    def drop_database(self, conninfo: str) -> None:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        name = conninfo_to_dict(conninfo)["dbname"]
        with psycopg.connect(self.conninfo(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run SQL as the superuser through the server's own psql; its output."""
        done = self._run(self.bindir / "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                         "-h", self.socket_dir, "-p", str(PORT), "-U", SUPERUSER,
                         "-d", dbname, "-c", sql)
        return done.stdout.strip()


def start(root: Path | None = None) -> Cluster:
    """A new running cluster (see the module docstring); raises :class:`Unavailable`."""
    bindir = find_bindir()
    if bindir is None:
        apt_install("postgresql", "no PostgreSQL server binaries (initdb)")
        bindir = find_bindir()
        if bindir is None:
            raise Unavailable("apt-get installed postgresql but no initdb was found afterwards")
    user = unprivileged_user(CLUSTER_USER, "PostgreSQL")
    base = Path(tempfile.mkdtemp(prefix="streamd-pg-", dir=root))
    cluster = Cluster(bindir, base, user)
    atexit.register(cluster.destroy)
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        cluster.destroy()
        raise
    return cluster


def adapter(argv: list[str]) -> int:
    """``pg_cluster.py adapter ADMIN_CONNINFO [streamd args...]``: run ``python -m
    streamd`` on a database of its own instead of the SQLite file a case names.

    The event log's conformance cases pass ``--db ${WORKDIR}/events.db`` (a
    fresh directory per run); this replaces that path with a new database,
    copied from the migrated ``streamd_template`` and named for the workdir, so
    every replayed case starts from an empty log on PostgreSQL exactly as it
    would from a new file. The database goes with the cluster."""
    import hashlib

    import psycopg

    admin_info, rest = argv[0], argv[1:]
    if "--db" in rest:
        i = rest.index("--db")
        name = "c" + hashlib.blake2b(rest[i + 1].encode(), digest_size=8).hexdigest()
        with psycopg.connect(admin_info, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name} TEMPLATE streamd_template")
        params = psycopg.conninfo.conninfo_to_dict(admin_info)
        url = f"postgresql://{params['user']}@/{name}?host={params['host']}&port={params['port']}"
        rest[i + 1] = url
    os.execv(sys.executable, [sys.executable, "-m", "streamd", *rest])
    return 1  # not reached


if __name__ == "__main__":
    if sys.argv[1:2] == ["adapter"]:
        raise SystemExit(adapter(sys.argv[2:]))
    c = start()
    print(c.url(), flush=True)
    with contextlib.suppress(EOFError, KeyboardInterrupt):
        input()
    c.destroy()
