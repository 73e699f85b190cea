"""The acceptance dial in the lesson: breadth vs depth and the sweep on the synthetic draft (the target's own
tokens, labelled synthetic everywhere, the reference's price reported), the page's dial and its deep link,
and a real browser that moves the slider, runs the sweep and sees the chart and the sentence change."""
from __future__ import annotations

import csv
import re
import shutil
from types import SimpleNamespace

import gradio as gr
import pytest
from test_app import _close_toasts, _toast, browser_page, needs_chromium

from specviz import lessons
from specviz.chapters import BY_KEY, breadth_depth, sweep
from specviz.chapters.base import Context
from specviz.engine.request import Knobs
from specviz.ui import lesson

DIAL_CHAPTERS = ("breadth_depth", "sweep", "frontier", "ledger")


def test_the_dial_chapters_are_breadth_depth_sweep_frontier_and_ledger():
    assert {k for k, c in BY_KEY.items() if c.dial} == set(DIAL_CHAPTERS)


# --- the sweep on the synthetic draft --------------------------------------------------------------------

def _sweep_with_outputs(monkeypatch, pair, prompt, rate_label: str):
    """run_sweep's last result and every cell's outputs, (batch, depth) → outputs."""
    seen: dict[tuple[int, int], dict] = {}
    real = sweep.timed_run

    def spy(pair, prompts, depth, batch, max_new, **kw):
        run = real(pair, prompts, depth, batch, max_new, **kw)
        seen[(batch, depth)] = run.outputs
        return run
    monkeypatch.setattr(sweep, "timed_run", spy)
    results = list(sweep.run_sweep(pair, prompt, batches=(1, 3), depths=(2,), max_new=8))
    return results, seen


@pytest.fixture(scope="module")
def swept(make_pair, prompts):
    """The sweep on the n-gram pair, and on its target with synthetic:A for A = 0, 0.7 and 1."""
    mp = pytest.MonkeyPatch()
    try:
        ngram = make_pair("ngram")
        out = {None: _sweep_with_outputs(mp, ngram, prompts[0], "ngram")}
        for rate in (0.0, 0.7, 1.0):
            out[rate] = _sweep_with_outputs(mp, ngram.with_synthetic(rate), prompts[0], f"synthetic:{rate}")
    finally:
        mp.undo()
    return out


def test_sweep_on_the_synthetic_draft_writes_the_targets_own_tokens(swept):
    _, real = swept[None]
    for rate in (0.0, 0.7, 1.0):
        _, syn = swept[rate]
        assert syn.keys() == real.keys()
        for cell, outputs in syn.items():
            assert outputs == real[cell], (rate, cell)


def test_sweep_acceptance_is_the_dial_at_its_ends_and_measured_between(swept):
    for rate, want in ((0.0, 0.0), (1.0, 1.0)):
        last = swept[rate][0][-1]
        spec = [r for r in last["table"] if r["depth"] > 0]
        assert all(r["drafted"] > 0 for r in spec)
        assert all(r["accepted"] == (r["drafted"] if rate == 1.0 else 0) for r in spec)
        assert last["conclusion_values"][0]["measured"] == last["conclusion_values"][0]["first"] == want
    mid = swept[0.7][0][-1]["conclusion_values"][0]
    # a later draft is kept only after every draft before it: fewer of all drafts than of first drafts
    assert 0.0 < mid["measured"] < mid["first"] < 1.0 and mid["acceptance"] == 0.7


def test_sweep_result_says_synthetic_and_prices_its_reference(swept):
    results, _ = swept[0.7]
    last = results[-1]
    assert all(r["synthetic"] == 0.7 for r in results)
    assert last["reference_s"] > 0 and last["realigned"] == 0
    assert last["settings"]["draft"] == "synthetic:0.7"
    assert {r["draft"] for r in last["table"]} == {"synthetic:0.7"}
    assert last["conclusions"] == ["dial_measured", "conclusion_best", last["conclusion"]]
    real = swept[None][0][-1]
    assert real["synthetic"] is None and real["reference_s"] is None and "dial_measured" not in real["conclusions"]


@pytest.mark.parametrize("lang, says", [("en", "Synthetic draft (A = 0.7)"), ("fa", "draft مصنوعی")])
def test_sweep_conclusion_chart_and_csv_say_synthetic(swept, tmp_path, lang, says):
    from specviz.ui.runs import write_csv

    last = swept[0.7][0][-1]
    md = lesson.conclusion_md(lang, last)
    assert md.startswith(says) and "{" not in md
    seconds = f"{last['reference_s']:.1f}"
    assert seconds in md                               # the reference's price, in the note under it
    fig = sweep.figure_sweep(last, lesson.chart_labels(lang, "sweep"))
    title = fig.layout.title.text
    heat = next(t for t in fig.data if t.type == "heatmap")
    assert heat.showlegend and heat.name == title and "0.7" in title
    assert ("synthetic draft" if lang == "en" else "draft مصنوعی") in title
    real = sweep.figure_sweep(swept[None][0][-1], lesson.chart_labels(lang, "sweep"))
    assert real.layout.title.text is None and not next(t for t in real.data if t.type == "heatmap").showlegend
    path = tmp_path / "sweep.csv"
    write_csv(str(path), last["table"])
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    assert rows and all(r["draft"] == "synthetic:0.7" for r in rows)


# --- breadth vs depth on the synthetic draft --------------------------------------------------------------

@pytest.fixture(scope="module")
def bd(make_pair, prompts):
    """Breadth vs depth with synthetic:A (A = 0, 0.7, 1) and each depth arm's outputs."""
    mp = pytest.MonkeyPatch()
    out = {}
    real = breadth_depth.depth_yield
    try:
        for rate in (0.0, 0.7, 1.0):
            outputs = {}

            def spy(engine, refs, prompt_ids, n, max_new):
                got = real(engine, refs, prompt_ids, n, max_new)
                if got["depth_passes"]:                    # it decoded (not deeper than the engine drafts)
                    outputs[n] = engine.outputs()
                return got
            mp.setattr(breadth_depth, "depth_yield", spy)
            pair = make_pair("ngram").with_synthetic(rate)
            results = list(breadth_depth.run_breadth_depth(pair, context=16, ns=(1, 2, 4, 32), repeats=1,
                                                           prompt_ids=prompts[1], max_new=12))
            out[rate] = (results, outputs)
    finally:
        mp.undo()
    return out


def test_breadth_depth_depth_arm_writes_the_targets_own_tokens(make_pair, prompts, bd):
    eng = make_pair("ngram").engine(eos_ids=[])
    list(eng.generate([prompts[1]], Knobs(0, breadth_depth.DIAL_ROWS), 12))
    own = eng.outputs()
    for rate in (0.0, 0.7, 1.0):
        outputs = bd[rate][1]
        assert sorted(outputs) == [1, 2, 4]                # 32 − 1 drafts is deeper than the engine drafts
        assert all(o == own for o in outputs.values()), rate


def test_breadth_depth_tokens_per_pass_follow_the_dial(bd):
    """Every draft right: a pass moves a row n tokens; none right: one."""
    for rate, moved in ((1.0, lambda n: n), (0.0, lambda n: 1)):
        rows = bd[rate][0][-1]["table"]
        for r in rows:
            if r["tokens_per_pass"] in (1, 2, 4):
                assert r["depth_tokens_per_pass"] == moved(r["tokens_per_pass"]) and r["depth_passes"] > 0
                assert r["breadth_tokens_per_pass"] == r["tokens_per_pass"]
            else:
                assert r["depth_tokens_per_pass"] is None
    mid = [r["depth_tokens_per_pass"] for r in bd[0.7][0][-1]["table"][:3]]
    assert mid[0] == 1 and 1 <= mid[1] <= 2 and 1 <= mid[2] <= 4


@pytest.mark.parametrize("lang, says", [("en", "Synthetic draft (A = 0.7)"), ("fa", "draft مصنوعی")])
def test_breadth_depth_says_synthetic_everywhere(bd, lang, says):
    results, _ = bd[0.7]
    last = results[-1]
    assert all(r["synthetic"] == 0.7 for r in results) and last["reference_s"] > 0
    assert last["conclusions"][0] == "dial_yield" and last["conclusion_values"][0]["n"] == 4
    assert all(r["draft"] == "synthetic:0.7" for r in last["table"])
    md = lesson.conclusion_md(lang, last)
    assert md.startswith(says) and "{" not in md and f"{last['reference_s']:.1f}" in md
    fig = breadth_depth.figure_breadth_depth(last, lesson.chart_labels(lang, "breadth_depth"))
    assert "0.7" in fig.layout.title.text
    names = [t.name for t in fig.data]
    assert any(fig.layout.title.text in n for n in names)      # the measured line names the synthetic draft


def test_breadth_depth_without_the_dial_is_unchanged(make_pair):
    last = list(breadth_depth.run_breadth_depth(make_pair("ngram"), context=16, ns=(1, 2), repeats=1))[-1]
    assert last["synthetic"] is None and last["conclusions"] == [last["conclusion"]]
    assert "depth_tokens_per_pass" not in last["table"][0]
    assert breadth_depth.figure_breadth_depth(last).layout.title.text is None


# --- the page: the dial's value, its refusals and its deep link -------------------------------------------

@pytest.mark.parametrize("value, want", [(0.7, 0.7), ("0.8", 0.8), (0, 0.0), ("1", 1.0), (0.123, 0.12),
                                         ("1.5", None), (-0.1, None), ("nan", None), ("x", None), (None, None),
                                         (True, None), ("inf", None)])
def test_parse_acceptance(value, want):
    assert lesson.parse_acceptance(value) == want


def test_a_bad_dial_is_one_sentence_in_each_language():
    assert lesson.dial_value(False, 0.35) is None                   # unticked: the pair's own draft
    assert lesson.dial_value(True, 0.35) == 0.35
    for on in (True, False):                                        # an API caller's bad A, ticked or not
        for lang, word in (("en", "acceptance must be a number from 0 to 1"), ("fa", "acceptance باید عددی")):
            with pytest.raises(Exception) as err:
                lesson.dial_value(on, "2", lang)
            assert word in str(err.value) and "\n" not in str(err.value)
    for on in ("abc", None, 1, [1]):
        with pytest.raises(Exception, match="'synthetic' must be true or false"):
            lesson.dial_value(on, 0.5)


def _ran(draft: str, **extra) -> dict:
    return {"settings": {"draft": draft}, **extra}


def test_a_result_that_did_not_run_the_synthetic_draft_is_refused():
    lesson.check_dial(_ran("ngram"), None, "en")                            # no dial: anything goes
    lesson.check_dial(_ran("synthetic:0.7", reference_s=0.0), 0.7, "en")
    for result in (_ran("ngram", reference_s=1.0), _ran("synthetic:0.5", reference_s=1.0), _ran("synthetic:0.7"),
                   _ran("synthetic:x", reference_s=1.0), {}):
        with pytest.raises(Exception, match="ran without the synthetic draft"):
            lesson.check_dial(result, 0.7, "en")


def test_the_frontier_runs_under_the_dial(make_pair, prompts):
    """The lead's frontier reads ctx.acceptance: its first snapshot passes the page's check and its
    conclusion gets the synthetic note."""
    from specviz.chapters import frontier

    ctx = Context(pair=make_pair("ngram"), prompt=prompts[0], pool=prompts, grounded=tuple(prompts[:2]),
                  acceptance=0.6)
    first = next(iter(BY_KEY["frontier"].run(ctx)))
    lesson.check_dial(first, 0.6, "en")
    assert frontier.CHAPTER.dial and lesson.ran_with(first) == 0.6


def test_the_experiment_gets_the_dial_in_its_context(make_pair, monkeypatch):
    seen = []
    fake = SimpleNamespace(run=lambda ctx: seen.append(ctx) or iter(()), has_experiment=True)
    monkeypatch.setitem(lesson.BY_KEY, "sweep", fake)
    taught = lesson.Lesson(SimpleNamespace(peaks=None))
    taught._experiment("sweep", make_pair("ngram"), "en", 0.8)()
    taught._experiment("sweep", make_pair("ngram"), "en")()
    assert [c.acceptance for c in seen] == [0.8, None] and isinstance(seen[0], Context)


def _dials():
    taught = SimpleNamespace(dials={ch: (object(), object(), object()) for ch in ("breadth_depth", "sweep")})
    comps = [c for trio in taught.dials.values() for c in trio]
    return taught, comps, [{"label": "x"} for _ in comps]


def test_deep_link_acceptance_ticks_every_dial():
    taught, comps, updates = _dials()
    lesson.restore_dials(taught, {"chapter": "sweep", "acceptance": "0.8"}, "en", comps, updates)
    for on, slider, line in taught.dials.values():
        assert updates[comps.index(on)] == {"label": "x", "value": True}
        assert updates[comps.index(slider)] == {"label": "x", "value": 0.8, "interactive": True}
        assert updates[comps.index(line)]["value"] == ""
    taught, comps, updates = _dials()
    lesson.restore_dials(taught, {"chapter": "sweep"}, "en", comps, updates)
    assert updates == [{"label": "x"}] * len(comps)                     # no parameter: nothing changes


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_deep_link_bad_acceptance_is_refused_in_one_sentence(lang):
    taught, comps, updates = _dials()
    lesson.restore_dials(taught, {"acceptance": "1.7"}, lang, comps, updates)
    for on, slider, line in taught.dials.values():
        assert updates[comps.index(on)] == {"label": "x"} and updates[comps.index(slider)] == {"label": "x"}
        said = updates[comps.index(line)]["value"]
        assert "1.7" in said and "\n" not in said
        assert said == lessons.say(lang, lessons.Said("errors.bad_acceptance", value="1.7"))


# --- through the served app and in a real browser ---------------------------------------------------------

@pytest.fixture(scope="module")
def served(classroom):
    from apphelp import client, pair_label

    _, url, _ = classroom
    c = client(url)
    return c, pair_label(c), url


def test_api_runs_a_dial_chapter_synthetic_and_refuses_a_bad_dial(served):
    from gradio_client.exceptions import AppError

    c, label, _ = served
    note, _, _, result = c.predict(label, True, 0.8, api_name="/lesson_breadth_depth")
    assert result["synthetic"] == 0.8 and result["reference_s"] > 0
    assert note.startswith("Synthetic draft (A = 0.8)")
    # gradio's own bound check, named by the dial's label and its bounds
    with pytest.raises(AppError, match=r"(?i)acceptance.* must be from 0 to 1, not 1\.5"):
        c.predict(label, True, 1.5, api_name="/lesson_breadth_depth")


def _run_sweep_in(page, expect: str, lang: str = "en", timeout: int = 180000) -> str:
    """Press the sweep's button and wait for the conclusion that names `expect` and ends with "measured on
    this machine" (not the running line, nor the last run's sentence); returns its first paragraph."""
    page.locator("#run-sweep").click()
    page.wait_for_function("([want, done]) => { const t = document.querySelector('#conclusion-sweep').innerText;"
                           " return t.includes(want) && t.includes(done); }",
                           arg=[expect, lessons.text(lang, "app.measured_here")], timeout=timeout)
    return page.locator("#conclusion-sweep p").first.inner_text()


def _chart(page) -> dict:
    return page.evaluate("""() => { const p = document.querySelector('#plot-sweep .js-plotly-plot');
        const heat = p.data.find((t) => t.type === 'heatmap');
        return {title: (p.layout.title && p.layout.title.text) || '', z: heat.z, name: heat.name || ''}; }""")


def _set_dial(page, value: float) -> None:
    box = page.locator("#dial-sweep input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_function(f"document.querySelector('#dial-sweep input[type=range]').value == '{value}'",
                           timeout=10000)


@needs_chromium
def test_browser_slider_moves_the_sweep_in_english_and_persian(served, tmp_path):
    _, _, url = served
    with browser_page(1500) as page:
        page.goto(url + "?tab=lesson&chapter=sweep")
        page.wait_for_selector("#chapter-sweep", state="visible", timeout=30000)
        slider = page.locator("#dial-sweep input[type=range]")
        assert not page.locator("#dial-on-sweep input").is_checked() and slider.is_disabled()
        page.locator("#dial-on-sweep input").check()
        page.wait_for_function("!document.querySelector('#dial-sweep input[type=range]').disabled", timeout=10000)
        # read when the sweep starts, yet a typo past the dial's end is refused as it is typed (the slider
        # alone would move to 1 in silence and the sweep would run at a value nobody chose)
        page.locator("#dial-sweep input[type=number]").fill("5")
        page.locator("#dial-sweep input[type=number]").press("Enter")
        said = _toast(page, "must be from 0 to 1")
        assert re.search(r"(?i)acceptance.* must be from 0 to 1, not 5: the slider is set to 1 instead\.", said), said
        page.locator("#dial-sweep input[type=number]").press("Tab")        # its box moves to the bound
        page.wait_for_function("Number(document.querySelector('#dial-sweep input[type=number]').value) === 1",
                               timeout=5000)
        _close_toasts(page)
        _set_dial(page, 0.3)
        low = _run_sweep_in(page, "A = 0.3")
        chart_low = _chart(page)
        page.screenshot(path="/tmp/specviz-dial-sweep-0.3.png", full_page=True)
        _set_dial(page, 0.95)
        high = _run_sweep_in(page, "A = 0.95")
        chart_high = _chart(page)
        page.screenshot(path="/tmp/specviz-dial-sweep-0.95.png", full_page=True)
        assert low.startswith("Synthetic draft (A = 0.3)") and high.startswith("Synthetic draft (A = 0.95)"), (low, high)
        assert chart_low["title"] == chart_low["name"] == "synthetic draft (A = 0.3)", chart_low
        assert chart_high["title"] == "synthetic draft (A = 0.95)" and chart_high["z"] != chart_low["z"], chart_high
        # copy link carries the dial
        page.locator("#copy-link").click()
        page.wait_for_function("document.querySelector('#link input').value.includes('acceptance=0.95')",
                               timeout=10000)

        page.goto(url + "?tab=lesson&chapter=sweep&acceptance=0.8&lang=fa")
        page.wait_for_function("document.documentElement.getAttribute('dir') === 'rtl'", timeout=30000)
        page.wait_for_function("(document.querySelector('#dial-on-sweep input') || {}).checked === true",
                               timeout=30000)
        assert page.locator("#dial-sweep input[type=number]").input_value() == "0.8"
        fa = _run_sweep_in(page, "0.8", "fa")
        chart_fa = _chart(page)
        page.screenshot(path="/tmp/specviz-dial-sweep-fa-0.8.png", full_page=True)
        assert fa.startswith("draft مصنوعی") and "0.8" in fa
        assert "draft مصنوعی" in chart_fa["title"] and "0.8" in chart_fa["title"]

        page.goto(url + "?tab=lesson&chapter=sweep&acceptance=2")
        page.wait_for_function("(document.querySelector('#dial-said-sweep') || {innerText: ''}).innerText"
                               ".includes('acceptance must')", timeout=30000)
        assert not page.locator("#dial-on-sweep input").is_checked()
        page.screenshot(path=str(tmp_path / "bad.png"))
        shutil.copy(tmp_path / "bad.png", "/tmp/specviz-dial-bad-link.png")


def _taught(monkeypatch, experiment, now):
    """A Lesson with one fake chapter ("race") whose experiment is `experiment`; `now["lang"]` is every
    session's language."""
    from specviz.serve.gate import DeviceGate

    fake = SimpleNamespace(figure=lambda result, labels, dark: labels["_lang"], has_experiment=True)
    monkeypatch.setitem(lesson.BY_KEY, "race", fake)
    app = SimpleNamespace(peaks=None, gate=DeviceGate(), runner=SimpleNamespace(zero_gpu=False),
                          choice=lambda label, lang: SimpleNamespace(label=label), load=lambda choice, lang: None,
                          tr=SimpleNamespace(lang_of=lambda session: now["lang"]))
    taught = lesson.Lesson(app)
    taught.shown = [("race", None, None)]
    monkeypatch.setattr(taught, "_experiment", lambda *a: experiment)
    monkeypatch.setattr(lesson, "check_dial", lambda *a: None)
    return taught


def test_a_running_chapter_speaks_the_language_switched_to(monkeypatch):
    """A reader switches language while a chapter runs: the switch redraws its running line at once, and
    its next progress line and chart come in the new language (they stayed in the old one)."""
    import threading

    step = threading.Event()

    def experiment():
        yield {"done": False, "progress": 0.25}
        step.wait(10)
        yield {"done": False, "progress": 0.5}

    now = {"lang": "en"}
    taught = _taught(monkeypatch, experiment, now)
    run = taught._run("race", "pair", "en", session="s1")
    try:
        running_en = lessons.text("en", "chapter.race.running")
        assert next(run)[0] == running_en
        assert next(run)[:2] == (f"{running_en} (25%)", "en")
        now["lang"] = "fa"
        running_fa = lessons.text("fa", "chapter.race.running")
        assert taught.redraw("fa", "s1")[0][0] == f"{running_fa} (25%)"
        assert taught.redraw("fa", "other") == [(gr.skip(), gr.skip())]      # another session's page is left alone
        step.set()
        assert next(run)[:2] == (f"{running_fa} (50%)", "fa")
    finally:
        step.set()
        run.close()
    assert taught._live == {}                    # a chapter that ended is no longer redrawn as running


def test_a_chapter_pressed_during_the_warm_up_waits_for_it_and_runs_on_the_warm_pair(monkeypatch):
    """The knee pressed right after start timed the eager path beside the fast path's warm-up (2 tokens at
    1.6× one, 4× slower a token): the chapter waits, saying so, and runs on the pair the warm-up made."""
    from specviz.serve.catalog import FastStatus

    states, loads, ran = iter(["warming", "warming"]), [], []
    taught = _taught(monkeypatch, lambda: iter([{"done": False, "progress": 0.5}]), {"lang": "en"})
    monkeypatch.setattr(lesson, "WARMUP_POLL_S", 0.0)
    taught.app.pairs = SimpleNamespace(fast_status=lambda choice: FastStatus(next(states, "ready")))
    taught.app.load = lambda choice, lang: loads.append("eager" if len(loads) == 0 else "fast") or loads[-1]
    monkeypatch.setattr(taught, "_experiment", lambda chapter, pair, *a: ran.append(pair) or (lambda: iter(
        [{"done": False, "progress": 0.5}])))
    run = taught._run("race", "pair", "en", session="s1")
    try:
        lines = [next(run)[0] for _ in range(3)]
    finally:
        run.close()
    waiting = lessons.text("en", "playground.warmup_wait", seconds=0, limit=lesson.WARMUP_WAIT_S)
    assert lines[0][:60] == waiting[:60] and lines[1][:60] == waiting[:60]
    assert lines[2] == lessons.text("en", "chapter.race.running") and ran == ["fast"]


def test_a_chapter_that_ends_leaves_another_runs_line(monkeypatch):
    """API calls share one session: two runs of a chapter at once, the first ends, and the second, still
    waiting for the device, is still redrawn as waiting (the first's end removed its line), although the
    first updated its line after the second's."""
    def experiment():
        yield {"done": False, "progress": 0.25}
        yield {"done": False, "progress": 0.5}

    taught = _taught(monkeypatch, experiment, {"lang": "en"})
    first, second = taught._run("race", "pair", "en"), taught._run("race", "pair", "en")
    try:
        next(first), next(first)                 # the first holds the device
        next(second)
        waiting = next(second)[0]                # the second waits for it
        assert waiting == lessons.text("en", "app.queue_position", pos=1)
        assert next(first)[0].endswith("(50%)")
        first.close()
        assert taught.redraw("en", "default")[0][0] == waiting
    finally:
        first.close()
        second.close()
    assert taught._live == {}                    # a chapter that ended is no longer redrawn as running
