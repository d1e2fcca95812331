"""The compact id list behaves as the list of strings it replaced."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamd.recall.index.idlist import TAIL, IdList

_ids = st.lists(st.text(max_size=6), max_size=TAIL + 10)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), _ids),
        st.tuples(st.just("append"), st.text(max_size=6)),
        st.tuples(st.just("truncate"), st.integers(min_value=0, max_value=3 * TAIL)),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(_steps)
def test_an_id_list_reads_back_as_the_list_it_was_given(steps):
    ref: list[str] = []
    ids = IdList()
    for op, arg in steps:
        if op == "extend":
            ref.extend(arg)
            ids.extend(arg)
        elif op == "append":
            ref.append(arg)
            ids.append(arg)
        else:
            del ref[arg:]
            ids.truncate(arg)
        assert len(ids) == len(ref)
    assert ids == ref and list(ids) == ref
    assert [ids[i] for i in range(len(ref))] == ref
    if ref:
        assert ids[-1] == ref[-1]
        mid = len(ref) // 2
        assert ids[mid:] == ref[mid:] and ids[1:mid] == ref[1:mid]


def test_ids_read_from_a_state_stay_whole_while_the_tail_is_folded():
    ids = IdList(f"r{i}" for i in range(TAIL - 1))
    published = len(ids)
    snapshot = ids._s
    ids.append("last")  # folds the tail into a block: a new state
    assert ids._s is not snapshot
    assert snapshot.tail[published - 1 - snapshot.held] == f"r{TAIL - 2}"
    assert ids[published] == "last"
