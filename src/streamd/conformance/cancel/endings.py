"""The scenarios about how a request ends other than by recall/cancel: a
deadline past at arrival (for each method) or expiring mid-request,
recall/shutdown and end of input with work in flight (7-10).
"""

from __future__ import annotations

from streamd.conformance.cancel import script as s
from streamd.conformance.cancel.judging import (
    Judgement,
    answers,
    check_answered_once,
    describe,
    error_code,
    is_cancelled,
    is_result,
)
from streamd.conformance.cancel.scenario import (
    EOF_RULE,
    JSONRPC,
    MIDWAY_S,
    RECALL,
    Scenario,
    lockstep_scenario,
    start,
)
from streamd.conformance.cancel.script import Await, Close, Observation, Place, Send, Step

# --------------------------------------------------------------------------
# 7-8: deadlines
# --------------------------------------------------------------------------


_BUILDERS = {"search": s.search, "expand": s.expand, "health": s.health, "refresh": s.refresh}


def deadline_past(method: str) -> Scenario:
    build = _BUILDERS[method]
    lines = [s.initialize(), build(2, s.PAST_DEADLINE)]

    def judge(obs: Observation) -> Judgement:
        found = start(obs, [1, 2])
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

    return lockstep_scenario(
        f"deadline-past-{method}", "7" + "abcd"[list(_BUILDERS).index(method)],
        f"recall/{method} with a deadline already past at arrival",
        "a request that has run out of time answers -32007 (the reference: search only)",
        RECALL, lines, 2, (), judge, _past_why(method),
    )


def _past_why(method: str) -> str:
    what = (
        f"recall/{method} with a deadline in 2000, already past when it arrives, answers "
        "-32007 context deadline exceeded: a request that has run out of time is not "
        "worked on."
    )
    if method == "search":
        return what + " The reference answers the same."
    return (
        "Deliberate difference: the reference enforces a request's deadline only for "
        f"search, and serves this {method}. " + what
    )


def deadline_midway(held_ms: int, held: bool) -> Scenario:
    def steps(place: Place) -> list[Step]:
        search = s.bind(s.search(2, "${DEADLINE}"), place, "search 2")
        return [
            s.bind(s.initialize(held_ms), place, "initialize 1"), Await(1),
            Send(search.data, search.label, deadline_in=MIDWAY_S), Await(2), Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        found = start(obs, [1, 2])
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


def shutdown_inflight(brief_ms: int) -> Scenario:
    def steps(place: Place) -> list[Step]:
        return [
            s.bind(s.initialize(brief_ms), place, "initialize 1"), Await(1),
            s.bind(s.search(2), place, "search 2"), s.bind(s.search(3), place, "search 3"),
            s.bind(s.shutdown(4), place, "shutdown 4"), Await(4), Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        found = start(obs, [1, 2, 3, 4])
        ack = check_answered_once(found, obs, 4, "shutdown 4")
        if ack is not None and not (is_result(ack.frame) and ack.frame["result"] == {}):
            found.fail(f"shutdown answered {describe(ack.frame)}, not {{}}")
        for rid in (2, 3):
            answer = check_answered_once(found, obs, rid, f"search {rid}")
            if answer is None:
                continue
            if is_result(answer.frame):
                found.fact(f"search {rid}: finished, a result")
            else:
                # What in-flight work gets at shutdown is the protocol's to
                # leave open: streamd lets it finish; anything else is shown.
                found.observe(f"search {rid} answered {describe(answer.frame)}, not a result")
        # Arrival order, not time: frames in one read share a timestamp.
        if ack is not None and obs.received.index(ack) < len(obs.received) - 1:
            found.observe("frames followed the {} acknowledgement (streamd answers it last)")
        sent = obs.sent_at("shutdown 4")
        found.time("shutdown_to_ack_ms", sent, ack.at if ack else None)
        found.time("shutdown_to_exit_ms", sent, obs.exited_at)
        return found.judgement()

    return Scenario(
        "shutdown-inflight", "9", "recall/shutdown with two searches in flight",
        "recall/shutdown answers {} and the process exits 0; each request in flight is "
        "answered once (what it gets, and whether {} comes last, is observed)",
        f"{RECALL}; {JSONRPC}", steps, judge,
    )


def eof_inflight(held_ms: int) -> Scenario:
    def steps(place: Place) -> list[Step]:
        return [
            s.bind(s.initialize(held_ms), place, "initialize 1"), Await(1),
            s.bind(s.search(2), place, "search 2"), s.bind(s.search(3), place, "search 3"),
            Close(),
        ]

    def judge(obs: Observation) -> Judgement:
        found = start(obs, [1, 2, 3])
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


def eof_inflight_eventlog() -> Scenario:
    watch = s.request(2, "eventlog/watch", {"from_seq": 0})

    def steps(place: Place) -> list[Step]:
        return [s.bind(watch, place, "eventlog/watch 2"), Close()]

    def judge(obs: Observation) -> Judgement:
        found = start(obs, [2])
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


