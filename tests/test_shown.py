"""What the Playground shows per session, for the language switch (specviz.ui.shown)."""
from specviz.ui.shown import BUSY, GONE, Shown, ShownRuns


def _frame(tag):
    return Shown(lambda lang, **_: (tag, lang), None)


def test_a_run_under_way_is_busy_and_its_frame_replaces_the_one_before():
    shown = ShownRuns()
    assert shown.get("a") is None
    with shown.streaming("a"):
        assert shown.get("a") is BUSY
        shown.keep("a", _frame(1))
    assert shown.get("a").draw("fa") == (1, "fa")
    with shown.streaming("a"):        # refused, or stopped before it began: the page keeps its words
        pass
    assert shown.get("a") is GONE
    with shown.streaming("b"):        # nothing was ever drawn there: the waiting page is still right
        pass
    assert shown.get("b") is None


def test_old_frames_are_forgotten_and_a_run_under_way_never_is():
    shown = ShownRuns(keep=2)
    with shown.streaming("busy"):
        for n in range(4):
            shown.keep(f"s{n}", _frame(n))
        assert shown.get("busy") is BUSY
        assert [shown.get(f"s{n}") is GONE for n in range(4)] == [True, True, False, False]


def test_frames_are_forgotten_by_their_size_too():
    shown = ShownRuns(keep=10, row_steps=100)
    for n, size in enumerate((60, 30, 50)):
        shown.keep(f"s{n}", Shown(lambda lang, **_: (), None, row_steps=size))
    assert [shown.get(f"s{n}") is GONE for n in range(3)] == [True, False, False]
    shown.keep("huge", Shown(lambda lang, **_: (), None, row_steps=500))     # the newest stays, alone
    assert shown.get("huge") is not GONE and shown.get("s2") is GONE
