"""A Recall build whose pace is the test's, not the machine's.

The long-build tests need a build that is still running when a request's
deadline comes. Making each line cost a millisecond raced the machine against
the deadline: on a loaded machine the first lines came late or the last ones
early. A :class:`BuildGate` instead holds the build *between its steps* (where
it publishes a prefix or stops): after ``free`` steps (none by default: the
first step's lines are read, then it waits), each next step waits
until a request asks the build to publish (it publishes, and waits again at the
step after) or the test opens the gate. What the tests assert then holds at
any speed: the build is exactly as far as the gate let it come.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio

from streamd.recall import adapter as adapter_module
from streamd.recall.index import build

STEP_LINES = 50
"""Lines in one step of the gated build (the plain path's slice)."""


class BuildGate:
    def __init__(self, free: int) -> None:
        self.free = free
        self.steps = 0
        self.publishes = True
        """False: the build is stuck between steps (a slow save, a loaded
        disk) and cannot publish what a request asks for."""
        self._open = threading.Event()
        self._holding = threading.Event()

    def between_steps(self, real: Callable[..., None]) -> Callable[..., None]:
        gate = self

        def gated(interim: Any, files: Any, cur: Any) -> None:
            gate.steps += 1
            if gate.steps > gate.free:
                asked = interim.adapter.publish_requested
                while not (gate._open.is_set() or (gate.publishes and asked.is_set())):
                    gate._holding.set()
                    # A wait on the gate, woken every 10 ms to see a request's
                    # ask; what the build has done does not depend on it.
                    gate._open.wait(0.01)
            real(interim, files, cur)

        return gated

    async def held(self) -> None:
        """Return once the build waits at the gate (it has read ``free + 1``
        steps and no more). A build starts with the first request that needs
        a generation, so one must have been sent."""
        with trio.fail_after(60):
            await trio.to_thread.run_sync(self._holding.wait, abandon_on_cancel=True)

    def open(self) -> None:
        """Let the build run to its end."""
        self._open.set()


def gate_builds(monkeypatch: pytest.MonkeyPatch, free: int = 0) -> BuildGate:
    """Every plain build of this test goes through one gate (the compiled path
    steps in larger blocks; the gate is on the plain one)."""
    gate = BuildGate(free)
    monkeypatch.setenv("STREAMD_NATIVE", "0")
    monkeypatch.setattr(build, "PLAIN_SLICE", STEP_LINES)
    monkeypatch.setattr(
        adapter_module._Interim,
        "between_steps",
        gate.between_steps(adapter_module._Interim.between_steps),
    )
    return gate
