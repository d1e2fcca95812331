"""A segment on disk: what a search reads of it, and what stays mapped."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest
from support.segments import flip_low_bit

from streamd.recall.index import segfile
from streamd.recall.index import segment as seg
from streamd.recall.index.index import Index
from streamd.recall.persist.atomic import write_atomic


def _built() -> seg.Segment:
    b = seg.SegmentBuilder(base=100)
    for i in range(300):
        text = [f"w{i % 17}", f"w{i % 5}", "common"] + ["many"] * (70 if i % 50 == 0 else 1)
        b.add(f"id-{i}", (i, 0, i, 0, 1, 0, 0, i * 10, 9), text, [f"f{i % 3}"], ["t"],
              {f"ref-{i % 7}", f"id-{i}"})
    return b.seal()


def _mapped(arr: np.ndarray) -> bool:
    base = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None) if isinstance(base, np.ndarray) else getattr(
            base, "obj", None)
    return False


def _on_disk(tmp_path, s: seg.Segment) -> seg.Segment:
    tmp_path.mkdir(exist_ok=True)
    path = str(tmp_path / "s.seg")
    write_atomic(path, seg.encode(s))
    return seg.read(path)


def test_a_segment_read_from_disk_answers_as_the_one_in_memory(tmp_path):
    mem = _built()
    disk = _on_disk(tmp_path, mem)
    assert disk.file is not None
    assert len(mem.big_pos)  # "many" 70 times saturates its count
    for h in mem.term_hash.tolist():
        local = disk.find(np.uint64(h))
        assert local == mem.find(np.uint64(h)) >= 0
        got, want = disk.postings(local), mem.postings(local)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert got[2] == want[2]
        pos = got[2] + np.arange(len(got[0]))
        assert np.array_equal(disk.exact_count(pos, got[1]), mem.exact_count(pos, want[1]))
    assert disk.find(np.uint64(seg.term_hash("absent"))) == -1
    for key in ["ref-3", "id-7", "nothing"]:
        h = np.uint64(seg.term_hash(key))
        assert np.array_equal(disk.identified(h), mem.identified(h))
    assert disk.id_list() == mem.id_list()


def test_identifier_records_of_a_segment_on_disk_are_read_not_mapped(tmp_path):
    disk = _on_disk(tmp_path, _built())
    assert _mapped(disk.recs)  # the mapping is still there for whole-array passes
    assert not _mapped(disk.identified(np.uint64(seg.term_hash("ref-3"))))


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="Linux's /proc")
def test_an_index_adopting_a_segment_leaves_none_of_its_ids_and_columns_mapped(tmp_path):
    mem = _built()
    disk = _on_disk(tmp_path, mem)
    index = Index()
    index.adopt([disk], ["note"])
    assert list(index.ids) == mem.id_list()
    assert np.array_equal(index.columns.view(mem.count), mem.columns)
    assert _resident_pages(disk.columns) == 0 and _resident_pages(disk.ids) == 0


def test_short_postings_are_read_and_long_ones_mapped(tmp_path, monkeypatch):
    disk = _on_disk(tmp_path, _built())
    local = disk.find(np.uint64(seg.term_hash("common")))
    recs, meta, _ = disk.postings(local)
    assert len(recs) == 300 < segfile.READ_POSTINGS
    assert not _mapped(recs) and not _mapped(meta)
    monkeypatch.setattr(seg, "READ_POSTINGS", 300)
    recs, meta, _ = disk.postings(local)
    assert _mapped(recs) and _mapped(meta)


def _resident_pages(arr: np.ndarray) -> int:
    """Pages of ``arr`` mapped into this process (Linux's pagemap)."""
    page = mmap.PAGESIZE
    first = arr.ctypes.data // page
    last = (arr.ctypes.data + arr.nbytes - 1) // page
    with open("/proc/self/pagemap", "rb", buffering=0) as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first + 1) * 8), dtype=np.uint64)
    return int((entries >> np.uint64(63)).sum())


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="Linux's /proc")
def test_postings_read_through_the_mapping_are_dropped_past_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(seg, "READ_POSTINGS", 0)  # every list is long
    one = _on_disk(tmp_path, _built())
    assert one.file is not None
    h = np.uint64(seg.term_hash("common"))
    recs, _, _ = one.postings(one.find(h))
    assert int(recs.sum()) == sum(range(100, 400))
    assert _resident_pages(recs) > 0
    monkeypatch.setattr(segfile, "MAPPED_BUDGET", 1 << 40)
    assert not segfile.keep_within([one.file])
    assert _resident_pages(recs) > 0  # within the budget: left mapped
    monkeypatch.setattr(segfile, "MAPPED_BUDGET", -1)
    drops = segfile._mapped.drops
    assert segfile.keep_within([one.file])
    assert segfile._mapped.drops == drops + 1
    assert _resident_pages(recs) == 0  # dropped from the process...
    assert int(recs.sum()) == sum(range(100, 400))  # ...and read again from the page cache


def test_a_segment_file_removed_while_held_is_still_read(tmp_path):
    disk = _on_disk(tmp_path, _built())
    os.unlink(disk.path)  # a merge retired it while an older View reads it
    recs, _, _ = disk.postings(disk.find(np.uint64(seg.term_hash("common"))))
    assert len(recs) == 300


def test_a_rebased_segment_numbers_its_records_from_the_new_base_wrapping_as_uint32():
    s = _built()  # records 100..399
    kinds = np.zeros(1, dtype=np.int32)
    up = seg.rebased(s, 1_000, kinds)
    assert up.base == 1_000 and up.recs.dtype == np.uint32
    assert (up.recs.astype(np.int64) == s.recs.astype(np.int64) + 900).all()
    assert set(up.ident_rec.tolist()) == set(range(1_000, 1_300))
    # Record numbers are stored as uint32: past 2**32 - 1 they wrap, as
    # the builders' casts do; a lower base shifts them down.
    high = seg.rebased(s, 2**32 - 150, kinds)
    assert high.recs.max() == 2**32 - 1 and high.recs.min() == 0
    assert sorted(set(high.recs.tolist()))[:2] == [0, 1]
    down = seg.rebased(s, 0, kinds)
    assert (down.recs.astype(np.int64) == s.recs.astype(np.int64) - 100).all()


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="Linux's /proc")
def test_the_checks_at_adoption_read_every_array_yet_leave_none_mapped(tmp_path):
    disk = _on_disk(tmp_path, _built())
    seg.check(disk)
    for name, arr in disk.arrays().items():
        assert _resident_pages(arr) == 0, name
    # What it read was the postings too: one flipped bit there is seen.
    path = tmp_path / "s.seg"
    flip_low_bit(path, "recs")
    with pytest.raises(seg.Damaged, match="its recs do not match their checksums"):
        seg.check(seg.read(str(path)))


def test_a_segment_cut_short_after_it_was_opened_is_damaged_not_an_error(tmp_path):
    # The checksums are read after the file was opened and mapped: a file
    # shortened meanwhile is damage for the caller to report (an OSError was
    # not: the index was built anew without a word).
    disk = _on_disk(tmp_path, _built())
    os.truncate(tmp_path / "s.seg", os.path.getsize(tmp_path / "s.seg") // 2)
    with pytest.raises(seg.Damaged, match="cannot be read to check it"):
        seg.check(disk)
