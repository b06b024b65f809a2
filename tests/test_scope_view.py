"""store.live.ScopeView: eligibility by set intersection for open-ended records equals the window
check of every record, through admissions, removals and reads pinned at any instant."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engram_memory.store.core.live import ScopeView, Window

instants = st.integers(min_value=0, max_value=100)
windows = st.builds(
    Window,
    valid_t=instants,
    valid_t_end=st.one_of(st.none(), instants),
    expires_at_ms=st.one_of(st.none(), instants),
    event_at=st.one_of(st.none(), instants),
    turn=st.booleans(),
)
ids = st.sampled_from([f"r{i}" for i in range(12)])
steps = st.lists(st.one_of(st.tuples(st.just("put"), ids, windows), st.tuples(st.just("pop"), ids, st.none())),
                 max_size=30)


def by_window(view: ScopeView, record_ids: set[str], valid_as_of: int, now: int) -> set[str]:
    return {rid for rid in record_ids if rid in view.live and view.live[rid].eligible(valid_as_of, now)}


@given(st.dictionaries(ids, windows), steps, st.lists(st.tuples(instants, instants), min_size=1, max_size=5),
       st.sets(st.sampled_from([f"r{i}" for i in range(15)])))
def test_eligible_equals_the_window_check(initial: dict[str, Window], changes: list, reads: list,
                                          asked: set[str]) -> None:
    view = ScopeView(0, dict(initial))
    for op, rid, window in changes:
        if op == "put":
            view.put(rid, window)
        else:
            view.pop(rid)
    assert view.steady == {rid for rid, w in view.live.items() if w.steady}
    assert set(view.timeline._at) == {rid for rid, w in view.live.items() if w.turn and w.event_at is not None}
    for valid_as_of, now in reads:
        assert view.eligible(asked, valid_as_of, now) == by_window(view, asked, valid_as_of, now)
        assert view.eligible(list(asked), valid_as_of, now) == by_window(view, asked, valid_as_of, now)


def test_a_read_pinned_before_a_steady_record_began_does_not_see_it() -> None:
    view = ScopeView(0, {"old": Window(10, None, None), "new": Window(50, None, None)})
    assert view.eligible({"old", "new"}, 60, 60) == {"old", "new"}
    assert view.eligible({"old", "new"}, 20, 60) == {"old"}
    view.pop("new")
    view.put("late", Window(90, None, None))
    assert view.eligible({"old", "late", "gone"}, 95, 95) == {"old", "late"}
    assert view.eligible({"old", "late"}, 70, 95) == {"old"}
    view.put("old", Window(10, 40, None))  # re-admitted with an end: no longer steady
    assert view.eligible({"old"}, 95, 95) == set()
