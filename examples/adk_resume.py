"""An ADK agent whose session lives in streamd, resumed by a later process.

Needs no model and no API key: the agent's model is a small scripted one (a
``BaseLlm`` that answers by rule), so what you see is the session store at
work. Run it twice; the second process picks the conversation up where the
first left it, history and state included::

    python examples/adk_resume.py --db /tmp/demo.db "remember: my name is Ada"
    python examples/adk_resume.py --db /tmp/demo.db "what do you remember?"

``--db PATH`` runs a streamd daemon of this process's own on that file, ended
on exit; ``--in-process PATH`` keeps the log in this process instead, no
daemon at all (``StreamdSessionService(database=PATH)``); with neither the
example uses the resident daemon (started if none runs) and the default event
log. Needs ``pip install 'recall-streamd[adk]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from streamd.adk import StreamdSessionService
from streamd.client import AsyncClient
from streamd.errors import RpcError

APP, USER, SESSION = "resume-demo", "ada", "demo"


class RuleModel(BaseLlm):
    """A stand-in for a real model: "remember: X" calls the ``remember`` tool;
    anything else is answered from the conversation it is given, which is
    whatever the session service loaded."""

    model: str = "rules"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1]
        part = (last.parts or [types.Part()])[0]
        if part.function_response is not None:
            yield _text("Noted.")
            return
        said = (part.text or "").strip()
        if said.lower().startswith("remember:"):
            call = types.FunctionCall(name="remember", args={"fact": said.split(":", 1)[1].strip()})
            yield _reply(types.Part(function_call=call))
            return
        facts = [
            p.function_call.args["fact"]
            for c in llm_request.contents
            for p in c.parts or []
            if p.function_call is not None and p.function_call.name == "remember"
        ]
        turns = sum(1 for c in llm_request.contents if c.role == "user" and _is_text(c))
        answer = "; ".join(facts) if facts else "nothing yet"
        yield _text(f"This is message {turns} of our conversation. You told me: {answer}.")


def _text(text: str) -> LlmResponse:
    return _reply(types.Part(text=text))


def _reply(part: types.Part) -> LlmResponse:
    # A real model reports its token counts; ADK's telemetry warns without them.
    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=0, candidates_token_count=0, total_token_count=0
    )
    return LlmResponse(content=types.Content(role="model", parts=[part]), usage_metadata=usage)


def _is_text(content: types.Content) -> bool:
    return any(p.text for p in content.parts or [])


def remember(fact: str, tool_context: ToolContext) -> dict[str, Any]:
    """Remember a fact about the user."""
    facts = list(tool_context.state.get("user:facts", []))
    tool_context.state["user:facts"] = [*facts, fact]  # the user's, in every session
    return {"remembered": fact}


async def main(message: str, db: str | None, in_process: str | None = None) -> None:
    client = await AsyncClient.spawn(["--db", db]) if db else None
    service = StreamdSessionService(client, database=in_process)
    agent = LlmAgent(name="helper", model=RuleModel(), instruction="Help.", tools=[remember])
    runner = Runner(app_name=APP, agent=agent, session_service=service)
    try:
        session = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
        if session is None:
            session = await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
            print(f"new session {SESSION!r}")
        else:
            print(f"resumed session {SESSION!r} with {len(session.events)} events")
        content = types.Content(role="user", parts=[types.Part(text=message)])
        async for event in runner.run_async(
            user_id=USER, session_id=SESSION, new_message=content
        ):
            for part in (event.content.parts if event.content else None) or []:
                if part.text:
                    print(f"{event.author}: {part.text}")
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
        assert stored is not None
        print(f"stored: {len(stored.events)} events, state {stored.state}")
    finally:
        await runner.close()
        if client is not None:
            await client.aclose()
        else:
            await service.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message", nargs="?", default="what do you remember?")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", help="an event log file of this run's own daemon")
    where.add_argument("--in-process", metavar="PATH",
                       help="an event log file opened by this process, no daemon")
    args = parser.parse_args()
    try:
        asyncio.run(main(args.message, args.db, args.in_process))
    except RpcError as exc:  # the log could not be opened or served: one line, as the CLI says it
        sys.exit(f"adk_resume: {exc.message}")
