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
    if was:
        gc.enable()  # a test may have turned it off (one does, on purpose)
    else:
        gc.disable()


def test_the_collector_is_paused_within_and_restored_after() -> None:
    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # an inner pause does not end the outer one
    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError), collector.paused():
        raise ZeroDivisionError
    assert gc.isenabled()


def test_a_pause_leaves_the_processs_frozen_objects_and_generations_alone() -> None:
    # A library must not move the objects of the process it runs in: what a
    # load made, and what the process froze, stay where the collector put them.
    class Made:  # tracked by the collector
        pass

    kept = Made()
    gc.freeze()  # someone's frozen heap
    try:
        frozen = gc.get_freeze_count()
        with collector.paused():
            young = Made()
        assert gc.get_freeze_count() == frozen
        assert not any(o is young for o in gc.get_objects(generation=2))
        assert not any(o is kept for o in gc.get_objects(generation=2))
    finally:
        gc.unfreeze()
    with collector.paused():
        made = Made()
    assert not any(o is made for o in gc.get_objects(generation=2))


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
