"""Catch-up by byte offset: appends, partial lines, rewrites, missing and
unreadable files, failed lines, checkpoints and path containment.

The adapter is driven the way the refresh scanner drives it (build only when
a file differs from its cursor), on real files in a temporary directory.
"""

from __future__ import annotations

import json
import os

import pytest

from streamd.errors import INVALID_PARAMS, SOURCE_UNAVAILABLE, RpcError
from streamd.recall.adapter import SAVE_RETRY_NS
from streamd.recall.records import MAX_LINE_BYTES


def titles(result) -> list[str]:
    return [c["title"] for c in result["candidates"]]


def at(minute: int) -> str:
    return f"2026-05-02T10:{minute:02d}:00Z"


def sized_line(w, size: int, id: str = "big") -> bytes:
    """A record line of exactly ``size`` bytes before its newline."""
    base = w.rec(id, at(0), title="big", text="")[:-1]
    pad = size - len(base)
    assert pad >= 0
    return w.rec(id, at(0), title="big", text="x" * pad)[:-1]


# --- appends ----------------------------------------------------------------------


def test_an_append_between_searches_is_indexed_in_a_new_generation(recall_world):
    w = recall_world
    first, second = w.rec("r1", at(0), title="one"), w.rec("r2", at(1), title="two")
    w.write("a.jsonl", first, second)
    adapter = w.adapter()
    before = w.search(adapter, "")
    assert before["diagnostics"]["generation"] == "gen-1"
    assert before["source_watermark"] == (
        f"bytes={len(first) + len(second)} records=2 latest=2026-05-02T10:01:00Z"
    )

    third = w.rec("r3", at(2), title="three")
    w.append("a.jsonl", third)
    after = w.search(adapter, "")
    assert after["diagnostics"]["generation"] == "gen-2"
    assert after["diagnostics"]["indexed"] == 3
    assert titles(after) == ["three", "two", "one"]
    offsets = {c["title"]: c["metadata"]["byte_offset"] for c in after["candidates"]}
    assert offsets == {"one": 0, "two": len(first), "three": len(first) + len(second)}
    assert after["source_watermark"] == (
        f"bytes={len(first) + len(second) + len(third)} records=3 latest=2026-05-02T10:02:00Z"
    )


def test_an_unchanged_stream_keeps_its_generation(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="one"))
    adapter = w.adapter()
    assert w.search(adapter, "")["diagnostics"]["generation"] == "gen-1"
    assert w.search(adapter, "one")["diagnostics"]["generation"] == "gen-1"
    assert w.current(adapter).name == "gen-1"
    # A full refresh always builds.
    assert w.current(adapter, full=True).name == "gen-2"


def test_a_partial_last_line_is_not_consumed_until_its_newline_arrives(recall_world):
    w = recall_world
    first = w.rec("r1", at(0), title="one")
    second = w.rec("r2", at(1), title="two halves")
    w.write("a.jsonl", first, second[:20])
    adapter = w.adapter()
    result = w.search(adapter, "")
    assert titles(result) == ["one"]
    assert result["diagnostics"]["failed_records"] == 0
    assert result["source_watermark"].startswith(f"bytes={len(first)} records=1 ")

    w.append("a.jsonl", second[20:-1])  # everything but the newline
    assert titles(w.search(adapter, "")) == ["one"]

    w.append("a.jsonl", b"\n")
    result = w.search(adapter, "")
    assert titles(result) == ["two halves", "one"]
    assert result["candidates"][0]["metadata"]["byte_offset"] == len(first)
    assert result["diagnostics"]["failed_records"] == 0


def test_a_pending_partial_line_makes_every_catch_up_a_new_generation(recall_world):
    # The file size differs from the cursor, so the reference rebuilds each time;
    # the generation numbers must match its numbering.
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="one"), b'{"schema":2')
    adapter = w.adapter()
    assert [w.search(adapter, "")["diagnostics"]["generation"] for _ in range(3)] == [
        "gen-1", "gen-2", "gen-3",
    ]


def test_blank_lines_are_skipped_and_not_failed(recall_world):
    w = recall_world
    blanks = b"\n   \n\t\r\n" + "\u00a0\u3000\n".encode()
    w.write("a.jsonl", blanks, w.rec("r1", at(0), title="one"), b"\n\n")
    result = w.search(w.adapter(), "")
    assert titles(result) == ["one"]
    assert result["candidates"][0]["metadata"]["byte_offset"] == len(blanks)
    assert result["diagnostics"]["failed_records"] == 0
    assert result["outcome"] == "success"


def test_a_file_configured_twice_is_read_twice(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="one"))
    result = w.search(w.adapter(["a.jsonl", "a.jsonl"]), "one")
    assert titles(result) == ["one", "one"]
    assert result["diagnostics"]["indexed"] == 2


# --- failed lines -------------------------------------------------------------------


def test_bad_lines_count_as_failed_and_never_fail_the_scan(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("r1", at(0), title="one"),
        b"not json\n",
        w.rec("r2", at(1), schema=3, title="future"),
        w.rec("r3", at(2), title="three"),
    )
    adapter = w.adapter()
    result = w.search(adapter, "")
    assert titles(result) == ["three", "one"]
    assert result["outcome"] == "partial"
    d = result["diagnostics"]
    assert (d["failed_records"], d["coverage"], d["indexed"]) == (2, "partial", 2)
    health = w.health(adapter)
    assert (health["status"], health["coverage"]) == ("degraded", "partial")
    assert (health["record_count"], health["indexed_count"], health["failed_count"]) == (4, 2, 2)


def test_a_line_of_exactly_one_mebibyte_is_a_record_and_one_byte_more_fails(recall_world):
    w = recall_world
    at_limit = sized_line(w, MAX_LINE_BYTES, "at-limit")
    over = sized_line(w, MAX_LINE_BYTES + 1, "over")
    # Surrounding white space is trimmed before the size is checked.
    after = w.rec("after", at(5), title="after")
    w.write("a.jsonl", b"  " + at_limit + b" \n", over + b"\n", after)
    result = w.search(w.adapter(), "")
    assert [c["source_record_id"] for c in result["candidates"]] == ["after", "at-limit"]
    assert result["diagnostics"]["failed_records"] == 1


def test_a_line_far_over_the_limit_fails_and_later_lines_index_at_their_offsets(recall_world):
    w = recall_world
    huge = b'{"junk":"' + b"y" * (3 << 20) + b'"}\n'  # spans several read chunks
    later = w.rec("after", at(5), title="after")
    w.write("a.jsonl", w.rec("before", at(0), title="before"), huge, later)
    result = w.search(w.adapter(), "after")
    (c,) = result["candidates"]
    before_len = len(w.rec("before", at(0), title="before"))
    assert c["metadata"]["byte_offset"] == before_len + len(huge)
    assert result["diagnostics"]["failed_records"] == 1
    assert result["diagnostics"]["indexed"] == 2


# --- rewrites -----------------------------------------------------------------------


def test_a_shrunk_file_is_rebuilt_in_full_and_reported_as_rewritten(recall_world):
    w = recall_world
    w.write("a.jsonl", *(w.rec(f"r{i}", at(i), title=f"old {i}") for i in range(3)))
    adapter = w.adapter()
    assert w.search(adapter, "")["diagnostics"]["indexed"] == 3
    w.write("a.jsonl", w.rec("n1", at(9), title="new"))
    result = w.search(adapter, "")
    assert titles(result) == ["new"]
    assert result["diagnostics"]["generation"] == "gen-2"
    health = w.health(adapter)
    assert health["status"] == "degraded"
    assert health["diagnostics"]["stream_rewritten"] is True
    # The next ordinary append is an ordinary generation again.
    w.append("a.jsonl", w.rec("n2", at(10), title="newer"))
    assert titles(w.search(adapter, "")) == ["newer", "new"]
    health = w.health(adapter)
    assert health["status"] == "healthy"
    assert "stream_rewritten" not in health["diagnostics"]


def test_a_file_gone_after_being_read_is_a_rewrite_and_a_missing_file(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("a1", at(0), title="from a"))
    w.write("b.jsonl", w.rec("b1", at(1), title="from b"))
    adapter = w.adapter(["a.jsonl", "b.jsonl"])
    assert titles(w.search(adapter, "")) == ["from b", "from a"]
    w.path("b.jsonl").unlink()
    result = w.search(adapter, "")
    assert titles(result) == ["from a"]
    assert result["outcome"] == "partial"
    assert result["diagnostics"]["missing_files"] == ["b.jsonl"]
    health = w.health(adapter)
    assert health["diagnostics"]["stream_rewritten"] is True
    assert health["diagnostics"]["missing_files"] == ["b.jsonl"]
    assert (health["status"], health["coverage"]) == ("degraded", "partial")


def test_the_only_file_gone_for_a_while_and_put_back_as_it_was_keeps_its_generation(
    recall_world,
):
    # As in the reference: the catch-up that found it gone failed (no file is
    # readable) and published nothing, and once it is back nothing changed.
    # Before, that catch-up's finding stuck: the next one indexed the stream
    # anew and reported it rewritten (degraded).
    w = recall_world
    p = w.write("a.jsonl", w.rec("a1", at(0), title="one"), w.rec("a2", at(1), title="two"))
    adapter = w.adapter()
    assert w.current(adapter).name == "gen-1"
    kept = p.read_bytes()
    p.unlink()
    with pytest.raises(RpcError) as err:
        w.current(adapter)
    assert err.value.message == "no configured stream file is readable (a.jsonl)"
    p.write_bytes(kept)
    assert w.current(adapter).name == "gen-1"
    health = w.health(adapter)
    assert (health["status"], health["diagnostics"]) == ("healthy", {"files": 1})
    # Put back with other bytes, it is a rewrite again.
    p.unlink()
    with pytest.raises(RpcError):
        w.current(adapter)
    p.write_bytes(w.rec("b1", at(0), title="six") + w.rec("b2", at(1), title="seven"))
    assert titles(w.search(adapter, "")) == ["seven", "six"]
    assert w.health(adapter)["diagnostics"]["stream_rewritten"] is True


def test_a_file_that_shrank_between_processes_is_reported_on_the_first_build(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="one"), w.rec("r2", at(1), title="two"))
    w.current(w.adapter())
    w.write("a.jsonl", w.rec("r1", at(0), title="one"))
    fresh = w.adapter()
    generation = w.current(fresh)
    assert w.health(fresh, generation)["diagnostics"].get("stream_rewritten") is True


# --- duplicate identities ---------------------------------------------------------------


def test_a_repeated_identity_is_searched_twice_but_expands_to_the_later_line(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("dup", at(0), title="alpha earlier"),
        w.rec("dup", at(1), title="alpha later"),
    )
    adapter = w.adapter()
    assert titles(w.search(adapter, "alpha")) == ["alpha later", "alpha earlier"]
    assert w.expand(adapter, "v2/dup", "summary")["content"].startswith("alpha later\n")
    # Even when the later line is the older event.
    w.append("a.jsonl", w.rec("dup", "2026-05-01T00:00:00Z", title="alpha latest line"))
    assert w.expand(adapter, "v2/dup", "summary")["content"].startswith("alpha latest line\n")


# --- checkpoints -----------------------------------------------------------------------


def test_the_checkpoint_describes_the_published_generation(recall_world):
    w = recall_world
    line = w.rec("r1", at(0), title="one")
    w.write("a.jsonl", line, b"garbage\n")
    adapter = w.adapter(["a.jsonl", "missing.jsonl"])
    w.current(adapter)
    cp = json.loads((w.work / "cursor.json").read_text())
    size = len(line) + len(b"garbage\n")
    assert cp == {
        "generation": 1,
        "updated_at": "2027-01-15T08:00:00Z",
        "source_watermark": f"bytes={size} records=1 latest=2026-05-02T10:00:00Z",
        "files": [
            {"path": str(w.path("a.jsonl")), "offset": size, "records": 1, "failed": 1,
             "missing": False},
            {"path": str(w.path("missing.jsonl")), "offset": 0, "records": 0, "failed": 0,
             "missing": True},
        ],
    }
    # No temporary left behind: the checkpoint, the durable index and the
    # workdir's writer lock only.
    assert sorted(os.listdir(w.work)) == ["cursor.json", "index", "streamd.lock"]
    assert not [n for n in os.listdir(os.path.join(w.work, "index")) if n.endswith(".tmp")]


def test_generations_continue_from_the_checkpoint_across_adapter_instances(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="one"))
    first = w.adapter()
    w.current(first)
    w.append("a.jsonl", w.rec("r2", at(1), title="two"))
    assert w.current(first).name == "gen-2"

    second = w.adapter()
    result = w.search(second, "")
    assert result["diagnostics"]["generation"] == "gen-3"
    # A new process reads the files whole, whatever the checkpoint says.
    assert titles(result) == ["two", "one"]
    assert json.loads((w.work / "cursor.json").read_text())["generation"] == 3


def test_a_missing_workdir_is_not_created_and_health_says_checkpoint_unwritable(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="one"))
    nowhere = w.root / "no-such-workdir"
    adapter = w.adapter(workdir=str(nowhere))
    assert titles(w.search(adapter, "one")) == ["one"]
    health = w.health(adapter)
    assert health["diagnostics"]["checkpoint_unwritable"] is True
    assert health["status"] == "degraded"
    assert not nowhere.exists()


def test_a_failed_save_is_retried_by_a_refresh_at_once_and_otherwise_after_a_pause(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="one"))
    later = w.root / "created-later"
    now = [1_800_000_000 * 10**9]
    adapter = w.adapter(workdir=str(later))
    adapter.clock = lambda: now[0]
    generation = w.current(adapter)
    assert w.health(adapter, generation)["diagnostics"]["checkpoint_unwritable"] is True
    assert (adapter.save_due(asked=True), adapter.save_due(asked=False)) == (True, False)
    now[0] += SAVE_RETRY_NS
    assert adapter.save_due(asked=False) is True

    later.mkdir()  # the host makes room
    adapter.save_again()
    health = w.health(adapter)
    assert (health["status"], health["index_generation"], health["diagnostics"]) == (
        "healthy", "gen-1", {"files": 1})
    assert adapter.save_due(asked=True) is False
    manifest = json.loads((later / "index" / "manifest.json").read_text())
    assert manifest["records"] == 1 and len(manifest["segments"]) == 1
    assert json.loads((later / "cursor.json").read_text())["generation"] == 1
    # The generation now answers from the segment mapped back from disk.
    assert titles(w.search(adapter, "one")) == ["one"]
    assert adapter.generation.view.on_disk


# --- paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x.jsonl", "sub/../../x.jsonl", "./../data2/x.jsonl", ".."])
def test_a_relative_file_that_climbs_out_of_the_location_is_refused(recall_world, name):
    with pytest.raises(RpcError) as err:
        recall_world.adapter([name])
    assert err.value.code == INVALID_PARAMS
    assert err.value.message == (
        f'stream settings: file "{name}" resolves outside the configured location'
    )


def test_a_relative_file_that_stays_inside_is_allowed(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="one"))
    assert titles(w.search(w.adapter(["sub/../a.jsonl"]), "one")) == ["one"]


def test_an_absolute_file_outside_the_location_is_used_as_given(recall_world, tmp_path_factory):
    w = recall_world
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "far.jsonl"
    elsewhere.write_bytes(w.rec("far", at(0), title="far away"))
    result = w.search(w.adapter([str(elsewhere)]), "far")
    assert titles(result) == ["far away"]
    assert result["candidates"][0]["metadata"]["file"] == "far.jsonl"


def test_a_location_that_is_a_file_is_the_stream_when_no_files_are_listed(recall_world):
    w = recall_world
    p = w.write("only.jsonl", w.rec("r1", at(0), title="one"))
    w.write("sibling.jsonl", w.rec("r2", at(1), title="two"))
    assert titles(w.search(w.adapter([], location=str(p)), "")) == ["one"]
    # With files listed, they resolve against the file's directory.
    assert titles(w.search(w.adapter(["sibling.jsonl"], location=str(p)), "")) == ["two"]


# --- health and lifecycle -----------------------------------------------------------------


def test_health_of_a_complete_generation(recall_world):
    w = recall_world
    line = w.rec("r1", "2026-05-02T10:00:00.75Z", title="one")
    w.write("a.jsonl", line)
    adapter = w.adapter()
    watermark = f"bytes={len(line)} records=1 latest=2026-05-02T10:00:00Z"
    assert w.health(adapter, w.current(adapter)) == {
        "status": "healthy",
        "checked_at": "2027-01-15T08:00:00Z",
        "last_success_at": "2027-01-15T08:00:00Z",
        "source_watermark": watermark,
        "index_watermark": watermark,
        "index_generation": "gen-1",
        "index_config": "jsonl/1 tokenizer=ident-runs scoring=term-coverage",
        "record_count": 1,
        "indexed_count": 1,
        "coverage": "complete",
        "diagnostics": {"files": 1},
    }


def test_an_empty_stream_file_is_healthy_and_its_generation_is_saved(recall_world):
    w = recall_world
    p = w.write("s.jsonl")
    adapter = w.adapter([], location=str(p))
    assert w.health(adapter, w.current(adapter)) == {
        "status": "healthy",
        "checked_at": "2027-01-15T08:00:00Z",
        "last_success_at": "2027-01-15T08:00:00Z",
        "source_watermark": "bytes=0 records=0 latest=-",
        "index_watermark": "bytes=0 records=0 latest=-",
        "index_generation": "gen-1",
        "index_config": "jsonl/1 tokenizer=ident-runs scoring=term-coverage",
        "coverage": "complete",
        "diagnostics": {"files": 1},
    }
    assert json.loads((w.work / "index" / "manifest.json").read_text())["segments"] == []
    assert json.loads((w.work / "cursor.json").read_text())["generation"] == 1


def test_a_stream_whose_only_line_fails_is_partial_but_its_checkpoint_is_written(recall_world):
    w = recall_world
    p = w.write("s.jsonl", b"junk\n")
    adapter = w.adapter([], location=str(p))
    assert w.health(adapter, w.current(adapter)) == {
        "status": "degraded",
        "checked_at": "2027-01-15T08:00:00Z",
        "last_success_at": "2027-01-15T08:00:00Z",
        "source_watermark": "bytes=5 records=0 latest=-",
        "index_watermark": "bytes=5 records=0 latest=-",
        "index_generation": "gen-1",
        "index_config": "jsonl/1 tokenizer=ident-runs scoring=term-coverage",
        "record_count": 1,
        "failed_count": 1,
        "coverage": "partial",
        "diagnostics": {"files": 1},
    }
    assert json.loads((w.work / "index" / "manifest.json").read_text())["files"][0]["failed"] == 1


def test_a_stream_with_no_records_has_no_latest_time(recall_world):
    w = recall_world
    w.write("a.jsonl", b"\n", b"junk\n")
    result = w.search(w.adapter(), "")
    assert result["source_watermark"] == "bytes=6 records=0 latest=-"
    assert (result["candidates"], result["outcome"]) == ([], "partial")


def test_a_closed_adapter_refuses_to_build(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("r1", at(0), title="one"))
    adapter = w.adapter()
    w.current(adapter)
    adapter.close()
    with pytest.raises(RpcError) as err:
        w.current(adapter, full=True)
    assert err.value.code == SOURCE_UNAVAILABLE


def test_year_zero_events_index_and_print_while_earlier_instants_fail(recall_world):
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("y0", "0000-01-01T00:00:00Z", title="alpha"),
        # 00:30 at +01:00 is 23:30 UTC on the last day of year -1: not printable
        # as RFC 3339, so (a deliberate difference) the line fails at index time.
        w.rec("y-1", "0000-01-01T00:30:00+01:00", title="alpha"),
        w.rec("obs", at(0), title="alpha", observed_at="0000-01-01T00:00:00+00:01"),
    )
    result = w.search(w.adapter(), "alpha")
    assert [c["event_time"] for c in result["candidates"]] == ["0000-01-01T00:00:00Z"]
    assert result["diagnostics"]["failed_records"] == 2


def test_observed_at_defaults_to_the_build_that_first_indexed_the_record(recall_world):
    w = recall_world
    w.write("a.jsonl", w.rec("old", at(0), title="alpha"))
    adapter = w.adapter()
    adapter.clock = lambda: 1_800_000_000 * 1_000_000_000  # 2027-01-15T08:00:00Z
    w.current(adapter)
    w.append("a.jsonl", w.rec("new", at(1), title="alpha"))
    adapter.clock = lambda: 1_800_000_060 * 1_000_000_000  # one minute later

    def stamps(result):
        return {c["source_record_id"]: (c["observed_at"], c["confirmed_at"])
                for c in result["candidates"]}

    assert stamps(w.search(adapter, "alpha")) == {
        "old": ("2027-01-15T08:00:00Z", "2027-01-15T08:01:00Z"),
        "new": ("2027-01-15T08:01:00Z", "2027-01-15T08:01:00Z"),
    }
    # A full rebuild indexes everything again, first time over.
    adapter.clock = lambda: 1_800_000_120 * 1_000_000_000
    w.current(adapter, full=True)
    assert set(stamps(w.search(adapter, "alpha")).values()) == {
        ("2027-01-15T08:02:00Z", "2027-01-15T08:02:00Z"),
    }


@pytest.mark.parametrize("native", ["0", "1"])
def test_an_observed_at_of_gos_zero_time_is_none_so_the_build_time_is_stamped(
    recall_world, monkeypatch, native
):
    # The reference takes the zero instant, however written, for no
    # observed_at at all; it was shown as 0001-01-01T00:00:00Z.
    monkeypatch.setenv("STREAMD_NATIVE", native)
    w = recall_world
    w.write(
        "a.jsonl",
        w.rec("utc", at(0), title="alpha", observed_at="0001-01-01T00:00:00Z"),
        w.rec("offset", at(1), title="alpha", observed_at="0001-01-01T01:00:00+01:00"),
        w.rec("second", at(2), title="alpha", observed_at="0001-01-01T00:00:01Z"),
    )
    adapter = w.adapter()
    adapter.clock = lambda: 1_800_000_000 * 1_000_000_000  # 2027-01-15T08:00:00Z
    found = {c["source_record_id"]: c["observed_at"]
             for c in w.search(adapter, "alpha")["candidates"]}
    assert found == {
        "utc": "2027-01-15T08:00:00Z",
        "offset": "2027-01-15T08:00:00Z",
        "second": "0001-01-01T00:00:01Z",
    }


def test_failed_lines_stay_counted_across_incremental_builds(recall_world):
    w = recall_world
    w.write("a.jsonl", b"junk\n", w.rec("r1", at(0), title="one"))
    adapter = w.adapter()
    assert w.search(adapter, "")["diagnostics"]["failed_records"] == 1
    w.append("a.jsonl", w.rec("r2", at(1), title="two"), b"{}\n")
    result = w.search(adapter, "")
    assert (result["diagnostics"]["failed_records"], result["diagnostics"]["indexed"]) == (2, 2)
