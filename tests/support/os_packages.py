"""What the throwaway database servers of the tests need from the OS: a
package installed with apt when its program is missing, and an unprivileged
user to run the server as when the tests run as root (neither PostgreSQL nor
MariaDB runs as root)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys

__all__ = ["Unavailable", "apt_install", "unprivileged_user"]


class Unavailable(Exception):
    """No server can be started here; the message says why."""


def apt_install(package: str, missing: str) -> None:
    """``apt-get install -y package``, quietly; ``apt-get update`` once first
    if the package is not known (a fresh machine has no package lists).
    ``missing`` says what was not found, for the messages."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable(
            f"{missing} was not found, and apt-get is not usable here (it needs root) to"
            f" install the {package} package"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    print(f"tests: installing {package} with apt-get ({missing} was not found)", file=sys.stderr)
    done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise Unavailable(f"apt-get install {package} failed: " + " / ".join(tail))


def unprivileged_user(name: str, server: str) -> pwd.struct_passwd | None:
    """The user ``server`` runs as: ourselves (None), or the system user
    ``name``, created once, when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True, text=True,
    )
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise Unavailable(
            f"running as root, and the unprivileged user {name} ({server} refuses to run as"
            f" root) could not be created: {made.stderr.strip()}"
        ) from None
