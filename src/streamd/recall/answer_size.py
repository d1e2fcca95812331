"""A search answer's candidates, kept only while they can fit in a frame: sans-I/O.

An answer over the frame limit is refused -32603 whatever it holds
(:func:`~streamd.rpc.protocol.result_frame`), yet a ``max_candidates`` of a
billion had every match rendered as a candidate, the whole answer encoded,
and only then refused: for 100,000 records of 1 KiB, the candidates and
their 76 MB encoding held at once (514 MiB peak RSS, 252 now) for an answer
nobody could receive.

:class:`Candidates` keeps them until their encoded bytes alone pass the room
the frame leaves for the result; from then on it keeps none and only counts
each one's bytes, so the refusal still states the answer's exact size. A
candidate encodes to at least :data:`CANDIDATE_FLOOR` bytes (its member
names alone), so no counting is done while the candidates could not pass
the limit yet: an ordinary answer of a few dozen is encoded once, as before.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from streamd.recall.wire import Candidate, CandidateMetadata, LogCandidateMetadata, SearchResult

__all__ = ["CANDIDATE_FLOOR", "AnswerTooLarge", "Candidates"]

_encoder = msgspec.json.Encoder()


def _least_candidate() -> int:
    """What a candidate with every field empty encodes to, for either source."""
    def bare(metadata: CandidateMetadata | LogCandidateMetadata) -> Candidate:
        return Candidate(candidate_id="", source_record_id="", locator="", record_type="",
                         title="", local_rank=0, local_score=0, relevance=0, match_signals=[],
                         observed_at="", confirmed_at="", event_time="", source_revision="",
                         sensitivity="", metadata=metadata)
    return min(len(_encoder.encode(bare(CandidateMetadata(byte_offset=0, file="", schema=0)))),
               len(_encoder.encode(bare(LogCandidateMetadata(app="", seq=0, session="",
                                                             user="")))))


CANDIDATE_FLOOR = _least_candidate()


class AnswerTooLarge(Exception):
    """The search's result would encode to ``size`` bytes, past the room it had."""

    def __init__(self, size: int) -> None:
        super().__init__(f"the result is {size} bytes")
        self.size = size


class Candidates:
    """The candidates of one answer, in order, while they fit in ``limit``
    bytes (None: no limit): see the module docstring."""

    def __init__(self, limit: int | None) -> None:
        self.kept: list[Candidate] = []
        self._limit = limit
        self._added = 0
        self._counted = 0  # of kept, those whose bytes are in _bytes
        self._bytes = 0  # encoded, each with one separator
        self.over = False
        """Past the limit: nothing is kept any more, only counted."""

    def add(self, candidate: Candidate) -> None:
        self._added += 1
        limit = self._limit
        if limit is None:
            self.kept.append(candidate)
            return
        if self.over:
            self._bytes += len(_encoder.encode(candidate)) + 1
            return
        self.kept.append(candidate)
        if self._added * CANDIDATE_FLOOR <= limit:
            return  # cannot have passed it yet
        for kept in self.kept[self._counted:]:
            self._bytes += len(_encoder.encode(kept)) + 1
        self._counted = len(self.kept)
        if self._bytes - 1 > limit:
            self.over = True
            self.kept.clear()

    def result(self, build: Callable[[list[Candidate]], SearchResult]) -> SearchResult:
        """``build(kept)``, or AnswerTooLarge with the size it would have
        encoded to: the result without candidates, plus their bytes."""
        if not self.over:
            return build(self.kept)
        # "[]" becomes "[a,b,...]": the candidates and a comma between each two.
        raise AnswerTooLarge(len(_encoder.encode(build([]))) + self._bytes - 1)
