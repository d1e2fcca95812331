"""numpy's linear-algebra threads, which this program never uses.

numpy's wheels load OpenBLAS when numpy is imported, and OpenBLAS starts a
thread per core there that spins for a while waiting for work. streamd never
multiplies a matrix (its arrays are sorted, searched, gathered and summed),
so on this 2-core machine every command paid about 0.1 s of CPU for nothing
at its start: a one-shot ``streamd search`` took 0.30 s of CPU where 0.19 s
is its own, and on a machine whose other core is busy that spinning thread
competes with the command for it. The ``streamd`` command owns its process,
so before numpy loads it asks OpenBLAS for one thread (no extra thread at
all). A setting the caller made is kept. Library use (``streamd.adk`` in an
agent's process, say) leaves the host's environment alone.
"""

from __future__ import annotations

import os

# Read by OpenBLAS when numpy loads it, and by nothing after that.
VARIABLE = "OPENBLAS_NUM_THREADS"
_set_here = False


def one_thread() -> None:
    """Ask numpy's OpenBLAS for no threads of its own, unless the caller
    chose a number. Takes effect only before numpy's first import."""
    global _set_here
    if VARIABLE not in os.environ:
        os.environ[VARIABLE] = "1"
        _set_here = True


def foreign_env() -> dict[str, str]:
    """The environment to give a program that is not streamd (an adapter
    under test): the caller's own, without the setting made here."""
    env = dict(os.environ)
    if _set_here and env.get(VARIABLE) == "1":
        del env[VARIABLE]
    return env
