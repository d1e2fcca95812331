"""Text the reference writes: excerpts, expansions, watermarks.

Sizes are UTF-8 bytes and cuts land on character boundaries, as in Go.
"""

from __future__ import annotations

from streamd.golang import gotime
from streamd.recall.records import Record
from streamd.recall.tokenize import GO_SPACE

EXCERPT_BYTES = 240
CONTEXT_TITLE_BYTES = 120
DETAIL_LEVELS = ("summary", "excerpt", "full", "context")
# The fewest bytes a line of a context's episode takes: "\n- ", the shortest
# locator part ("v1/x"), " ", an RFC 3339 time in whole seconds (20 bytes:
# event times past year 9999 are never indexed), " ", an empty title.
EPISODE_LINE_MIN_BYTES = 29



def cut_bytes(s: str, limit: int) -> str:
    """The longest prefix of ``s`` within ``limit`` UTF-8 bytes."""
    raw = s.encode()
    if len(raw) <= limit:
        return s
    return raw[:limit].decode("utf-8", "ignore")


def clip(s: str, limit: int) -> str:
    """A bounded preview: cut, trimmed, and marked with an ellipsis."""
    if len(s.encode()) <= limit:
        return s
    return cut_bytes(s, limit).strip(GO_SPACE) + "…"


def expansion(rec: Record, detail: str, episode: list[Record]) -> str:
    """Each level starts with the previous level's text and only adds lines."""
    lines = [f"{rec.title}\n{rec.kind} at {gotime.format_seconds(rec.event_time)}"]
    if rec.system and rec.ref:
        lines.append(f"\nupstream: {rec.system} {rec.ref}")
    if detail == "summary":
        return "".join(lines)
    if detail == "excerpt":
        _body(lines, clip(rec.text, EXCERPT_BYTES))
        return "".join(lines)
    _body(lines, rec.text)
    if rec.actor:
        lines.append(f"\nactor: {rec.actor}")
    if rec.correlation:
        lines.append(f"\ncorrelation: {rec.correlation}")
    if rec.revision:
        lines.append(f"\nupstream_revision: {rec.revision}")
    if episode:
        lines.append("\n\nEpisode:")
        for other in episode:
            lines.append(
                f"\n- {other.local} {gotime.format_seconds(other.event_time)} "
                f"{clip(other.title, CONTEXT_TITLE_BYTES)}"
            )
    return "".join(lines)


def episode_lines_within(budget_bytes: int) -> int | None:
    """How many episode lines an expansion cut at ``budget_bytes`` needs
    (None: no budget, every one). Past that many the lines alone are over
    the budget, so the cut content is the same, and still truncated,
    whatever lines follow: a window of a million records need not be read
    back to show the first few dozen."""
    if budget_bytes <= 0:
        return None
    return budget_bytes // EPISODE_LINE_MIN_BYTES + 1


def _body(lines: list[str], text: str) -> None:
    if text:
        lines.append("\n\n" + text)


def watermark(consumed: int, records: int, latest: int | None) -> str:
    shown = "-" if latest is None else gotime.format_seconds(latest)
    return f"bytes={consumed} records={records} latest={shown}"
