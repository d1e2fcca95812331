"""How much of its deadline a request keeps for answering.

A request that waits for a build stops waiting while enough of its deadline
is left to answer from the generation published before: rank, re-read the
lines it shows, render. How long that takes depends on the generation (a
search over half a million records costs more than one over a thousand) and
on the machine (on a loaded one several times more, and the build competes
with the answer for the same cores), so a fixed margin is either wasted on a
quiet machine or too short on a busy one, where the answer then misses the
deadline it stopped waiting for. So the reserve is learnt from the answers
themselves: ``FACTOR`` times the longest of the last ``KEEP``, never less
than ``FLOOR`` nor more than ``CEILING`` (a single stall, a swap storm, must
not make every later request give up on the build at once).

Sans-I/O: the caller measures, on its own clock, and says what it measured.
"""

from __future__ import annotations

from collections import deque

FLOOR = 0.25
CEILING = 2.0
FACTOR = 2.0
KEEP = 16


class AnswerReserve:
    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=KEEP)

    def observe(self, seconds: float) -> None:
        """One answer took ``seconds`` from its generation in hand to its
        result (or to its deadline, when it ran out: still a lower bound)."""
        self._recent.append(max(0.0, seconds))

    @property
    def seconds(self) -> float:
        """What to keep of a deadline for the answer."""
        longest = max(self._recent, default=0.0)
        return min(CEILING, max(FLOOR, FACTOR * longest))
