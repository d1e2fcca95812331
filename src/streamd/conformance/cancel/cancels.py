"""The scenarios about recall/cancel itself: in flight, one of several, not in
flight, twice, racing the completion, malformed, and the LSP spelling (1-6, 11).
Each is a script, the rule it checks with its source, and a judge; see
:mod:`~streamd.conformance.cancel.scenario` for the holds and the sources.
"""

from __future__ import annotations

from collections.abc import Sequence

from streamd.conformance.cancel import script as s
from streamd.conformance.cancel.judging import (
    Judgement,
    answers,
    check_answered_once,
    describe,
    is_cancelled,
    is_result,
)
from streamd.conformance.cancel.scenario import (
    CANCEL_SCHEMA,
    HEALTH_VOLATILE,
    JSONRPC,
    RECALL,
    SEARCH_VOLATILE,
    Scenario,
    arrived_before,
    cancelled,
    lockstep_scenario,
    start,
    time_answer,
)
from streamd.conformance.cancel.script import Await, Close, Observation, Pause, Place, Send, Step

LSP_CASE_HOLD_MS = 5_000

# --------------------------------------------------------------------------
# 1-4: cancel in flight, one of several, not in flight, twice
# --------------------------------------------------------------------------


def cancel_inflight(held_ms: int, held: bool) -> Scenario:
    lines = [s.initialize(held_ms), s.search(2), s.cancel(2)]

    def judge(obs: Observation) -> Judgement:
        found = start(obs, [1, 2])
        cancelled(found, obs, 2, "search 2", held)
        time_answer(found, obs, 2, "recall/cancel 2")
        return found.judgement()

    return lockstep_scenario(
        "cancel-inflight", "1", "A search held in flight, then recall/cancel",
        "a cancelled request answers -32007, never a result, exactly once", RECALL,
        lines, 2, (), judge,
        "A search held in flight by debug_stall_ms, then recall/cancel for it. It is "
        "answered once, -32007 context canceled, and never with a result: the request was "
        "abandoned in flight. The reference answers the same.",
    )


def cancel_one_of_several(brief_ms: int, held: bool) -> Scenario:
    def steps(place: Place) -> list[Step]:
        return [
            s.bind(s.initialize(brief_ms), place, "initialize 1"), Await(1),
            *(s.bind(s.search(i), place, f"search {i}") for i in (2, 3, 4)),
            s.bind(s.cancel(3), place, "recall/cancel 3"),
            Await(2), Await(3), Await(4), Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        found = start(obs, [1, 2, 3, 4])
        cancelled(found, obs, 3, "search 3", held)
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
        time_answer(found, obs, 3, "recall/cancel 3")
        return found.judgement()

    return Scenario(
        "cancel-one-of-several", "2", "Three searches in flight, one cancelled",
        "only the cancelled request ends (-32007); the others answer results", RECALL,
        steps, judge,
    )


def cancel_not_inflight() -> Scenario:
    # health 3 is a request, so lockstep sends it only once search 2 is
    # answered: the cancels after it name an answered id and unsent ones.
    lines = [
        s.initialize(), s.search(2), s.health(3), s.cancel(2), s.cancel(99),
        s.cancel("never-sent"), s.health(4),
    ]

    def judge(obs: Observation) -> Judgement:
        found = start(obs, [1, 2, 3, 4])
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

    return lockstep_scenario(
        "cancel-not-inflight", "3",
        "recall/cancel for an id already answered, and for ids never sent",
        "a notification is never answered, so no frame; the adapter keeps serving", JSONRPC,
        lines, 4, SEARCH_VOLATILE + HEALTH_VOLATILE, judge,
        "Search 2 is answered; health 3, a request, makes the flow wait for that answer, so "
        "the cancels after it name an id already answered (2) and two never sent (99, "
        '"never-sent"). A notification is never answered: no frame for any of them, and '
        "health 4 shows the adapter still serving. The reference answers the same.",
    )


def cancel_twice(held_ms: int, held: bool) -> Scenario:
    lines = [s.initialize(held_ms), s.search(2), s.cancel(2), s.cancel(2), s.health(3)]

    def judge(obs: Observation) -> Judgement:
        found = start(obs, [1, 2, 3])
        cancelled(found, obs, 2, "search 2", held)
        check_answered_once(found, obs, 3, "health 3")
        time_answer(found, obs, 2, "recall/cancel 2")
        return found.judgement()

    return lockstep_scenario(
        "cancel-twice", "4", "The same recall/cancel sent twice for a held search",
        "one answer (-32007); the second cancel names a request no longer in flight", RECALL,
        lines, 3, HEALTH_VOLATILE, judge,
        "A search held in flight, then the same recall/cancel twice. The first ends it: "
        "-32007 context canceled, once. The second names a request no longer in flight "
        "and, a notification, is not answered; health 3 after it is served. The "
        "reference answers the same.",
    )


# --------------------------------------------------------------------------
# 5: the race of a cancel with the completion
# --------------------------------------------------------------------------


def _race_ids(trials: int, offsets: Sequence[float]) -> list[tuple[float, list[int]]]:
    # Ids 1000, 1001, ... for the first offset, 2000, ... for the second.
    return [
        (offset, [1000 * (i + 1) + t for t in range(trials)]) for i, offset in enumerate(offsets)
    ]


def cancel_races_completion(trials: int, offsets: Sequence[float]) -> Scenario:
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
        found = start(obs, [1, *ids])
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


def cancel_malformed(held_ms: int, held: bool) -> Scenario:
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
        found = start(obs, [1, 2, 8, 9, 10])
        as_request = check_answered_once(found, obs, 9, "the cancel sent as request 9")
        if as_request is not None:
            found.fact(f"as a request it was answered {describe(as_request.frame)}")
        if not lockstep:
            for rid in (8, 10):
                check_answered_once(found, obs, rid, f"health {rid}")
            # Only a -32007 is a cancel's doing. Unheld, search 2 may finish
            # with a result before any cancel is written, and how soon it does
            # is the machine's speed, not the adapter's fault.
            got = answers(obs, 2)
            ended_by_cancel = bool(got) and is_cancelled(got[0].frame)
            if ended_by_cancel and arrived_before(obs, 2, "cancel as request 9"):
                found.fail("search 2 ended before any well-formed cancel: a malformed one ended it")
            elif ended_by_cancel and arrived_before(obs, 2, "recall/cancel 2"):
                found.observe("the cancel sent as a request (id 9) cancelled search 2")
        cancelled(found, obs, 2, "search 2", held)
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
# 11: the LSP spelling
# --------------------------------------------------------------------------


def cancel_lsp_spelling(held_ms: int, held: bool) -> Scenario:
    # The recorded case holds the search 5 s, not 30: replayed against an
    # adapter that ignores this spelling it then ends (with a result, and a
    # clear difference) inside the replayer's 30 s limit.
    lines = [s.initialize(min(held_ms, LSP_CASE_HOLD_MS)), s.search(2),
             s.cancel(2, "$/cancelRequest")]

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
        found = start(obs, [1, 2] if lockstep else [1, 2, 3])
        cancelled(found, obs, 2, "search 2", held)
        if not lockstep and arrived_before(obs, 2, "recall/cancel 2") is False:
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
            "Deliberate difference: the reference ignores $/cancelRequest (it answers this "
            "search with a result once the 5 s hold ends). A held search cancelled with "
            "$/cancelRequest, the LSP spelling of recall/cancel, which streamd honours as it "
            "does recall/cancel: -32007 context canceled, once. Rule (LSP spelling, not in "
            "the Recall adapter protocol)."
        ),
    )


