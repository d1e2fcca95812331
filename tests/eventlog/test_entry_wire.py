"""An entry's wire bytes from the compiled encoder are the Python path's, byte
for byte, for every row it takes; every other row it hands back, and the
Python path (the definition: ``rows.encode_entry``) writes it. Reads answer
the same bytes with ``STREAMD_NATIVE=0`` as without."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamd.eventlog.model import AppendParams, SessionGetParams, SinceParams
from streamd.eventlog.sqlite.store import SqliteStore
from streamd.eventlog.store import rows
from streamd.eventlog.store.backend import ReadShape

native = pytest.importorskip("streamd._native")

# Microseconds of 0001-01-01 and of 10000-01-01 from the epoch: Python's
# datetime holds the years between.
FIRST_US = -62_135_596_800_000_000
PAST_US = 253_402_300_800_000_000

_any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=16)
_text = st.text(max_size=16)  # what UTF-8 can hold: no lone surrogates


def row(**given: Any) -> tuple[Any, ...]:
    values = {
        "seq": 7, "app": "a", "user": "u", "session": "s", "id": "e1",
        "invocation": "inv", "author": "agent", "branch": "", "at_us": 1_796_544_599_477_460,
        "content": '{"text":"hi"}', "metadata": None, "delta": None,
    } | given  # fmt: skip
    return tuple(values.values())


@settings(max_examples=400, deadline=None)
@given(
    seq=st.integers(-(2**63), 2**63 - 1),
    app=_text, user=_text, session=_text, id=_text, invocation=_text, author=_text, branch=_text,
    at_us=st.integers(FIRST_US, PAST_US - 1) | st.sampled_from([0, FIRST_US, PAST_US - 1]),
    content=_text,
)  # fmt: skip
def test_a_common_row_is_written_as_the_python_path_writes_it(**given: Any) -> None:
    r = row(**given)
    assert native.encode_entry(r) == rows.encode_entry(r)


@settings(max_examples=200, deadline=None)
@given(
    strings=st.lists(_any_text, min_size=8, max_size=8),
    at_us=st.integers(),
    seq=st.integers(),
    metadata=st.none() | st.just('{"k":"v"}'),
    delta=st.none() | st.just('{"app":{"x":1}}'),
)
def test_any_row_the_compiled_encoder_takes_is_written_as_the_python_path_writes_it(
    strings: list[str], at_us: int, seq: int, metadata: str | None, delta: str | None
) -> None:
    app, user, session, id_, invocation, author, branch, content = strings
    r = row(
        seq=seq, app=app, user=user, session=session, id=id_, invocation=invocation,
        author=author, branch=branch, at_us=at_us, content=content, metadata=metadata,
        delta=delta,
    )  # fmt: skip
    wire = native.encode_entry(r)
    if wire is not None:
        assert wire == rows.encode_entry(r)


@pytest.mark.parametrize(
    "given",
    [
        {"metadata": '{"k":"v"}'},  # decoded and written again in Python
        {"delta": '{"app":{"x":1}}'},
        {"at_us": FIRST_US - 1},  # before year 1: the Python path renders it damaged
        {"at_us": PAST_US},
        {"at_us": 2**63},  # not a 64-bit integer
        {"seq": 2**64},
        {"seq": True},  # an int's subclass
        {"content": None},  # not text: damaged
        {"content": b"{}"},
        {"author": "\ud800"},  # a lone surrogate: no UTF-8 holds it
        {"app": 5},
    ],
)
def test_any_other_row_is_handed_back(given: dict[str, Any]) -> None:
    assert native.encode_entry(row(**given)) is None


def test_a_row_of_the_wrong_length_is_handed_back() -> None:
    assert native.encode_entry(row()[:11]) is None
    assert native.encode_entry((*row(), None)) is None


def test_the_read_path_falls_back_row_by_row(caplog: pytest.LogCaptureFixture) -> None:
    common, damaged = row(seq=1), row(seq=2, at_us=PAST_US)
    wire = rows.entry_encoder()
    with caplog.at_level(logging.WARNING):
        assert wire(common) == rows.encode_entry(common)
        assert wire(damaged) == rows.encode_entry(damaged)
    assert b'"damaged":["event.timestamp"]' in wire(damaged)


def test_the_plain_path_is_taken_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMD_NATIVE", "0")
    assert rows.entry_encoder() is rows.encode_entry


def fill(store: SqliteStore) -> None:
    events: list[dict[str, Any]] = [
        {"event": {"id": "plain", "author": "agent", "content": {"text": "hello"}}},
        {"event": {"id": "tabs\t\"quotes\"", "author": "é\u2028\x7f", "content": ["x", 1.5],
                   "branch": "root.sub", "invocation_id": "inv-1"}},
        {"event": {"id": "meta", "author": "agent", "content": None}, "metadata": {"k": "v"}},
        {"event": {"id": "delta", "author": "agent", "content": {}},
         "state_delta": {"app": {"n": 1}, "session": {"x": [1]}}},
        {"event": {"id": "whole-second", "author": "agent", "content": "t",
                   "timestamp": "2026-12-06T08:00:00Z"}},
        {"event": {"id": "old", "author": "agent", "content": "t",
                   "timestamp": "0001-01-01T00:00:00.000001Z"}},
    ]  # fmt: skip
    for i, extra in enumerate(events):
        p = msgspec.convert({"app": "a", "user": "u", "session": "s", **extra}, AppendParams)
        store.append(p, 1_796_544_599_000_000 + i)


def test_reads_answer_the_same_bytes_with_and_without_the_compiled_encoder(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore.open(str(tmp_path / "log.db"))
    try:
        fill(store)
        shape = ReadShape("encoded", 1 << 20)
        get = msgspec.convert({"app": "a", "user": "u", "session": "s"}, SessionGetParams)
        since = msgspec.convert({"from_seq": 0}, SinceParams)
        fast = (store.get_session(get, shape).events, store.since(since, shape).entries)
        monkeypatch.setenv("STREAMD_NATIVE", "0")
        plain = (store.get_session(get, shape).events, store.since(since, shape).entries)
    finally:
        store.close()
    assert [bytes(e) for e in fast[0]] == [bytes(e) for e in plain[0]]
    assert [bytes(e) for e in fast[1]] == [bytes(e) for e in plain[1]]
    assert len(fast[0]) == 6


@pytest.mark.parametrize("interface", ["", "ENTRY_INTERFACE = 0"])
def test_an_extension_of_another_interface_leaves_reads_on_the_python_path(
    interface: str,
) -> None:
    # An editable install whose extension predates the Python beside it:
    # its encoder (if any) may write other bytes, so it is not called.
    script = "\n".join([
        "import sys, types",
        "fake = types.ModuleType('streamd._native')",
        "fake.encode_entry = lambda row: b'{}'",
        f"exec({interface!r}, fake.__dict__)",
        "sys.modules['streamd._native'] = fake",
        "from streamd.eventlog.store import rows",
        "print(rows.entry_encoder() is rows.encode_entry)",
    ])  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.strip() == "True"
