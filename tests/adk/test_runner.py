"""ADK's own Runner drives a real LlmAgent on a scripted model, with streamd as its
session service: the run persists to the log and a later run, in a new process
of the daemon, resumes from it with the whole conversation and its state."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from pydantic import Field
from support.resident import World, make_world, point_clients_at

from streamd.adk import StreamdSessionService
from streamd.client import AsyncClient

pytestmark = pytest.mark.subprocess


class Scripted(BaseLlm):
    """A model that answers from a script and keeps what it was asked."""

    model: str = "scripted"
    script: list[LlmResponse] = Field(default_factory=list)
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        yield self.script.pop(0)


def call(name: str, **args: Any) -> LlmResponse:
    return LlmResponse(content=types.Content(
        role="model", parts=[types.Part(function_call=types.FunctionCall(name=name, args=args))]
    ))


def say(text: str) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def remember(fact: str, tool_context: ToolContext) -> dict[str, Any]:
    """Remember a fact about the user."""
    tool_context.state["user:fact"] = fact
    tool_context.state["app:remembered"] = tool_context.state.get("app:remembered", 0) + 1
    tool_context.state["temp:scratch"] = "not for keeps"
    tool_context.state["turns"] = tool_context.state.get("turns", 0) + 1
    return {"ok": True}


def agent(model: Scripted, tools: list[Any] | None = None) -> LlmAgent:
    return LlmAgent(name="helper", model=model, instruction="Help.",
                    tools=[remember] if tools is None else tools)


async def turn(runner: Runner, session_id: str, message: str) -> list[Event]:
    return [e async for e in runner.run_async(user_id="u", session_id=session_id,
                                              new_message=user(message))]


def texts(contents: list[types.Content]) -> list[str]:
    out = []
    for c in contents:
        for p in c.parts or []:
            if p.text:
                out.append(f"{c.role}: {p.text}")
            elif p.function_call:
                out.append(f"{c.role}: call {p.function_call.name}")
            elif p.function_response:
                out.append(f"{c.role}: result {p.function_response.name}")
    return out


def spawn(db: Path) -> Any:
    return AsyncClient.spawn(["--db", str(db), "--synchronous", "NORMAL"])


@pytest.mark.parametrize("write_behind", [False, True], ids=["durable", "write-behind"])
def test_an_agent_run_persists_to_streamd_and_a_new_process_resumes_it(
    tmp_path: Path, write_behind: bool
) -> None:
    """With write-behind, ``Runner.close`` flushing is what makes the run
    durable before the daemon goes."""
    db = tmp_path / "events.db"

    async def first_run() -> tuple[str, list[Event]]:
        async with await spawn(db) as client:
            service = StreamdSessionService(client, write_behind=write_behind)
            model = Scripted(script=[call("remember", fact="the sky is blue"), say("Noted.")])
            runner = Runner(app_name="app", agent=agent(model), session_service=service)
            session = await service.create_session(app_name="app", user_id="u")
            events = await turn(runner, session.id, "remember: the sky is blue")
            await runner.close()
            return session.id, events

    async def second_run(session_id: str) -> tuple[Scripted, Any, list[Event]]:
        async with await spawn(db) as client:  # a new daemon process on the same file
            service = StreamdSessionService(client, write_behind=write_behind)
            model = Scripted(script=[say("The sky is blue.")])
            runner = Runner(app_name="app", agent=agent(model), session_service=service)
            events = await turn(runner, session_id, "what is the sky?")
            await runner.close()
            stored = await service.get_session(app_name="app", user_id="u",
                                               session_id=session_id)
            return model, stored, events

    async def main() -> None:
        async with asyncio.timeout(120):
            session_id, first = await first_run()
            model, stored, second = await second_run(session_id)
        # The model of the second run was given the whole first run.
        assert texts(model.requests[0].contents) == [
            "user: remember: the sky is blue",
            "model: call remember",
            "user: result remember",
            "model: Noted.",
            "user: what is the sky?",
        ]
        # Everything the runners yielded is stored, in order, equal field by field,
        # with the user's messages between the turns.
        assert [e.author for e in stored.events] == [
            "user", "helper", "helper", "helper", "user", "helper"
        ]
        kept = [e for i, e in enumerate(stored.events) if i not in (0, 4)]
        assert [e.model_dump() for e in kept] == [e.model_dump() for e in first + second]
        # State by prefix: the user's and the app's kept, temp never stored.
        assert stored.state == {"user:fact": "the sky is blue", "app:remembered": 1, "turns": 1}

    asyncio.run(main())


def test_a_run_whose_session_another_writer_moves_is_refused_as_stale(tmp_path: Path) -> None:
    """Mid-run, a tool appends to the same session through another connection
    (another process of the agent, say). The runner's next append was computed
    on the session it loaded, so ADK's StaleSessionError ends the run instead of
    the two histories being merged."""
    db = tmp_path / "events.db"

    async def main() -> None:
        async with asyncio.timeout(120), await spawn(db) as client, await spawn(db) as other:
            service = StreamdSessionService(client)
            elsewhere = StreamdSessionService(other)

            async def interfere(tool_context: ToolContext) -> dict[str, Any]:
                """Interfere."""
                moved = await elsewhere.get_session(
                    app_name="app", user_id="u", session_id=tool_context.session.id
                )
                assert moved is not None
                await elsewhere.append_event(moved, Event(author="other", invocation_id="x"))
                return {"ok": True}

            model = Scripted(script=[call("interfere"), say("done")])
            runner = Runner(app_name="app", agent=agent(model, [interfere]),
                            session_service=service)
            session = await service.create_session(app_name="app", user_id="u")
            with pytest.raises(StaleSessionError):
                await turn(runner, session.id, "go")
            await runner.close()
            stored = await service.get_session(app_name="app", user_id="u",
                                               session_id=session.id)
            assert stored is not None
            assert [e.author for e in stored.events] == ["user", "helper", "other"]

    asyncio.run(main())


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    for w in make_world():
        point_clients_at(w, monkeypatch)
        yield w


def test_the_sync_runner_on_a_service_that_starts_the_resident_daemon(
    world: World, tmp_path: Path
) -> None:
    """``Runner.run`` runs its own event loop in a thread: the service opens a
    client for that loop, starting the resident daemon as none runs."""
    db = tmp_path / "events.db"
    service = StreamdSessionService(daemon_args=["--db", str(db), "--synchronous", "NORMAL"])
    model = Scripted(script=[say("hello")])
    runner = Runner(app_name="app", agent=agent(model, []), session_service=service,
                    auto_create_session=True)
    events = list(runner.run(user_id="u", session_id="s1", new_message=user("hi")))
    assert [e.content.parts[0].text for e in events if e.content] == ["hello"]
    assert len(world.daemons()) == 1

    async def check() -> Any:
        async with asyncio.timeout(60):
            got = await service.get_session(app_name="app", user_id="u", session_id="s1")
            await service.close()
            return got

    stored = asyncio.run(check())
    assert stored is not None and [e.author for e in stored.events] == ["user", "helper"]


def _open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass  # closed meanwhile (the listing's own descriptor)
    return count


def test_turn_after_turn_the_sync_runner_keeps_one_connection(
    world: World, tmp_path: Path
) -> None:
    """Each ``Runner.run`` runs on an event loop of its own; the client of a
    loop that has ended is dropped when the next loop opens one (it held its
    loop, so before that it lived, socket and all, as long as the service)."""
    db = tmp_path / "events.db"
    service = StreamdSessionService(daemon_args=["--db", str(db), "--synchronous", "NORMAL"])
    model = Scripted(script=[say(f"reply {i}") for i in range(12)])
    runner = Runner(app_name="app", agent=agent(model, []), session_service=service,
                    auto_create_session=True)
    list(runner.run(user_id="u", session_id="s1", new_message=user("hi")))
    gc.collect()
    before = _open_sockets()
    for i in range(10):
        list(runner.run(user_id="u", session_id="s1", new_message=user(f"turn {i}")))
    gc.collect()
    assert _open_sockets() <= before + 1
