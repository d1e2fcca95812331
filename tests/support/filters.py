"""Filters and rows as hypothesis generates them."""

from __future__ import annotations

from hypothesis import strategies as st

from streamd.eventlog.model import Filter, SessionTree

# Characters chosen to hurt: LIKE wildcards, likely escape characters, both segment
# separators, the bytes next to them in ASCII, case pairs, the session-tree marker
# and one multi-byte character.
_ALPHABET = st.sampled_from([*list("aA%_!\\./-0:;sub"), "é"])


_text = st.text(_ALPHABET, max_size=6)


@st.composite
def _filters(draw: st.DrawFn, rows: list[tuple[str, str, str, str, str]]) -> Filter:
    # Draw filter values mostly from the rows' own values so matches happen.
    def value(i: int) -> st.SearchStrategy[str]:
        pool = [r[i] for r in rows]
        pieces = st.sampled_from(pool) if pool else _text
        return st.one_of(pieces, _text)

    def nonempty(i: int) -> st.SearchStrategy[str]:
        return value(i).filter(bool)

    tree = draw(
        st.none() | st.builds(SessionTree, app=nonempty(0), user=nonempty(1), parent=nonempty(2))
    )
    branch_values = value(3)
    prefixes = st.lists(
        st.one_of(branch_values.map(lambda b: b.split(".")[0]), branch_values, st.just("")),
        max_size=3,
    )
    return Filter(
        app=draw(st.none() | nonempty(0)),
        user=draw(st.none() | nonempty(1)),
        session=draw(st.none() | nonempty(2)),
        session_tree=tree,
        branch_prefixes=draw(st.none() | prefixes),
        author=draw(st.none() | value(4)),
        author_suffix=draw(st.one_of(st.just(""), value(4).map(lambda a: a[-2:]))),
    )


class _Row:
    """An entry's filtered fields, as the fan-out's Committed carries them."""

    def __init__(self, row: tuple[str, str, str, str, str]) -> None:
        self.app, self.user, self.session, self.branch, self.author = row

