"""The event log as a Recall source, over the wire: search, expand, health, deletes."""

from __future__ import annotations

import datetime as dt
import logging

import trio
from support.recall import FAR, req
from support.segments import array_span, flip_header_bit, flip_posting, without_checksums

from .conftest import call, expand, ids, init, result, say, search, served

T0 = dt.datetime(2026, 5, 2, 10, 0, tzinfo=dt.UTC)


def at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


async def test_search_finds_what_was_appended_and_expand_shows_it(tmp_path):
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            await say(log, "e1", "what did we decide about the checksum drill", at=at(0))
            await say(log, "e2", {"role": "model", "parts": [
                {"text": "We run the checksum drill weekly."}]}, author="planner", at=at(1))
            await say(log, "e3", "unrelated lunch order", at=at(2))
            manifest = await result(peer, init(db, tmp_path))
            assert manifest["adapter_id"] == "streamd-eventlog/1"
            assert manifest["sensitivity"] == "confidential"
            found = await result(peer, search(2, "checksum drill"))
            assert sorted(ids(found)) == ["e1", "e2"]
            e2 = next(c for c in found["candidates"] if c["source_record_id"] == "e2")
            assert e2["locator"] == "log:v2/e2"
            assert (e2["record_type"], e2["title"]) == (
                "model_message", "We run the checksum drill weekly.")
            assert e2["metadata"] == {"actor": "planner", "app": "chat", "seq": 2,
                                      "session": "s1", "user": "u1"}
            assert e2["event_time"] == "2026-05-02T10:01:00Z"
            shown = await result(peer, expand(3, "log:v2/e2"))
            assert "We run the checksum drill weekly." in shown["content"]
            assert shown["provenance"] == "event log seq 2 (v2/e2)"


async def test_app_user_session_branch_and_invocation_are_exact_identifiers(tmp_path):
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            await say(log, "e1", "alpha", app="billing", user="ann", session="s-77",
                      branch="fork-a", invocation="inv-9")
            await say(log, "e2", "beta", app="chat", user="bob", session="s-78")
            await result(peer, init(db, tmp_path))
            for n, key in enumerate(["billing", "ann", "s-77", "fork-a", "inv-9"], start=2):
                found = await result(peer, search(n, key))
                assert ids(found) == ["e1"], key
                assert found["candidates"][0]["match_signals"] == ["exact_identifier"]
            assert ids(await result(peer, search(9, "bob"))) == ["e2"]


async def test_an_append_acknowledged_before_a_search_is_found_by_it(tmp_path):
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            await say(log, "e1", "first")
            await result(peer, init(db, tmp_path))
            assert ids(await result(peer, search(2, "first"))) == ["e1"]
            for n in range(3, 8):
                # No waiting: the acknowledgement is all the search needs.
                await say(log, f"n{n}", f"fresh marker{n}")
                assert ids(await result(peer, search(n, f"marker{n}"))) == [f"n{n}"]


async def test_health_says_how_far_the_index_has_read(tmp_path):
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            for i in range(3):
                await say(log, f"e{i}", f"event {i}", at=at(i))
            await result(peer, init(db, tmp_path))
            h = await result(peer, req(2, "recall/health", deadline=FAR))
            assert h["status"] == "healthy" and h["coverage"] == "complete"
            assert h["source_watermark"] == "seq=3 events=3 latest=2026-05-02T10:02:00Z"
            assert h["diagnostics"] == {"seq": 3}
            await say(log, "e9", "later", at=at(9))
            h = await result(peer, req(3, "recall/refresh", deadline=FAR))
            assert h["index_watermark"] == "seq=4 events=4 latest=2026-05-02T10:09:00Z"
            assert h["index_generation"] == "gen-2"


async def test_a_deleted_session_is_never_found_and_its_locators_expire(tmp_path):
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            await say(log, "keep", "drill notes", session="s-keep")
            await say(log, "gone1", "drill secrets", session="s-gone")
            await say(log, "gone2", "more drill", session="s-gone")
            await result(peer, init(db, tmp_path))
            assert sorted(ids(await result(peer, search(2, "drill")))) == [
                "gone1", "gone2", "keep"]
            await log.delete_session("chat", "u1", "s-gone")
            assert ids(await result(peer, search(3, "drill"))) == ["keep"]
            answer = await call(peer, expand(4, "log:v2/gone1"))
            assert answer["error"]["code"] == -32003, answer  # locator_expired
            h = await result(peer, req(5, "recall/health", deadline=FAR))
            assert h["diagnostics"] == {"removed": 2, "seq": 3}
            assert h["source_watermark"].startswith("seq=3 events=1 ")


async def test_events_retention_removed_leave_the_index(tmp_path):
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            for i in range(5):
                await say(log, f"e{i}", f"ticket {i}", at=at(i))
            await result(peer, init(db, tmp_path))
            assert len(ids(await result(peer, search(2, "ticket")))) == 5
            await log.set_retention("chat", max_events=2)
            compacted = await log.compact("chat")
            assert compacted.events_deleted == 3
            assert sorted(ids(await result(peer, search(3, "ticket")))) == ["e3", "e4"]


async def test_settings_choose_what_is_indexed(tmp_path):
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            await say(log, "a1", "note", app="a", author="user")
            await say(log, "a2", "note", app="a", author="tool")
            await say(log, "b1", "note", app="b", author="user", branch="exp-1")
            await say(log, "b2", "note", app="b", author="user", branch="main")
            await result(peer, init(db, tmp_path / "w1", apps=["a"], authors=["user"]))
            assert ids(await result(peer, search(2, "note"))) == ["a1"]
            await result(peer, init(db, tmp_path / "w2", id=3, branch_prefixes=["exp"]))
            assert ids(await result(peer, search(4, "note"))) == ["b1"]
            await result(peer, init(db, tmp_path / "w3", id=5, max_candidates=2))
            assert len(ids(await result(peer, search(6, "note")))) == 2


async def test_a_bad_handshake_says_why_and_names_no_secret(tmp_path):
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with served(db) as (peer, _):
            answer = await call(peer, init(db, tmp_path, apps="chat"))
            assert answer["error"]["code"] == -32602
            assert answer["error"]["message"] == (
                "eventlog settings: Expected `array | null`, got `str` - at `$.apps`")
            answer = await call(peer, init(tmp_path / "nope.db", tmp_path, id=2))
            assert answer["error"]["message"] == (
                "eventlog location: no event log database there "
                "(a file path that does not exist is refused, not created)")
            assert not (tmp_path / "nope.db").exists()
            answer = await call(peer, init("", tmp_path, id=3))
            assert answer["error"]["code"] == -32602
            hidden = "postgresql://ann:hunter2@127.0.0.1:1/log?connect_timeout=1"
            await result(peer, init(hidden, tmp_path, id=4))
            h = await result(peer, req(5, "recall/health", deadline=FAR))
            assert (h["status"], h["coverage"]) == ("unavailable", "unknown")
            answer = await call(peer, search(6, "x"))
            assert "error" in answer
            assert "hunter2" not in str(answer) and "hunter2" not in str(h)


async def test_a_restart_adopts_the_saved_index_and_reads_only_what_came_after(tmp_path):
    db, work = tmp_path / "events.db", tmp_path / "work"
    work.mkdir()
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            await say(log, "e1", "before the restart")
            await result(peer, init(db, work))
            await result(peer, search(2, "restart"))
            await say(log, "e2", "also before the restart")
            h = await result(peer, req(3, "recall/refresh", deadline=FAR))
            assert h["index_generation"] == "gen-2"
        async with served(db) as (peer, log):
            await say(log, "e3", "after the restart")
            await result(peer, init(db, work))
            h = await result(peer, req(2, "recall/refresh", deadline=FAR))
            # Generation names continue from the saved index, which only an
            # adopted one knows; and what it reads is the one event after it.
            assert h["index_generation"] == "gen-3"
            assert h["diagnostics"] == {"seq": 3}
            assert sorted(ids(await result(peer, search(3, "restart")))) == ["e1", "e2", "e3"]


async def _zebra_and_yak_indexed(peer, log, db, work):
    """Two events, one holding "zebra", and the source initialized over them."""
    await say(log, "e1", "zebra crossing")
    await say(log, "e2", "yak shaving")
    await result(peer, init(db, work))


async def _searched_after_damage(tmp_path, caplog, term: str, damage):
    """Two events indexed (:func:`_zebra_and_yak_indexed`) and ``term``
    searched; ``damage(work)`` done to the saved index (it gives the file it
    damaged); the source served again over it and ``term`` searched. The
    file, the hits before, the answer after and the warnings logged."""
    db, work = tmp_path / "events.db", tmp_path / "work"
    work.mkdir()
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            await _zebra_and_yak_indexed(peer, log, db, work)
            before = ids(await result(peer, search(2, term)))
        damaged = damage(work)
        with caplog.at_level(logging.WARNING, logger="streamd.recall.eventlog"):
            async with served(db) as (peer, log):
                await result(peer, init(db, work))
                after = await result(peer, search(2, term))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return damaged, before, after, warned


def _segment(work):
    (segment,) = (work / "index").glob("seg-*")
    return segment


async def test_a_saved_index_with_a_flipped_posting_is_indexed_again_at_restart(
        tmp_path, caplog):
    # One bit of a posting list, and a search for "zebra" answered e2 (the
    # event next to the one that holds it) at every restart.
    def posting(work):
        flip_posting(_segment(work), "zebra")

    _, before, after, warned = await _searched_after_damage(tmp_path, caplog, "zebra", posting)
    assert before == ids(after) == ["e1"]
    assert any("the saved event-log index is damaged" in m and "its recs do not match" in m
               for m in warned), warned


async def test_a_saved_index_with_a_flipped_bit_in_a_header_is_indexed_again_at_restart(
        tmp_path, caplog):
    # The record numbers' element type read '>u4' for '<u4': the index was
    # adopted and every posting read byte-swapped, from bytes that match
    # their checksum (record 0 is the same either way; record 1 is not).
    def byte_order(work):
        flip_header_bit(segment := _segment(work), "recs", "dtype")
        return segment

    segment, before, after, warned = await _searched_after_damage(
        tmp_path, caplog, "yak", byte_order)
    assert before == ids(after) == ["e2"] and after["candidates"][0]["relevance"] > 0
    assert any("the saved event-log index is damaged" in m
               and f"{segment}: its header does not match its checksum" in m
               for m in warned), warned


async def test_a_saved_position_with_a_flipped_bit_in_its_removed_mask_is_not_adopted(
        tmp_path, caplog):
    # The mask of removed events is saved in the manifest, base64: its
    # first letter's case flipped ('A' to 'a') marked e2 removed, and the
    # adopted index no longer found it (the position's other checks, its
    # seq and the id of the event there, do not read the mask).
    def mask(work):
        manifest = work / "index" / "manifest.json"
        data = manifest.read_bytes()
        at = data.index(b'"removed": "') + len(b'"removed": "')
        assert data[at:at + 1] == b"A"  # no event removed
        manifest.write_bytes(data[:at] + b"a" + data[at + 1:])
        return manifest

    manifest, before, after, warned = await _searched_after_damage(tmp_path, caplog, "yak", mask)
    assert before == ids(after) == ["e2"]
    assert any("the saved event-log index is damaged" in m
               and f"{manifest} does not match its checksum" in m for m in warned), warned


async def test_a_saved_index_refused_half_way_through_its_adoption_is_not_built_on(tmp_path):
    # Segments written before checksums, the second one's ids damaged: the
    # adoption took the first segment's records before it refused the index
    # and replaced it, and the round went on with the half-adopted one it
    # had taken first: 3 events indexed as 5, each id of the first segment
    # twice, beside postings that knew them once.
    db, work = tmp_path / "events.db", tmp_path / "work"
    work.mkdir()
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            await _zebra_and_yak_indexed(peer, log, db, work)
            await result(peer, search(2, "zebra"))
            await say(log, "e3", "zebra again")
            await result(peer, req(3, "recall/refresh", deadline=FAR))
        segments = sorted((work / "index").glob("seg-*"))
        assert len(segments) == 2
        for segment in segments:
            without_checksums(segment)
        _, _, at = array_span(segments[1], "ids")
        data = bytearray(segments[1].read_bytes())
        data[at] = 0  # its ids no longer decode
        segments[1].write_bytes(bytes(data))
        async with served(db) as (peer, log):
            await result(peer, init(db, work))
            found = await result(peer, search(2, "zebra"))
            assert found["diagnostics"]["indexed"] == 3
            assert ids(found) == ["e3", "e1"]


async def test_a_round_that_indexes_many_events_trims_the_heap(tmp_path, monkeypatch):
    from streamd import heap

    trims: list[None] = []
    monkeypatch.setattr(heap, "TRIM_RECORDS", 3)
    monkeypatch.setattr(heap, "release", lambda: trims.append(None) or True)
    db = tmp_path / "events.db"
    with trio.fail_after(20):
        async with served(db) as (peer, log):
            for i in range(4):
                await say(log, f"e{i}", f"note number {i}", at=at(i))
            await result(peer, init(db, tmp_path))
            await result(peer, search(2, "note"))
            assert len(trims) == 1  # four events from nothing
            await say(log, "e9", "one more note", at=at(9))
            assert "e9" in ids(await result(peer, search(3, "note")))
            assert len(trims) == 1  # one event: not worth a trim
