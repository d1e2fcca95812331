"""A restart's check of its segments' checksums, in a thread beside the adoption.

Checking every array of a 1M-record index reads 275 MB (``checksum``): about
40 ms of CPU with the compiled core, 110 ms on the plain path. Done before
the adoption, it made the restart's first answer about 70 ms later (13 %);
the adoption itself (the ids decoded, the columns copied: some 250 ms) needs
none of it. So the check starts once the manifest and the tables are found
sound, runs in a thread of its own (its reads and CRCs release the GIL) on
the other core while the caller adopts, and the caller waits for it before
the adopted index answers anything: a segment that fails is never used, and
is treated as the tables' plausibility checks treat theirs (``Damaged``).

Rules:

* The caller must call :meth:`Verification.wait` before it publishes what it
  adopted (``manifest.Loaded.verified``), and need not when it adopts
  nothing: the thread then ends by itself (it is a daemon thread, and reads
  through descriptors that keep even an unlinked file readable).
* A file that cannot be read to the end of its arrays is damaged too.
* A segment written before checksums is not checked (``SegmentFile.unmatched``).
"""

from __future__ import annotations

import threading

from streamd.recall.index.segment import Damaged, Segment

__all__ = ["Verification"]


class Verification:
    """The checksums of ``segments``, checked in a thread started at once."""

    def __init__(self, segments: list[Segment]) -> None:
        self._segments = segments
        # Written by the thread before it ends, read after the join.
        self._damage: str | None = None
        self._thread = threading.Thread(target=self._run, name="streamd-checksums", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for s in self._segments:
            if s.file is None:
                continue
            try:
                unmatched = s.file.unmatched()
            except OSError as exc:
                self._damage = f"{s.path} cannot be read to check it ({exc})"
                return
            if unmatched:
                self._damage = f"{s.path}: its {', '.join(unmatched)} do not match their checksums"
                return

    def wait(self) -> None:
        """Return once every segment has been checked; raise :class:`Damaged`
        for the first whose bytes are not those that were written."""
        self._thread.join()
        if self._damage is not None:
            raise Damaged(self._damage)
