"""The cancellation matrix: each scenario's script, the rule it checks, and its judge.

Every scenario runs against a fresh adapter process with a fresh copy of
:data:`FIXTURE_FILES` and an empty workdir. Searches are held in flight with
``debug_stall_ms`` (the reference's setting for exactly this, "an artificial
pre-scan delay"); an adapter whose settings schema lacks it is run without,
and a judgement that needed the hold says so instead of failing. Two holds:

- :data:`HELD_MS` (30 s): long enough that only a cancel, a deadline or end of
  input can end the request within a run, so "it ended" names its cause.
- :data:`BRIEF_MS` (1 s): for scenarios where the held work must finish on its
  own (the siblings of a cancelled request, the work a shutdown waits for).

Sources a row cites: Recall's adapter protocol (its ``docs/adapter-protocol.md``
and the ``recall/cancel`` params schema), JSON-RPC 2.0, and streamd's own
end-of-input rule (``docs/wire-eof.md``) where the protocol is silent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamd.conformance.cancel import script as s
from streamd.conformance.cancel.judging import (
    Findings,
    Judgement,
    answers,
    check_answered_once,
    check_cancelled,
    check_no_strays,
    check_run,
    describe,
    error_code,
    is_cancelled,
    is_result,
)
from streamd.conformance.cancel.script import Await, Close, Observation, Pause, Place, Send, Step

HELD_MS = 30_000
BRIEF_MS = 1_000
#: How far ahead scenario 8's deadline is set, from the moment its search is written.
MIDWAY_S = 1.5
#: Race offsets (seconds between a search and its cancel) and trials per offset.
RACE_OFFSETS = (0.0, 0.0005, 0.001, 0.002, 0.005)
RACE_TRIALS = 10

RECALL = "Recall adapter protocol"
CANCEL_SCHEMA = "Recall adapter protocol (recall/cancel params schema)"
JSONRPC = "JSON-RPC 2.0"
EOF_RULE = "streamd end of input (wire-eof.md); the protocol only asks for exit 0"

SEARCH_VOLATILE = ("/result/candidates/*/confirmed_at", "/result/diagnostics/elapsed_ms")
HEALTH_VOLATILE = ("/result/checked_at", "/result/last_success_at")

FIXTURE_FILES = {
    "signals.jsonl": (
        b'{"schema":1,"id":"sig-1","kind":"event","event_time":"2026-05-02T09:12:00Z",'
        b'"system":"deploys","title":"deploy 41 started","body":"Rolling deploy of the indexer."}\n'
        b'{"schema":1,"id":"sig-2","kind":"event","event_time":"2026-05-02T09:20:00Z",'
        b'"system":"deploys","title":"deploy 41 finished","body":"Every host is healthy."}\n'
        b'{"schema":2,"id":"sig-3","kind":"message","event_time":"2026-05-02T09:25:00Z",'
        b'"title":"Release notes","text":"The deploy is done; notes follow.","actor":"ana"}\n'
    )
}


@dataclass(frozen=True)
class Scenario:
    name: str
    number: str  # the numbering, "7b" for a variant
    title: str
    rule: str
    source: str
    script: Callable[[Place], list[Step]]
    judge: Callable[[Observation], Judgement]
    # Lockstep request lines when the transcript format can express it (for
    # --record), with the frame count its rule predicts; None: live only.
    case: tuple[str, ...] | None = None
    responses: int = 0
    volatile: tuple[str, ...] = ()
    description: str = ""  # a recorded case's manifest description


def matrix(
    *, stall: bool = True, trials: int = RACE_TRIALS, offsets: Sequence[float] = RACE_OFFSETS
) -> list[Scenario]:
    """Every scenario, in the issue's order. ``stall`` is whether the adapter's
    settings schema offers ``debug_stall_ms``."""
    held = HELD_MS if stall else 0
    brief = BRIEF_MS if stall else 0
    return [
        _cancel_inflight(held, stall),
        _cancel_one_of_several(brief, stall),
        _cancel_not_inflight(),
        _cancel_twice(held, stall),
        _cancel_races_completion(trials, offsets),
        _cancel_malformed(held, stall),
        *(_deadline_past(method) for method in ("search", "expand", "health", "refresh")),
        _deadline_midway(held, stall),
        _shutdown_inflight(brief),
        _eof_inflight(held),
        _eof_inflight_eventlog(),
        _cancel_lsp_spelling(held, stall),
    ]


# --------------------------------------------------------------------------
# Shared checks
# --------------------------------------------------------------------------


def _start(obs: Observation, ids: Sequence[s.RequestId], exit_rule: bool = True) -> Findings:
    """The checks every row makes: the run itself, no answer to a
    notification, and a handshake that succeeded."""
    found = Findings()
    check_run(found, obs, exit_rule=exit_rule)
    check_no_strays(found, obs, ids)
    if 1 in ids:
        init = check_answered_once(found, obs, 1, "initialize")
        if init is not None and not is_result(init.frame):
            found.fail(f"initialize answered {describe(init.frame)}")
    return found


def _cancelled(found: Findings, obs: Observation, rid: s.RequestId, label: str, held: bool) -> None:
    """-32007 and never a result; without a hold the search may win the race,
    which is then what the row reports."""
    if not held:
        got = answers(obs, rid)
        if len(got) == 1 and is_result(got[0].frame):
            found.observe(f"{label} finished before its cancel (no debug_stall_ms to hold it)")
            return
    check_cancelled(found, obs, rid, label)


def _arrived_before(obs: Observation, rid: s.RequestId, label: str) -> bool | None:
    """Whether the answer to ``rid`` arrived before the line ``label`` was
    written: an order of events, not a measured time."""
    got = answers(obs, rid)
    at = obs.sent_at(label)
    if not got or at is None:
        return None
    return got[0].at < at


def _time_answer(
    found: Findings, obs: Observation, rid: s.RequestId, after: str,
    name: str = "cancel_to_answer_ms",
) -> None:
    """Report how long after the line ``after`` the answer to ``rid`` came."""
    got = answers(obs, rid)
    found.time(name, obs.sent_at(after), got[0].at if got else None)


def _lockstep_scenario(
    name: str, number: str, title: str, rule: str, source: str,
    lines: Sequence[str], responses: int, volatile: tuple[str, ...],
    judge: Callable[[Observation], Judgement],
) -> Scenario:
    return Scenario(
        name, number, title, rule, source,
        script=lambda place: s.lockstep(lines, place),
        judge=judge, case=tuple(lines), responses=responses, volatile=volatile,
        description=f"{title}. Rule ({source}): {rule}",
    )


# --------------------------------------------------------------------------
# 1-4: cancel in flight, one of several, not in flight, twice
# --------------------------------------------------------------------------


def _cancel_inflight(held_ms: int, held: bool) -> Scenario:
    lines = [s.initialize(held_ms), s.search(2), s.cancel(2)]

    def judge(obs: Observation) -> Judgement:
        found = _start(obs, [1, 2])
        _cancelled(found, obs, 2, "search 2", held)
        _time_answer(found, obs, 2, "recall/cancel 2")
        return found.judgement()

    return _lockstep_scenario(
        "cancel-inflight", "1", "A search held in flight, then recall/cancel",
        "a cancelled request answers -32007, never a result, exactly once", RECALL,
        lines, 2, (), judge,
    )


def _cancel_one_of_several(brief_ms: int, held: bool) -> Scenario:
    def steps(place: Place) -> list[Step]:
        return [
            s.bind(s.initialize(brief_ms), place, "initialize 1"), Await(1),
            *(s.bind(s.search(i), place, f"search {i}") for i in (2, 3, 4)),
            s.bind(s.cancel(3), place, "recall/cancel 3"),
            Await(2), Await(3), Await(4), Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        found = _start(obs, [1, 2, 3, 4])
        _cancelled(found, obs, 3, "search 3", held)
        for i in (2, 4):
            answer = check_answered_once(found, obs, i, f"search {i}")
            if answer is None:
                continue
            if is_cancelled(answer.frame):
                found.fail(
                    f"search {i} ended too ({describe(answer.frame)}); only search 3 was cancelled"
                )
            elif not is_result(answer.frame):
                found.fail(f"search {i} answered {describe(answer.frame)}")
        if not found.failures:
            found.fact("searches 2 and 4 answered results")
        _time_answer(found, obs, 3, "recall/cancel 3")
        return found.judgement()

    return Scenario(
        "cancel-one-of-several", "2", "Three searches in flight, one cancelled",
        "only the cancelled request ends (-32007); the others answer results", RECALL,
        steps, judge,
    )


def _cancel_not_inflight() -> Scenario:
    # health 3 is a request, so lockstep sends it only once search 2 is
    # answered: the cancels after it name an answered id and unsent ones.
    lines = [
        s.initialize(), s.search(2), s.health(3), s.cancel(2), s.cancel(99),
        s.cancel("never-sent"), s.health(4),
    ]

    def judge(obs: Observation) -> Judgement:
        found = _start(obs, [1, 2, 3, 4])
        search = check_answered_once(found, obs, 2, "search 2")
        if search is not None and not is_result(search.frame):
            found.fail(f"search 2 answered {describe(search.frame)}")
        check_answered_once(found, obs, 3, "health 3")
        served = check_answered_once(found, obs, 4, "health 4")
        if served is not None:
            found.fact(
                f"no frame for the three cancels; health 4 then answered {describe(served.frame)}"
            )
        return found.judgement()

    return _lockstep_scenario(
        "cancel-not-inflight", "3",
        "recall/cancel for an id already answered, and for ids never sent",
        "a notification is never answered, so no frame; the adapter keeps serving", JSONRPC,
        lines, 4, SEARCH_VOLATILE + HEALTH_VOLATILE, judge,
    )


def _cancel_twice(held_ms: int, held: bool) -> Scenario:
    lines = [s.initialize(held_ms), s.search(2), s.cancel(2), s.cancel(2), s.health(3)]

    def judge(obs: Observation) -> Judgement:
        found = _start(obs, [1, 2, 3])
        _cancelled(found, obs, 2, "search 2", held)
        check_answered_once(found, obs, 3, "health 3")
        _time_answer(found, obs, 2, "recall/cancel 2")
        return found.judgement()

    return _lockstep_scenario(
        "cancel-twice", "4", "The same recall/cancel sent twice for a held search",
        "one answer (-32007); the second cancel names a request no longer in flight", RECALL,
        lines, 3, HEALTH_VOLATILE, judge,
    )


# --------------------------------------------------------------------------
# 5: the race of a cancel with the completion
# --------------------------------------------------------------------------


def _race_ids(trials: int, offsets: Sequence[float]) -> list[tuple[float, list[int]]]:
    # Ids 1000, 1001, ... for the first offset, 2000, ... for the second.
    return [
        (offset, [1000 * (i + 1) + t for t in range(trials)]) for i, offset in enumerate(offsets)
    ]


def _cancel_races_completion(trials: int, offsets: Sequence[float]) -> Scenario:
    plan = _race_ids(trials, offsets)

    def steps(place: Place) -> list[Step]:
        out: list[Step] = [s.bind(s.initialize(), place, "initialize 1"), Await(1)]
        for offset, ids in plan:
            for rid in ids:
                out.append(s.bind(s.search(rid), place, f"search {rid}"))
                if offset > 0:
                    out.append(Pause(offset))
                out += [s.bind(s.cancel(rid), place, f"recall/cancel {rid}"), Await(rid)]
        out.append(Close())
        return out

    def judge(obs: Observation) -> Judgement:
        ids = [rid for _, group in plan for rid in group]
        found = _start(obs, [1, *ids])
        slowest: float | None = None
        for offset, group in plan:
            results = cancelled = 0
            for rid in group:
                answer = check_answered_once(found, obs, rid, f"search {rid}")
                if answer is None:
                    continue
                if is_result(answer.frame):
                    results += 1
                elif is_cancelled(answer.frame):
                    cancelled += 1
                else:
                    found.fail(f"search {rid} answered {describe(answer.frame)}")
                sent = obs.sent_at(f"recall/cancel {rid}")
                if sent is not None:
                    took = answer.at - sent
                    slowest = took if slowest is None else max(slowest, took)
            found.fact(f"{offset * 1000:g} ms: {results} results, {cancelled} cancelled")
        if slowest is not None:
            found.times["slowest_cancel_to_answer_ms"] = round(max(slowest, 0) * 1000, 1)
        return found.judgement()

    return Scenario(
        "cancel-races-completion", "5",
        f"A quick search cancelled {len(offsets)} ways "
        f"({', '.join(f'{o * 1000:g}' for o in offsets)} ms after it), {trials} trials each",
        "exactly one answer per request, a result or -32007, whichever wins", JSONRPC,
        steps, judge,
    )


# --------------------------------------------------------------------------
# 6: malformed cancels
# --------------------------------------------------------------------------

_NO_ID = s.notification("recall/cancel", {})
_BOOL_ID = s.notification("recall/cancel", {"id": True})
_STRING_ID = s.cancel("2")  # "2" is not the id 2 (JSON-RPC ids compare by type)
_AS_REQUEST = s.request(9, "recall/cancel", {"id": 2})


def _cancel_malformed(held_ms: int, held: bool) -> Scenario:
    lines = [
        s.initialize(held_ms), s.search(2), _NO_ID, _BOOL_ID, _STRING_ID, s.cancel(2),
        _AS_REQUEST,
    ]

    def steps(place: Place) -> list[Step]:
        # Live, the malformed ones go first and a round trip (health 8) follows,
        # then the request form and another round trip, then the real cancel:
        # which of them ended search 2 is then the order of its answer among
        # those writes.
        def line(template: str, label: str) -> Send:
            return s.bind(template, place, label)

        return [
            line(s.initialize(held_ms), "initialize 1"), Await(1),
            line(s.search(2), "search 2"),
            line(_NO_ID, "cancel with no id"), line(_BOOL_ID, "cancel with id true"),
            line(_STRING_ID, 'cancel with id "2"'),
            line(s.health(8), "health 8"), Await(8),
            line(_AS_REQUEST, "cancel as request 9"), Await(9),
            line(s.health(10), "health 10"), Await(10),
            line(s.cancel(2), "recall/cancel 2"), Await(2), Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        lockstep = obs.sent_at("health 8") is None  # a run of the recorded form
        found = _start(obs, [1, 2, 8, 9, 10])
        as_request = check_answered_once(found, obs, 9, "the cancel sent as request 9")
        if as_request is not None:
            found.fact(f"as a request it was answered {describe(as_request.frame)}")
        if not lockstep:
            for rid in (8, 10):
                check_answered_once(found, obs, rid, f"health {rid}")
            if _arrived_before(obs, 2, "cancel as request 9"):
                found.fail("search 2 ended before any well-formed cancel: a malformed one ended it")
            elif _arrived_before(obs, 2, "recall/cancel 2"):
                found.observe("the cancel sent as a request (id 9) cancelled search 2")
        _cancelled(found, obs, 2, "search 2", held)
        return found.judgement()

    return Scenario(
        "cancel-malformed", "6",
        'Cancels with no id, id true, id "2" for request 2, and as a request with an id',
        "a notification is never answered and a malformed one cancels nothing; a request "
        "(with an id) is answered once; only the well-formed cancel ends the search (-32007)",
        f"{CANCEL_SCHEMA}; {JSONRPC}", steps, judge,
        case=tuple(lines), responses=3, volatile=(),
        description=(
            "Malformed cancels. A search is held in flight; recall/cancel arrives with no id, "
            'with id true, and with id "2" (request 2\'s id is the number 2, a different '
            "JSON-RPC id): none is answered, being notifications. A well-formed cancel then "
            "ends the search with -32007, once. Last, recall/cancel sent as a request with id 9 "
            "is a request and is answered once (the protocol defines recall/cancel only as a "
            f"notification). Rule ({CANCEL_SCHEMA}; {JSONRPC})."
        ),
    )


# --------------------------------------------------------------------------
# 7-8: deadlines
# --------------------------------------------------------------------------


_BUILDERS = {"search": s.search, "expand": s.expand, "health": s.health, "refresh": s.refresh}


def _deadline_past(method: str) -> Scenario:
    build = _BUILDERS[method]
    lines = [s.initialize(), build(2, s.PAST_DEADLINE)]

    def judge(obs: Observation) -> Judgement:
        found = _start(obs, [1, 2])
        answer = check_answered_once(found, obs, 2, method)
        if answer is not None:
            if is_cancelled(answer.frame):
                found.fact(f"{method}: {describe(answer.frame)}")
            elif method == "search":
                found.fail(
                    f"search answered {describe(answer.frame)} past its deadline, not -32007"
                )
            else:
                found.observe(
                    f"{method} answered {describe(answer.frame)} past its deadline (streamd "
                    "answers -32007; the reference enforces deadlines only for search)"
                )
        return found.judgement()

    return _lockstep_scenario(
        f"deadline-past-{method}", "7" + "abcd"[list(_BUILDERS).index(method)],
        f"recall/{method} with a deadline already past at arrival",
        "a request that has run out of time answers -32007 (the reference: search only)",
        RECALL, lines, 2, (), judge,
    )


def _deadline_midway(held_ms: int, held: bool) -> Scenario:
    def steps(place: Place) -> list[Step]:
        search = s.bind(s.search(2, "${DEADLINE}"), place, "search 2")
        return [
            s.bind(s.initialize(held_ms), place, "initialize 1"), Await(1),
            Send(search.data, search.label, deadline_in=MIDWAY_S), Await(2), Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        found = _start(obs, [1, 2])
        got = answers(obs, 2)
        if not held and len(got) == 1 and is_result(got[0].frame):
            found.observe("search 2 finished before its deadline (no debug_stall_ms to hold it)")
        else:
            answer = check_answered_once(found, obs, 2, "search 2")
            if answer is not None and not is_cancelled(answer.frame):
                found.fail(
                    f"search 2 answered {describe(answer.frame)} after its deadline, not -32007"
                )
            elif answer is not None:
                found.fact(f"search 2: {describe(answer.frame)}")
        found.time("send_to_answer_ms", obs.sent_at("search 2"), got[0].at if got else None)
        found.times["deadline_after_send_ms"] = MIDWAY_S * 1000
        return found.judgement()

    return Scenario(
        "deadline-expires-inflight", "8",
        f"A held search whose deadline passes {MIDWAY_S:g} s after it is sent",
        "a request whose deadline passes answers -32007, once, never a result", RECALL,
        steps, judge,
    )


# --------------------------------------------------------------------------
# 9-10: shutdown and end of input with work in flight
# --------------------------------------------------------------------------


def _shutdown_inflight(brief_ms: int) -> Scenario:
    def steps(place: Place) -> list[Step]:
        return [
            s.bind(s.initialize(brief_ms), place, "initialize 1"), Await(1),
            s.bind(s.search(2), place, "search 2"), s.bind(s.search(3), place, "search 3"),
            s.bind(s.shutdown(4), place, "shutdown 4"), Await(4), Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        found = _start(obs, [1, 2, 3, 4])
        ack = check_answered_once(found, obs, 4, "shutdown 4")
        if ack is not None and not (is_result(ack.frame) and ack.frame["result"] == {}):
            found.fail(f"shutdown answered {describe(ack.frame)}, not {{}}")
        for rid in (2, 3):
            answer = check_answered_once(found, obs, rid, f"search {rid}")
            if answer is None:
                continue
            found.fact(f"search {rid}: {describe(answer.frame)}")
            if is_cancelled(answer.frame):
                found.observe(f"search {rid} was cancelled rather than finished")
            elif not is_result(answer.frame):
                found.fail(f"search {rid} answered {describe(answer.frame)}")
        if ack is not None and any(r.at > ack.at for r in obs.received):
            found.observe("frames followed the {} acknowledgement (streamd answers it last)")
        sent = obs.sent_at("shutdown 4")
        found.time("shutdown_to_ack_ms", sent, ack.at if ack else None)
        found.time("shutdown_to_exit_ms", sent, obs.exited_at)
        return found.judgement()

    return Scenario(
        "shutdown-inflight", "9", "recall/shutdown with two searches in flight",
        "shutdown lets in-flight work finish, answers {} as the last frame and exits 0",
        RECALL, steps, judge,
    )


def _eof_inflight(held_ms: int) -> Scenario:
    def steps(place: Place) -> list[Step]:
        return [
            s.bind(s.initialize(held_ms), place, "initialize 1"), Await(1),
            s.bind(s.search(2), place, "search 2"), s.bind(s.search(3), place, "search 3"),
            Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        found = _start(obs, [1, 2, 3])
        for rid in (2, 3):
            got = answers(obs, rid)
            if len(got) > 1:
                check_answered_once(found, obs, rid, f"search {rid}")
            elif not got:
                found.observe(f"search {rid} was never answered; the process exited")
            elif not is_cancelled(got[0].frame):
                found.observe(f"search {rid} answered {describe(got[0].frame)}")
            else:
                found.fact(f"search {rid}: {describe(got[0].frame)}")
            found.time(f"eof_to_answer_{rid}_ms", obs.closed_at, got[0].at if got else None)
        found.time("eof_to_exit_ms", obs.closed_at, obs.exited_at)
        return found.judgement()

    return Scenario(
        "eof-inflight", "10", "End of input with two held searches in flight",
        "Recall requests in flight are cancelled (-32007, once each); the process exits 0",
        EOF_RULE, steps, judge,
    )


def _eof_inflight_eventlog() -> Scenario:
    watch = s.request(2, "eventlog/watch", {"from_seq": 0})

    def steps(place: Place) -> list[Step]:
        return [s.bind(watch, place, "eventlog/watch 2"), Close()]

    def judge(obs: Observation) -> Judgement:
        found = _start(obs, [2])
        got = answers(obs, 2)
        if len(got) > 1:
            check_answered_once(found, obs, 2, "eventlog/watch 2")
        elif not got:
            found.observe("eventlog/watch 2 was never answered")
        elif error_code(got[0].frame) == -32601:
            found.observe("the adapter serves no event log methods (-32601)")
        elif is_cancelled(got[0].frame):
            found.fail("the watch was cancelled; an event log request finishes at end of input")
        elif is_result(got[0].frame):
            found.fact(f"eventlog/watch 2 finished: {got[0].data.decode('utf-8', 'replace')}")
        else:
            found.observe(f"eventlog/watch 2 answered {describe(got[0].frame)}")
        found.time("eof_to_answer_ms", obs.closed_at, got[0].at if got else None)
        found.time("eof_to_exit_ms", obs.closed_at, obs.exited_at)
        return found.judgement()

    return Scenario(
        "eof-inflight-eventlog", "10b", "End of input with an eventlog/watch open",
        "an event log request finishes at end of input (a watch answers {last_seq})",
        EOF_RULE, steps, judge,
    )


# --------------------------------------------------------------------------
# 11: the LSP spelling
# --------------------------------------------------------------------------


def _cancel_lsp_spelling(held_ms: int, held: bool) -> Scenario:
    lines = [s.initialize(held_ms), s.search(2), s.cancel(2, "$/cancelRequest")]

    def steps(place: Place) -> list[Step]:
        # Live, recall/cancel follows a round trip later, so an adapter that
        # ignores the LSP spelling still ends the search without a 30 s wait.
        return [
            s.bind(s.initialize(held_ms), place, "initialize 1"), Await(1),
            s.bind(s.search(2), place, "search 2"),
            s.bind(lines[2], place, "$/cancelRequest 2"),
            s.bind(s.health(3), place, "health 3"), Await(3),
            s.bind(s.cancel(2), place, "recall/cancel 2"), Await(2), Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        lockstep = obs.sent_at("health 3") is None
        found = _start(obs, [1, 2] if lockstep else [1, 2, 3])
        _cancelled(found, obs, 2, "search 2", held)
        if not lockstep and _arrived_before(obs, 2, "recall/cancel 2") is False:
            found.observe("$/cancelRequest was ignored; recall/cancel ended the search")
        got = answers(obs, 2)
        found.time(
            "cancel_to_answer_ms", obs.sent_at("$/cancelRequest 2"), got[0].at if got else None
        )
        return found.judgement()

    return Scenario(
        "cancel-lsp-spelling", "11", "A held search cancelled with $/cancelRequest",
        "recall/cancel is Recall's spelling; whether $/cancelRequest is honoured is observed",
        "LSP spelling, not in the Recall adapter protocol", steps, judge,
        case=tuple(lines), responses=2, volatile=(),
        description=(
            "A held search cancelled with $/cancelRequest, the LSP spelling of recall/cancel, "
            "which streamd honours as it does recall/cancel: -32007, once."
        ),
    )


# --------------------------------------------------------------------------
# The probe: does the settings schema offer debug_stall_ms?
# --------------------------------------------------------------------------


def probe(place: Place) -> list[Step]:
    """A handshake without settings beyond the file, to read the manifest."""
    return [s.bind(s.initialize(), place, "initialize 1"), Await(1), Close()]


def offers_stall(obs: Observation) -> bool | None:
    """Whether the handshake's settings_schema lists ``debug_stall_ms``; None
    when there was no manifest to read (the rows will say why)."""
    got = answers(obs, 1)
    if not got or not is_result(got[0].frame):
        return None
    manifest = got[0].frame["result"]
    schema = manifest.get("settings_schema") if isinstance(manifest, dict) else None
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return isinstance(properties, dict) and "debug_stall_ms" in properties
