"""What the Playground shows per session, for the language switch (specviz.ui.shown)."""
import threading

import pytest

from specviz.ui.shown import GONE, Shown, ShownRuns, Streaming


def _frame(tag, row_steps=0):
    return Shown(lambda lang, **_: (tag, lang), None, lambda: "en", row_steps)


def test_a_frame_is_drawn_in_the_language_asked_or_the_readers_own():
    langs = ["en"]
    shown = Shown(lambda lang, **first: (lang, first), None, lambda: langs[-1])
    assert shown.draw("fa") == ("fa", {})
    langs.append("fa")          # the reader switched while the Run ended: its last frame is in Persian
    assert shown.draw(read=True) == ("fa", {"read": True})


def test_a_run_marks_its_session_and_keeps_its_frame():
    shown = ShownRuns()
    assert shown.get("a") is None
    with shown.streaming("a") as mark:
        assert isinstance(shown.get("a"), Streaming)
        mark.drew = True
        assert shown.keep("a", _frame(1), mark)
    assert shown.get("a").draw("fa") == (1, "fa")


def test_a_run_that_ends_without_a_frame_leaves_what_its_page_shows():
    shown = ShownRuns()
    with shown.streaming("a") as mark:
        shown.keep("a", _frame(1), mark)
    with shown.streaming("a"):         # refused at the door: it drew nothing, the Run before stays drawn
        pass
    assert shown.get("a").draw("en") == (1, "en")
    with pytest.raises(RuntimeError):
        with shown.streaming("a") as mark:    # it drew, then failed: the page cannot be drawn again
            mark.drew = True
            raise RuntimeError("the runner failed mid-stream")
    assert shown.get("a") is GONE
    with shown.streaming("b") as mark:        # the first Run of a page, stopped after its first update
        mark.drew = True
    assert shown.get("b") is GONE
    with shown.streaming("c"):                # nothing ever drawn there: the waiting page is still right
        pass
    assert shown.get("c") is None


def test_a_later_stream_owns_the_page_and_the_earlier_ones_frame_is_not_kept():
    """Replay pressed during a Run: the Run, stopped, ends after the replay began; its frame must not cover
    the replay's mark (a switch would draw the Run over the replay)."""
    shown = ShownRuns()
    with shown.streaming("a") as run:
        run.drew = True
        with shown.streaming("a") as replay:
            replay.drew = True
            assert not shown.keep("a", _frame("run"), run)
            assert shown.get("a") is replay
        assert shown.keep("a", _frame("run"), run) is False      # the replay's frame ended the mark
    assert shown.get("a") is GONE


def test_old_frames_are_forgotten_and_a_run_under_way_never_is():
    shown = ShownRuns(keep=2)
    with shown.streaming("busy") as busy:
        for n in range(4):
            with shown.streaming(f"s{n}") as mark:
                shown.keep(f"s{n}", _frame(n), mark)
        assert shown.get("busy") is busy
        assert [shown.get(f"s{n}") is GONE for n in range(4)] == [True, True, False, False]


def test_frames_are_forgotten_by_their_size_too():
    shown = ShownRuns(keep=10, row_steps=100)
    for n, size in enumerate((60, 30, 50, 500)):
        with shown.streaming(f"s{n}") as mark:
            shown.keep(f"s{n}", _frame(n, size), mark)
    # 60 + 30 + 50 is over 100: the oldest goes; a frame over the whole budget stays, alone, the newest
    assert [shown.get(f"s{n}") is GONE for n in range(4)] == [True, True, True, False]


def test_two_sessions_at_once_keep_their_own_frames():
    shown, go = ShownRuns(), threading.Barrier(2)

    def run(session):
        go.wait()
        for n in range(200):
            with shown.streaming(session) as mark:
                mark.drew = True
                shown.keep(session, _frame((session, n)), mark)
    threads = [threading.Thread(target=run, args=(s,)) for s in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert shown.get("x").draw("en") == (("x", 199), "en") and shown.get("y").draw("en") == (("y", 199), "en")


def test_a_switch_that_a_run_overtakes_leaves_the_page_to_the_run():
    """Run pressed just after a language switch: the switch's redraw of the last Run, finished after the new
    Run began, must not reach the page (it would cover the new Run's first words with the old "Done.")."""
    import gradio as gr
    from types import SimpleNamespace

    from specviz.ui.playground import Playground
    from specviz.ui.stream import OUTPUTS

    page = Playground(SimpleNamespace())
    request = SimpleNamespace(session_hash="a")
    live = SimpleNamespace(knee_figure=lambda: "knee")
    pressed = []

    def draw(lang, **_):
        if pressed:                     # the Run is pressed while the switch draws (held: it is under way)
            pressed.append(page.shown.streaming("a"))
            pressed[-1].__enter__()
        return ("done in " + lang,) * len(OUTPUTS)
    with page.shown.streaming("a") as mark:
        mark.drew = True
        page.shown.keep("a", Shown(draw, live, lambda: "en"), mark)
    assert page.on_switch("fa", request)[0] == "done in fa"        # alone, the switch draws it again
    pressed.append(True)
    assert all(out == gr.skip() for out in page.on_switch("fa", request))
    assert isinstance(page.shown.get("a"), Streaming)
