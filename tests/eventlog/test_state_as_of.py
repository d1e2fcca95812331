"""``state.get`` as of a seq: read newest delta first, the same state as the
fold of every delta up to that seq, keys in the order they were first set.

Checked against a plain fold of the deltas for random histories on every
backend (``fx``); the cost test counts the steps SQLite takes, which no clock
or load changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.sqlite_cost import vm_steps
from support.store_contract import T0, Fixture, ap, ev

from streamd.eventlog.model import SessionCreateParams, StateDelta
from streamd.eventlog.sqlite import SqliteOptions, SqliteStore

_KEYS = st.sampled_from(["a", "b", "c", "d", "temp", "é"])
_SCOPE = st.none() | st.dictionaries(_KEYS, st.integers(0, 9) | st.none(), max_size=3)
# (user, session, app delta, user delta, session delta) per append.
_WRITES = st.lists(
    st.tuples(st.sampled_from(["u1", "u2"]), st.sampled_from(["s1", "s2"]), _SCOPE, _SCOPE, _SCOPE),
    max_size=25,
)


def _folded(deltas: list[tuple[int, dict[str, Any]]], as_of: int) -> list[tuple[str, Any]]:
    """The plain fold: every delta up to ``as_of``, oldest first."""
    state: dict[str, Any] = {}
    for seq, delta in deltas:
        if seq <= as_of:
            state.update(delta)
    return list(state.items())


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writes=_WRITES, created=_SCOPE)
def test_a_state_as_of_any_seq_is_the_fold_of_every_delta_up_to_it(
    fx: Fixture, writes: list[tuple[str, str, Any, Any, Any]], created: dict[str, Any] | None
) -> None:
    for table in ("events", "sessions", "state_deltas", "app_states", "user_states"):
        fx.raw(f"DELETE FROM {table}", ())
    history: dict[tuple[str, str, str], list[tuple[int, dict[str, Any]]]] = {}
    sessions = {(user, session) for user, session, *_ in writes}
    if created:  # a session made with state takes its place at the newest seq given
        fx.store.create_session(
            SessionCreateParams(app="app", user="u1", session="s0", state=created), T0
        )
        at = fx.store.get_state("app", "u1", "s0", None).seq
        history[("session", "u1", "s0")] = [(at, created)]
        sessions.add(("u1", "s0"))
    seqs = [
        result.seq
        for result in fx.store.append_batch(
            [
                ap(ev(f"e{i}"), user=user, session=session,
                   state_delta=StateDelta(app=app, user=mine, session=own))
                for i, (user, session, app, mine, own) in enumerate(writes)
            ],
            T0,
        )
    ]
    for seq, (user, session, app, mine, own) in zip(seqs, writes, strict=True):
        for key, scoped in ((("app", "", ""), app), (("user", user, ""), mine),
                            (("session", user, session), own)):
            if scoped:
                history.setdefault(key, []).append((seq, scoped))
    newest = max(seqs, default=0)
    for as_of in range(max(0, newest - 30), newest):
        for user, session in sorted(sessions):
            got = fx.store.get_state("app", user, session, as_of)
            assert list(got.app.items()) == _folded(history.get(("app", "", ""), []), as_of)
            assert got.user is not None and got.session is not None
            assert list(got.user.items()) == _folded(history.get(("user", user, ""), []), as_of)
            assert list(got.session.items()) == _folded(
                history.get(("session", user, session), []), as_of
            )


def test_a_state_as_of_a_seq_reads_back_only_until_every_key_has_its_value(
    tmp_path: Path,
) -> None:
    # 2,000 deltas of the app's two keys: as of the middle, the newest delta
    # up to it answers. Oldest first, all 1,000 up to it were read.
    store = SqliteStore.open(str(tmp_path / "events.db"), SqliteOptions(synchronous="NORMAL"))
    seqs = [
        r.seq
        for r in store.append_batch(
            [ap(ev(f"e{i}"), state_delta=StateDelta(app={"n": i, "m": -i})) for i in range(2000)],
            T0,
        )
    ]
    got, steps = vm_steps(store, lambda: store.get_state("app", None, None, seqs[999]))
    assert list(got.app.items()) == [("n", 999), ("m", -999)]
    assert steps < 500, steps
    store.close()


def test_a_current_state_that_does_not_parse_leaves_the_fold_of_every_delta(
    fx: Fixture,
) -> None:
    for i in range(3):
        fx.store.append(ap(ev(f"e{i}"), state_delta=StateDelta(app={f"k{i}": i})), T0)
    newest = fx.store.latest_seq(None)
    fx.raw("UPDATE app_states SET state = '{broken'", ())
    assert fx.store.get_state("app", None, None, newest - 1).app == {"k0": 0, "k1": 1}


def test_a_state_as_of_a_seq_on_mysql_reads_only_the_rows_it_folds(mysql_db: str) -> None:
    # The same 2,000 deltas. MariaDB read every delta up to the middle seq
    # for one statement ordered by (seq, rev) and sorted them: its rows
    # examined (Handler_read_*) grew with the log.
    from streamd.eventlog.mysql.store import MysqlStore

    store = MysqlStore.open(mysql_db)
    try:
        seqs = [
            r.seq
            for r in store.append_batch(
                [ap(ev(f"e{i}"), state_delta=StateDelta(app={"n": i, "m": -i}))
                 for i in range(2000)],
                T0,
            )
        ]
        cur = store.connection.cursor()
        cur.execute("ANALYZE TABLE state_deltas")
        cur.fetchall()
        cur.execute("FLUSH STATUS")
        got = store.get_state("app", None, None, seqs[999])
        cur.execute("SHOW SESSION STATUS LIKE 'Handler_read%'")
        examined = sum(int(value) for _, value in cur.fetchall())
        assert list(got.app.items()) == [("n", 999), ("m", -999)]
        assert examined < 50, examined
    finally:
        store.close()
