"""``streamd`` run in a fresh interpreter as ``python -m streamd`` runs it,
then a report of the process's state at its end: what a test of the whole
command's process (its imports, its threads) reads back."""

from __future__ import annotations


def script(report: str) -> str:
    """A ``python -c`` program: runs ``streamd`` with its own arguments, then
    ``report`` (Python that writes one marked line to stderr)."""
    return (
        "import os, runpy, sys\n"
        'sys.argv = ["streamd", *sys.argv[1:]]\n'
        "try:\n"
        '    runpy.run_module("streamd", run_name="__main__", alter_sys=True)\n'
        "except SystemExit:\n"
        "    pass\n"
        f"{report}\n"
    )
