"""What every ``streamd`` command shares with people: one-line errors, exit
codes, and the types its flags take.

The rules, kept by every command (``streamd``, ``streamd log``, and the
resident clients' own small parsers):

* A mistake is one line on stderr, ``streamd: ...``, naming the flag or the
  path, never a traceback and never a usage block (``--help`` has those).
* Exit statuses are grep's and rg's: 0 success (a match), 1 nothing found
  (``search`` without a hit, ``expand`` or ``log sessions get`` of a record or
  session that does not exist; ``index`` and ``check``: lines that are not
  records), 2 an error, whether of the command line (an unknown flag, a
  malformed value) or found once it runs (a path that is missing or a
  directory, a workdir it may not write, a database it cannot open). A
  Ctrl-C ends a command with 130 and no traceback; the servers (``streamd``,
  ``serve``, ``daemon``, ``attach``) take SIGINT and SIGTERM as a normal stop,
  0. ``docs/cli.md`` has the table.
* A value is checked where it is parsed, so the message names the flag the
  way a person typed it (``--limit must be at least 1, not '0'``), never the
  request field it becomes (``$.limit``).

Standard library only (argparse is imported by the commands that build a
parser, never by ``streamd attach``).
"""

from __future__ import annotations

import argparse
import sys

# Not `from typing import ...`: typing costs milliseconds at start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import datetime as dt
    from typing import NoReturn

# The largest integer the wire takes (Go's int): a flag refuses what its
# request would refuse.
MAX_INT = (1 << 63) - 1


# Exit statuses (see above).
OK = 0
NOT_FOUND = 1
ERROR = 2
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C killed


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C, alone or among what Trio's nurseries
    gathered on the way out (where it arrives with the errors it caused)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(KeyboardInterrupt) is not None
    return isinstance(exc, KeyboardInterrupt)


class UsageError(Exception):
    """A command line that cannot be read as given, found after parsing; exit 2."""


def fail(message: str, code: int = ERROR) -> int:
    """Say ``message`` as the one line a mistake gets; returns ``code``."""
    sys.stderr.write(f"streamd: {message}\n")
    sys.stderr.flush()
    return code


class Parser(argparse.ArgumentParser):
    """argparse with streamd's one-line errors.

    ``hint`` is said after the error when a stray word was given (how the
    command wants its arguments)."""

    def __init__(self, *args, hint: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hint = hint

    def error(self, message: str) -> NoReturn:
        text = _plain(message)
        if self.hint and message.startswith(("unrecognized arguments",
                                             "the following arguments are required")):
            text += f"; {self.hint}"
        sys.stderr.write(f"streamd: {text} (see '{self.prog} --help')\n")
        sys.exit(2)


def _plain(message: str) -> str:
    """argparse's phrasing said the way the rest of streamd says things."""
    if message.startswith("argument "):
        flag, _, rest = message[len("argument "):].partition(": ")
        flag = flag.split("/")[-1]  # "-n/--lines" -> "--lines"
        if rest == "expected one argument":
            return f"{flag} needs a value"
        if rest.startswith("invalid choice: ") and not flag.startswith("-"):
            # A subcommand: "COMMAND: invalid choice: 'x'" -> "unknown command 'x'".
            return f"unknown {flag.lower()} {rest.removeprefix('invalid choice: ')}"
        return f"{flag} {rest}" if rest.startswith(("must", "is ", "'")) else f"{flag}: {rest}"
    if message.startswith("the following arguments are required: "):
        return "missing " + message.removeprefix("the following arguments are required: ")
    return message


class _Renamed(argparse.Action):
    """A flag that was renamed: giving it is a usage error naming what it became."""

    def __init__(self, option_strings: list[str], dest: str, now: str = "", **kwargs) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, help=argparse.SUPPRESS)
        self.now = now

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} is now {self.now}")


def renamed(p: argparse.ArgumentParser, old: str, now: str) -> None:
    """Refuse ``old``, saying ``now`` (``--rebuild``, say) is its name."""
    p.add_argument(old, action=_Renamed, now=now)


def command(sub: argparse._SubParsersAction, name: str, help: str, **kwargs) -> Parser:
    """A subcommand whose description is its help line (so ``--help`` says
    what it does, not only what it takes)."""
    kwargs.setdefault("description", help[:1].upper() + help[1:] + ".")
    return sub.add_parser(name, help=help, **kwargs)


# --- a wire message, said of a flag ------------------------------------------------
# For the rare value only the request's decoder checks: its msgspec message
# ("Expected `int` >= 0 - at `$.from_seq`") names a field, never the flag.

_EXPECTED = (
    ("Expected `str` of length >= 1", "must not be empty"),
    ("Expected `int` >= 0", "must be 0 or more"),
    ("Expected `int` >= 1", "must be at least 1"),
    ("Expected `object`", "must be a JSON object"),
)


def names_a_field(message: str) -> bool:
    return " - at `$." in message


def said_of_flag(message: str, flags: dict[str, str]) -> str:
    """``Expected `int` >= 0 - at `$.from_seq``` -> ``--from must be 0 or more``,
    with ``flags`` mapping a field's last name to its flag (else ``--field``)."""
    what, _, where = message.rpartition(" - at `$.")
    field = where.rstrip("`").split(".")[-1].split("[")[0]
    flag = flags.get(field, f"--{field.replace('_', '-')}")
    for wire, said in _EXPECTED:
        if what.startswith(wire):
            return f"{flag} {said}"
    return f"{flag}: {what.replace('`', '')}"


# --- value types ----------------------------------------------------------------
# Each raises ArgumentTypeError with the rest of a sentence that starts with
# the flag: "--limit" + " must be at least 1, not '0'".


def _int(value: str, low: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, not {value!r}") from None
    if n < low:
        what = "0 or more" if low == 0 else f"at least {low}"
        raise argparse.ArgumentTypeError(f"must be {what}, not {value!r}")
    if n > MAX_INT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_INT}, not {value!r}")
    return n


def positive(value: str) -> int:
    """An integer of 1 or more."""
    return _int(value, 1)


def count(value: str) -> int:
    """An integer of 0 or more (a seq, a byte count, a number of lines)."""
    return _int(value, 0)


def text(value: str) -> str:
    """A value the event log stores as text. The log is UTF-8: bytes that are
    not arrive as surrogate escapes (how Python decodes argv), which failed
    deep in an encoder with a traceback (``--content``) or a line naming no
    flag; refused here, where the flag is known."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raw = value[exc.start:exc.end].encode("utf-8", "surrogateescape")
        raise argparse.ArgumentTypeError(
            f"is not UTF-8 text (byte 0x{raw[0]:02x} at character {exc.start + 1})"
        ) from None
    return value


def nonempty(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return text(value)


def seconds(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {value!r}") from None
    if not s >= 0 or s == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {value!r}")
    return s


def instant(value: str) -> int:
    """A time as people type it (see :mod:`streamd.cli.timeinput`), as Unix ns."""
    from streamd.cli.timeinput import TimeInputError, parse_instant

    try:
        return parse_instant(value, "")
    except TimeInputError as exc:
        raise argparse.ArgumentTypeError(str(exc).lstrip()) from None


def instant_utc(value: str) -> dt.datetime:
    """A time as people type it, as an aware UTC datetime (years 1 to 9999)."""
    from streamd.cli.timeinput import TimeInputError, parse_datetime

    try:
        return parse_datetime(value, "")
    except TimeInputError as exc:
        raise argparse.ArgumentTypeError(str(exc).lstrip()) from None
