"""The cyclic collector's pause is one for the whole process: overlapping
pauses on several threads leave the collector as the first one found it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from streamd import collector


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_a_pause_turns_the_collector_off_and_back_on() -> None:
    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_overlapping_pauses_on_two_threads_resume_the_collector_when_the_last_ends() -> None:
    """The interleaving that left the collector off for good when each pause
    remembered the collector's state for itself: one thread pauses, a second
    pauses (finding it off), the first ends, the second ends."""
    seen: dict[str, bool] = {}
    second_in, second_may_end = threading.Event(), threading.Event()

    def second() -> None:
        with collector.paused():
            second_in.set()
            second_may_end.wait(10)
            seen["second, after the first ended"] = gc.isenabled()

    other = threading.Thread(target=second)
    try:
        with collector.paused():
            other.start()
            assert second_in.wait(10)
        seen["after the first ended"] = gc.isenabled()
    finally:
        second_may_end.set()  # never left holding a pause into later tests
        other.join(10)
    assert seen == {"after the first ended": False, "second, after the first ended": False}
    assert gc.isenabled()


def test_a_pause_leaves_a_collector_the_caller_turned_off_off() -> None:
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()


def test_a_pause_ended_by_an_exception_resumes_the_collector() -> None:
    with pytest.raises(ValueError), collector.paused():
        raise ValueError("the work failed")
    assert gc.isenabled()
