"""``streamd demo``: the daemon doing its two jobs, on embedded defaults.

It spawns the real daemon (``python -m streamd``) the way a Recall core or an
agent would, speaks JSON-RPC to it over pipes, and prints each exchange for
a person: indexing a sample stream shipped in the package, a few searches,
an expansion, then event-log appends, a replay and a live tail. Each term
(generation, watermark, the exact partition) is explained where it first
shows, and it ends with three commands to try on the sample.

The daemon runs in a session of its own, so a Ctrl-C at the terminal reaches
the demo only, which then stops the daemon itself and exits 130.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import resources
from itertools import count
from typing import Any

DEADLINE = "2999-01-01T00:00:00Z"


class Client:
    """A minimal blocking JSON-RPC client over a child's stdio."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.ids = count(1)
        self.notifications: list[dict[str, Any]] = []

    def send(self, method: str, params: Any, *, request_id: int | None = None) -> int:
        rid = next(self.ids) if request_id is None else request_id
        frame = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(frame).encode() + b"\n")
        self.proc.stdin.flush()
        return rid

    def notify(self, method: str, params: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method,
                                          "params": params}).encode() + b"\n")
        self.proc.stdin.flush()

    def wait(self, rid: int) -> dict[str, Any]:
        return self._first(lambda frame: frame.get("id") == rid)

    def next_notification(self, method: str) -> dict[str, Any]:
        return self._first(lambda frame: frame.get("method") == method)

    def _first(self, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first frame ``wanted`` accepts, held back or read now; frames
        read on the way are held back for later."""
        for i, frame in enumerate(self.notifications):
            if wanted(frame):
                return self.notifications.pop(i)
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the streamd daemon it started exited unexpectedly")
            frame = json.loads(line)
            if wanted(frame):
                return frame
            self.notifications.append(frame)

    def call(self, method: str, params: Any) -> dict[str, Any]:
        return self.wait(self.send(method, params))

    def close(self) -> int:
        self.call("recall/shutdown", {})
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=10)

    def abandon(self) -> None:
        """Stop the daemon without the shutdown exchange (the demo was interrupted)."""
        if self.proc.poll() is None:
            self.proc.terminate()  # a normal stop to it: it closes its event log
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _title(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m" if sys.stdout.isatty() else f"\n== {text}")


def _note(text: str) -> None:
    """A term explained where it first shows, wrapped under the exchange."""
    import textwrap

    print(textwrap.fill(text, width=88, initial_indent="   ; ", subsequent_indent="   ; "))


def _hits(frame: dict[str, Any]) -> None:
    if "error" in frame:
        print(f"   error {frame['error']['code']}: {frame['error']['message']}")
        return
    result = frame["result"]
    for c in result["candidates"]:
        print(f"   {c['local_rank']}. {c['locator']}  {c['event_time']}  {c['title']}"
              f"  (score {c['local_score']:.3g}, relevance {c['relevance']:.3g},"
              f" {c['match_signals'][0]})")
    d = result["diagnostics"]
    print(f"   -> {d['matched']} matched of {d['indexed']} records, mode {d['query_mode']}, "
          f"{d['generation']}, {d['elapsed_ms']} ms")


def run_demo() -> int:
    try:
        return _run_demo()
    except BrokenPipeError:
        raise  # the reader went away (`| head`): the command line's to handle
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        # The daemon it drives failed (its stderr is not shown: run `streamd -v`
        # to see it); said in one line, as every streamd error is.
        print(f"streamd: demo: {exc}", file=sys.stderr)
        return 2


def _run_demo() -> int:
    workdir = tempfile.mkdtemp(prefix="streamd-demo-")
    try:
        stream = os.path.join(workdir, "sample.jsonl")
        sample = resources.files("streamd").joinpath("data/sample.jsonl")
        with sample.open("rb") as src, open(stream, "wb") as dst:
            shutil.copyfileobj(src, dst)
        client = Client([sys.executable, "-m", "streamd", "--db",
                         os.path.join(workdir, "events.db")])
        try:
            _recall_part(client, workdir, stream)
            _eventlog_part(client)
            code = client.close()
        except BaseException:
            client.abandon()
            raise
        _title(f"recall/shutdown acknowledged; daemon exited with status {code}")
        _try_next(str(sample))
        return code
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _try_next(sample: str) -> None:
    import shlex

    _title("try next, on the same sample (the commands print for people; --json for scripts)")
    here = shlex.quote(sample) if os.path.isfile(sample) else "signals.jsonl"
    for line in (f"streamd search transcripts {here}",
                 f"streamd expand v2/evt-011 {here} --detail context",
                 "streamd log --db demo.db append --app demo --user ana --session s1 "
                 "--author user --text hello"):
        print(f"   {line}")


def _recall_part(client: Client, workdir: str, stream: str) -> None:
    _title("recall/initialize: a source over the bundled sample stream")
    os.makedirs(os.path.join(workdir, "index"), exist_ok=True)
    manifest = client.call("recall/initialize", {
        "protocol_version_min": 1, "protocol_version_max": 1,
        "workdir": os.path.join(workdir, "index"), "source_id": "demo",
        "location": stream, "settings": {"upstream": {"tasks": "tasks", "jira": "jira"}},
    })["result"]
    print(f"   {manifest['adapter_id']} ({manifest['display_name']}), "
          f"capabilities {', '.join(manifest['capabilities'])}")

    health = client.call("recall/health", {"deadline": DEADLINE})["result"]
    _title("recall/health: the first probe builds and publishes gen-1")
    print(f"   {health['status']}, {health['index_generation']}, {health['source_watermark']}")
    _note(f"{health['index_generation']} is the index's generation: a numbered snapshot that "
          "never changes once published; every answer names the one it read, and a build that "
          "finds new records publishes the next.")
    _note(f"{health['source_watermark']} is the watermark: how far the index has read the "
          "stream (bytes consumed, records indexed, the newest event time), so a caller can "
          "tell an older answer from a newer one.")

    for query, note in (
        ("td-f62256", "an exact identifier: its records form a partition above all others"),
        ("stream adapter transcripts", "a three-term lexical query"),
        ("transcript", "no record spells it, so its plural 'transcripts' matches at half weight"),
    ):
        _title(f"recall/search {query!r}: {note}")
        frame = client.call("recall/search", {"query": query, "filters": {}, "limit": 5,
                                              "deadline": DEADLINE})
        _hits(frame)
        if query == "td-f62256":
            _explain_the_partition(frame)
    _title("recall/search '' since 09:30: an empty query browses a time window")
    _hits(client.call("recall/search", {"query": "", "filters": {
        "since": "2026-05-02T09:30:00Z"}, "limit": 3, "deadline": DEADLINE}))

    with open(stream, "a") as f:
        f.write(json.dumps({"schema": 2, "id": "evt-013", "event_time": "2026-05-02T10:30:00Z",
                            "title": "Task td-f62256 reopened", "system": "tasks",
                            "ref": "td-f62256", "text": "A late append is searchable at once.",
                            "actor": "demo"}) + "\n")
    _title("append one line to the stream, search again: caught up by byte offset")
    _hits(client.call("recall/search", {"query": "td-f62256", "filters": {}, "limit": 2,
                                         "deadline": DEADLINE}))

    _title("recall/expand demo:v2/evt-003 at detail 'context'")
    result = client.call("recall/expand", {"locator": "demo:v2/evt-003", "detail": "context",
                                           "budget_bytes": 0, "deadline": DEADLINE})["result"]
    for line in result["content"].splitlines():
        print(f"   | {line}")


def _explain_the_partition(frame: dict[str, Any]) -> None:
    """Why rank 1 can show a lower relevance than rank 2, said of these hits."""
    hits = frame.get("result", {}).get("candidates", [])
    if len(hits) < 2:
        return
    first, second = hits[0], hits[1]
    _note("The order is: records an exact identifier (id, ref, correlation or v<schema>/<id>) "
          "names come first, as a partition of their own; within it and after it, the higher "
          "score, then the newer event time. Relevance is reported for the caller, not ranked "
          "on.")
    if first["relevance"] < second["relevance"]:
        _note(f"So {first['locator']} (relevance {first['relevance']:.3g}) ranks above "
              f"{second['locator']} ({second['relevance']:.3g}): both are exact hits with score "
              f"{first['local_score']:.3g}, and {first['event_time']} is the newer.")


def _eventlog_part(client: Client) -> None:
    _title("eventlog/append: three events of one agent session")
    for i, (author, text) in enumerate(
        (("user", "Find the adapter transcripts"), ("agent", "Searching recall..."),
         ("agent", "Found 3 records")), start=1):
        frame = client.call("eventlog/append", {
            "app": "demo", "user": "ana", "session": "s1",
            "event": {"id": f"e{i}", "author": author, "branch": "main",
                      "content": {"text": text}},
        })
        if "error" in frame:
            print(f"   error {frame['error']['code']}: {frame['error']['message']}")
            return
        print(f"   seq {frame['result']['seq']}: {author}: {text}")
    again = client.call("eventlog/append", {
        "app": "demo", "user": "ana", "session": "s1",
        "event": {"id": "e1", "author": "user", "branch": "main",
                  "content": {"text": "Find the adapter transcripts"}},
    })["result"]
    print(f"   retrying e1 is safe: seq {again['seq']}, duplicate={again['duplicate']}")

    _title("eventlog/since 0: replay")
    for entry in client.call("eventlog/since", {"from_seq": 0})["result"]["entries"]:
        print(f"   #{entry['seq']} {entry['session']} {entry['event']['author']}: "
              f"{entry['event']['content']['text']}")

    _title("eventlog/watch from the latest seq: a live tail sees a new append at once")
    latest = client.call("eventlog/latest_seq", {})["result"]["seq"]
    watch_id = client.send("eventlog/watch", {"from_seq": latest})
    client.call("eventlog/append", {
        "app": "demo", "user": "ana", "session": "s1",
        "event": {"id": "e4", "author": "agent", "branch": "main",
                  "content": {"text": "Done."}},
    })
    entry = client.next_notification("eventlog/entry")["params"]["entry"]
    print(f"   tail: #{entry['seq']} {entry['event']['author']}: "
          f"{entry['event']['content']['text']}")
    client.notify("recall/cancel", {"id": watch_id})
    ended = client.wait(watch_id)
    print(f"   watch ended by cancel: {ended['error']['message']}")
