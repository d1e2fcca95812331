"""The index on disk, so a restart costs the bytes appended since, not the stream.

Layout inside the workdir (every file here is ours; anything else under
``index/`` that the manifest does not name is a leftover and is removed):

    index/seg-<base>-<count>-<token>.seg   immutable segments (see ``segment``)
    index/manifest.json                     which segments, up to which offsets
    cursor.json                             Recall's checkpoint (``adapter``)

Order of writes, which is what makes a crash at any point safe:

1. segment files, each written to a temporary name, fsynced and renamed;
2. ``manifest.json`` the same way, naming only fsynced segments;
3. ``cursor.json`` last.

A crash before (2) leaves orphan segments and the previous manifest, which
still describes a whole, published generation; a crash before (3) leaves a
manifest one generation ahead of the checkpoint, which only means the next
start catches up fewer bytes.

A write that fails (a full disk) removes its temporary and leaves every
file of the last good save as it was (``write_atomic``); the segments it
could not write stay in memory and are written by the next save, so the
index is whole on disk again as soon as there is room (see ``index.Index``).

The manifest carries a CRC-32 of its own bytes (``summed``), checked before
it is read: one that does not match is damage (the log names it and the
files are indexed anew). One written before it had a checksum (format 2) is
read as it was then.

A manifest is adopted only if every file it read is at least as long as what
was consumed and still holds the same bytes at both ends of it (its
``fingerprint``, which a running process also checks at every catch-up);
anything else means the stream was rewritten while we were down, and the
index is rebuilt (and health says ``stream_rewritten``). A same-length
rewrite strictly inside a file, made while no process ran, is not noticed:
an append-only stream must not do it, and checking for it would mean reading
the whole stream on every start.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from streamd.recall.index import segment as seg
from streamd.recall.index import streamfile
from streamd.recall.index.fingerprint import fingerprint
from streamd.recall.index.segment import Segment
from streamd.recall.index.streamfile import Cursor
from streamd.recall.persist import cursors, summed
from streamd.recall.persist.atomic import write_atomic

FORMAT = 3
# A manifest written before manifests had a checksum (``summed``): adopted
# as it was then.
FORMAT_UNSUMMED = 2
MANIFEST = "manifest.json"
# What reading a manifest that is not ours to trust may raise: it is then not
# adopted. OverflowError is ``int()`` of a number JSON reads as infinity
# (``1e400``, a damaged or hand-edited file), which failed every build.
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, OverflowError)
# The manifest's own keys; any other is a source's position (``save_position``).
_STRUCTURE = frozenset({"format", "config", "records", "latest", "kinds", "segments", "files"})


@dataclass(slots=True)
class Loaded:
    segments: list[Segment]
    files: list[Cursor]
    kinds: list[str]
    latest: int
    records: int
    # What a source other than stream files saved of where it stands
    # (``save_position``): the event log's seq and removal mark.
    position: dict[str, Any] = field(default_factory=dict)


def _print(c: Cursor, prints: dict[str, str] | None) -> str:
    if prints is not None and c.path in prints:
        return prints[c.path]
    return fingerprint(c.path, c.offset, c.identity)


class DurableIndex:
    def __init__(self, workdir: str, config: str) -> None:
        self.dir = os.path.join(workdir, "index")
        self.config = config
        # The manifest as this process last wrote or read it (or found it at
        # the start): another writer of the workdir (see ``lock``) shows as
        # a manifest that differs.
        self._seen: tuple[int, int, int] | None = self._stamp()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(os.path.join(self.dir, MANIFEST))
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def written_by_another(self) -> bool:
        """Whether the manifest changed since this process last saved or loaded it."""
        return self._stamp() != self._seen

    def saved_by_another(self) -> bool:
        """Whether a manifest is there that this process neither wrote nor
        read last: another process's save (one removed meanwhile is not)."""
        stamp = self._stamp()
        return stamp is not None and stamp != self._seen

    def _make_dir(self) -> None:
        # mkdir, not makedirs: a missing workdir is the host's to create, not ours.
        try:
            os.mkdir(self.dir, mode=0o700)
        except FileExistsError:
            pass

    def sink(self, segment: Segment) -> Segment:
        """Write a freshly sealed segment and hand back its mapped copy, so
        a big build holds its postings in the page cache, not in our heap."""
        self._make_dir()
        name = f"seg-{segment.base:012d}-{segment.count}-{secrets.token_hex(4)}.seg"
        path = os.path.join(self.dir, name)
        write_atomic(path, seg.encode(segment))
        return seg.read(path)

    def save(self, segments: tuple[Segment, ...], files: list[Cursor], kinds: list[str],
             latest: int, records: int, prints: dict[str, str] | None = None) -> None:
        """``prints``: the files' fingerprints, when the caller has just taken them."""
        files_spec = [cursors.encode(c, head=_print(c, prints)) for c in files]
        self.save_position(segments, kinds, latest, records, {"files": files_spec})

    def save_position(self, segments: tuple[Segment, ...], kinds: list[str], latest: int,
                      records: int, position: dict[str, Any]) -> None:
        """:meth:`save` for a source that is not stream files: ``position``
        (JSON) says where it stands, and its loader judges it."""
        names = [os.path.basename(s.path) for s in segments]
        if any(not n for n in names):
            raise OSError("a segment was never written")
        # A generation with no record has sealed no segment, so nothing has
        # made the directory yet; its manifest is still worth saving.
        self._make_dir()
        body = {
            "format": FORMAT,
            "config": self.config,
            "records": records,
            "latest": latest,
            "kinds": kinds,
            "segments": names,
            **position,
        }
        # The directory fsync covers the segments' renames too.
        write_atomic(os.path.join(self.dir, MANIFEST), [summed.dumps(body)], sync_dir=True)
        self._seen = self._stamp()
        self._remove_unlisted(set(names), keep_manifest=True)

    def load(self, paths: list[str]) -> tuple[Loaded | None, bool]:
        """The last saved index if it is still valid for these files, and
        whether a file it read was rewritten since (shorter than what was
        consumed, or a consumed head that no longer matches). Raises
        :class:`~streamd.recall.index.segment.Damaged` for a segment file
        that is not as it was written (``segment.check``)."""
        body = self._body()
        if body is None:
            return None, False
        try:
            files = [cursors.decode(c) for c in body["files"]]
            if [c.path for c in files] != paths:
                return None, False
            for c, spec in zip(files, body["files"], strict=True):
                if not c.offset:
                    continue
                size = os.stat(c.path).st_size if os.path.exists(c.path) else -1
                if size < c.offset or fingerprint(c.path, c.offset) != spec["head"]:
                    return None, True
        except _UNREADABLE:
            return None, False
        loaded = self._segments(body)
        if loaded is not None:
            loaded.files = files
        return loaded, False

    def load_position(self) -> Loaded | None:
        """The last index :meth:`save_position` saved, whole, with its
        ``position`` for the caller to judge; None when there is none. Raises
        :class:`~streamd.recall.index.segment.Damaged` as :meth:`load` does."""
        body = self._body()
        return self._segments(body) if body is not None else None

    def saved_position(self) -> dict[str, Any]:
        """The ``position`` of the last manifest saved here, whichever
        settings or tokenizer it was built under and whatever became of its
        segments (empty when there is none, or it is damaged): a source that
        does not adopt that index still continues its generation names, so
        that one name never means two builds of a workdir."""
        try:
            body = self._body(any_config=True)
        except seg.Damaged:
            return {}
        if body is None:
            return {}
        return {k: v for k, v in body.items() if k not in _STRUCTURE}

    def _body(self, any_config: bool = False) -> dict[str, Any] | None:
        """The manifest, None if there is none of this format and config
        (of any config with ``any_config``). Raises
        :class:`~streamd.recall.index.segment.Damaged` for one that
        does not match its checksum, or should have one and has none."""
        self._seen = self._stamp()
        path = os.path.join(self.dir, MANIFEST)
        try:
            # Regular files only: a FIFO in its place would block the build.
            with streamfile.open_regular(path) as f:
                data = f.read()
            body, checked = summed.loads(data, path)
        except seg.Damaged:
            raise
        except (OSError, ValueError):
            return None
        if not isinstance(body, dict):
            return None
        if not checked and (body.get("format") == FORMAT or "crc32" in body):
            # Its checksum's own place damaged: the rest of it is unchecked.
            raise seg.Damaged(f"{path} has lost its checksum")
        if body.get("format") != (FORMAT if checked else FORMAT_UNSUMMED):
            return None
        if body.get("config") != self.config and not any_config:
            return None
        return body

    def _segments(self, body: dict[str, Any]) -> Loaded | None:
        try:
            segments = [seg.read(os.path.join(self.dir, n)) for n in body["segments"]]
            for s in segments:
                seg.check(s)
            records, kinds, latest = int(body["records"]), list(body["kinds"]), int(body["latest"])
        except seg.Damaged:
            raise  # a ValueError, but one the caller reports before indexing anew
        except _UNREADABLE:
            return None
        expected = 0
        for s in segments:
            if s.base != expected:
                return None
            expected += s.count
        if expected != records:
            return None
        position = {k: v for k, v in body.items() if k not in _STRUCTURE}
        return Loaded(segments, [], kinds, latest, expected, position)

    def _remove_unlisted(self, keep: set[str], keep_manifest: bool = False) -> None:
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            if name == MANIFEST and keep_manifest:
                continue
            if name not in keep and (name.startswith("seg-") or name.endswith(".tmp")
                                     or name == MANIFEST):
                try:
                    os.unlink(os.path.join(self.dir, name))
                except OSError:
                    pass
