"""The ``streamd`` command.

* :mod:`~streamd.cli.commands` - the top-level parser and dispatch: global
  options, the daemon, the resident daemon's clients, ``demo``, exit codes.
* :mod:`~streamd.cli.recall` - the Recall commands (``search``, ``expand``,
  ``index``), each one adapter run in the calling process, and the parsers of
  those and ``check``; :mod:`~streamd.cli.check` - ``check``.
* :mod:`~streamd.cli.output` - where a command's output goes, and what a
  write that fails there means.
* :mod:`~streamd.cli.args` - the rules every command's options share: one-line
  errors, exit codes, typed option values.
* :mod:`~streamd.cli.timeinput` - times as people type them, one parser.
* :mod:`~streamd.cli.progress` - the progress line of a long build.
* :mod:`~streamd.cli.terminal` - what is written to a person at a terminal
  while they wait.

This face imports nothing: the options rules are shared with ``streamd log``
and ``streamd conformance``, which must not pay for the whole command.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The ``streamd`` console script (``streamd.cli:main``): see
    :func:`streamd.cli.commands.main`."""
    from streamd.cli.commands import main as run

    return run(argv)
