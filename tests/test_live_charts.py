"""The Playground's live figures: built unchecked for speed, so each one is put through plotly's own checks
here, in both languages; and what a reader saw wrong in them (crowded change labels, half-token ticks, a
pass-time axis with no tick)."""
import json

import plotly.graph_objects as go
import pytest

from specviz import lessons
from specviz import live_charts as lc
from specviz.charts import LEGEND_CHARS
from specviz.serve.live import live_labels


def _series(n: int, step: float = 0.25, value: float = 120.0) -> lc.Series:
    s = lc.Series()
    for i in range(n):
        s.add(i * step, value + i % 7)
    return s


def _all_figures(lang: str):
    labels, rtl = live_labels(lang), lang == "fa"
    steps = [lc.PassPoint(9, 9, 0.0041), lc.PassPoint(12, 16, 0.0043)]
    marks = [(3.0, [("k=4", "depth 2→4")]), (9.0, [("B=8", "batch 1→8")])]
    return [lc.throughput_figure(_series(80), {r: _series(80) for r in range(8)}, marks,
                                 shared=_series(80), labels=labels, rtl=rtl),
            lc.hardware_figure(_series(40, value=50), _series(40, value=2), _series(40, value=1),
                               labels["util_psutil"], labels=labels, rtl=rtl),
            lc.acceptance_histogram([30, 12, 4, 0], labels=labels, rtl=rtl),
            lc.knee_live_figure(([1, 2, 4, 8, 16, 32, 64], [0.004] * 5 + [0.006, 0.011]), "curve", 32.0, steps,
                                "this step", labels, rtl),
            lc.knee_live_figure(None, "pending", None, [], "", labels, rtl)]


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_every_live_figure_passes_plotlys_checks(lang):
    for fig in _all_figures(lang):
        checked = go.Figure(fig.to_plotly_json())          # raises on a misspelt or invalid property
        assert checked.layout.template.layout.paper_bgcolor is not None   # the template travelled, spelt out
        assert checked.layout.paper_bgcolor == "rgba(0,0,0,0)"
        assert json.loads(fig.to_json())["layout"]["title"]["text"]
        if lang == "fa":                                   # a Persian title starts at the right
            assert checked.layout.title.xanchor == "right" and checked.layout.title.x > 0.9
        else:
            assert checked.layout.title.xanchor is None


def test_the_figures_share_a_template_none_of_them_changes():
    before = json.dumps(lc._template(), sort_keys=True)
    for fig in _all_figures("en"):
        fig.update_layout(template_layout_paper_bgcolor="red")   # what a caller might do to its own figure
        fig.to_json()
    assert json.dumps(lc._template(), sort_keys=True) == before


def test_crowded_change_markers_keep_one_label_each():
    """Dragging the depth slider through its range left a pile of rotated labels printed over each other;
    every change keeps its dotted line, and labels closer than MARKER_GAP of the axis keep only the last."""
    total = _series(41, step=0.5)                             # a 20 s axis
    marks = [(5.0, [("k=1", "depth 0→1")]), (5.2, [("k=2", "depth 1→2")]), (5.4, [("k=3", "depth 2→3")]),
             (12.0, [("B=4", "batch 1→4")])]
    fig = lc.throughput_figure(total, {}, marks)
    assert len(fig.layout.shapes) == 4
    assert [a.text for a in fig.layout.annotations] == ["B=4", "k=3"]
    assert [a.hovertext for a in fig.layout.annotations] == ["batch 1→4", "depth 2→3"]      # the sentence on hover
    apart = lc.throughput_figure(total, {}, [(2.0, [("k=1", "depth 0→1")]),
                                             (8.0, [("k=2", "depth 1→2"), ("B=3", "batch 1→3")])])
    assert sorted(a.text for a in apart.layout.annotations) == ["k=1", "k=2<br>B=3"]            # a line each


def test_acceptance_ticks_are_whole_tokens():
    fig = lc.acceptance_histogram([10, 3])
    assert fig.layout.xaxis.dtick == 1 and list(fig.data[0].x) == [0, 1]


@pytest.mark.parametrize("lo, hi", [(3.1, 4.4), (0.021, 0.034), (1.0, 900.0), (11.0, 12.5)])
def test_a_log_axis_always_has_two_ticks_inside_its_data(lo, hi):
    """A recorded pass-time curve that stayed between 3 and 4.5 ms drew no y tick at all (1-2-5 only)."""
    ticks = lc.log_ticks(lo, hi)
    inside = [v for v in ticks["tickvals"] if lo <= v <= hi]
    assert len(inside) >= 2, ticks
    assert ticks["ticktext"] == [f"{v:g}" for v in ticks["tickvals"]]
    if hi / lo > 100:                                       # a wide range keeps the sparse 1-2-5 ticks
        assert 3.0 not in ticks["tickvals"]


def test_a_flat_curve_far_below_the_lowest_tick_gets_a_tick_of_its_own():
    """A pass-time curve flat at 25 ms drew its lowest tick at 50: the floor is ticked, to two figures;
    a floor close under a round tick is left alone."""
    assert lc.log_ticks(25.3, 200.0)["tickvals"] == [25.0, 50.0, 100.0, 200.0]
    assert lc.log_ticks(13.0, 200.0)["tickvals"][:3] == [10.0, 20.0, 50.0]


def test_the_pass_time_figure_keeps_its_dot_and_knee():
    fig = _all_figures("en")[3]
    dot = next(t for t in fig.data if t.meta == "this-step")
    assert list(dot.x) == [12]
    assert any(t.yaxis == "y2" and list(t.x) == [32.0, 32.0] for t in fig.data)
    assert any(t.name == "padded width 16" for t in fig.data)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log" and fig.layout.yaxis.tickvals


def test_numbers_are_sent_rounded():
    s = lc.Series()
    s.add(1.23456789, 101.98765)
    s.add(2.0, None)
    fig = lc.throughput_figure(s)
    assert list(fig.data[0].x) == [1.23, 2.0] and list(fig.data[0].y) == [101.99, None]


def _step_figure(lang: str):
    """The pass-time figure of a Run whose latest step carried 28 tokens (4 rows + 24 verified drafts)
    past a knee of 8, on a machine whose roofline names its regime: the longest step label there is."""
    from specviz.hardware.passcurve import PassCurve
    from specviz.serve.live import LiveRun

    live = LiveRun(control=None, pair_label="pair", peaks=None, sampler=None, lang=lang, regime="overhead-bound")
    live.curve = PassCurve(tokens=(1, 2, 4, 8, 16, 32, 64), seconds=(0.001,) * 4 + (0.0015, 0.0022, 0.004),
                           device="cpu: 2 cores", path="eager", context=64)
    live.passes.extend([lc.PassPoint(8, 8, 0.001), lc.PassPoint(28, 28, 0.002)])
    live.last_rows = (4, 24)
    return live.knee_figure()


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_step_label_sits_above_the_plot_in_lines_a_phone_shows_whole(lang):
    """On a 390 px phone the step's one-line label ran off both sides of the chart; in Persian its parts
    read in reverse order (each part was isolated, the whole was not), and at the plot's top right it
    covered the curve's high end."""
    from specviz import lessons

    fig = _step_figure(lang)
    note = fig.layout.annotations[-1]
    assert note.yref == "paper" and note.y == 1 and note.yanchor == "bottom"      # above the plot area
    lines = note.text.split("<br>")
    assert len(lines) >= 2 and all(len(line) <= lc.STEP_CHARS + 12 for line in lines)
    assert fig.layout.margin.t >= lc.TITLE_TOP + lc.TITLE_LINE + lc.STEP_LINE * len(lines)
    curve = fig.data[0].name.split("<br>")          # the curve's long name, in the legend
    assert len(curve) == 2 and all(len(line) <= LEGEND_CHARS + 12 for line in curve)
    if lang == "fa":
        assert note.xanchor == "right"
        assert all(line.startswith(lessons.RLI) and line.endswith(lessons.PDI) for line in lines)
        assert "28" in lines[0]              # read from the right: this step's tokens come first
    else:
        assert lines[0].startswith("this step: 28 tokens per pass")


def test_a_long_live_title_wraps_and_the_plot_makes_room_for_it():
    long = lc.knee_live_figure(None, "pending", None, [], "", {"knee_title": "word " * 20}, False)
    short = lc.knee_live_figure(None, "pending", None, [], "", {"knee_title": "Pass time"}, False)
    assert long.layout.title.text.count("<br>") >= 2
    assert long.layout.margin.t - short.layout.margin.t == lc.TITLE_LINE * long.layout.title.text.count("<br>")


def test_lines_break_before_a_parenthesis_and_count_only_visible_characters():
    """A reader's review: a legend entry broke inside "همین / دستگاه" and the title inside "زمان / pass";
    two lines now break before a parenthesis where both halves fit, and Persian's zero-width non-joiners
    and the directional marks take no room."""
    from specviz.charts import text_width, wrap_title

    assert wrap_title("pass time, measured here (64 tokens of context)", 36) == [
        "pass time, measured here", "(64 tokens of context)"]
    # a parenthesis too long for one line still starts one (a line ending in it showed it turned in Persian)
    assert wrap_title("EAGLE on SGLang (published measurement, EAGLE-3 paper, Table 4)", 36) == [
        "EAGLE on SGLang", "(published measurement,", "EAGLE-3 paper, Table 4)"]
    assert wrap_title("x" * 36 + "y", 36) == ["x" * 36 + "y"]             # one word: never cut
    # after a colon: a recorded curve's where and when stay on one line
    assert wrap_title("recorded: NVIDIA H200, eager path, 2026-12-04", 36) == [
        "recorded:", "NVIDIA H200, eager path, 2026-12-04"]
    assert text_width("\u2067اندازه\u200cگیری\u200cشده\u2069") == len("اندازهگیریشده")
    assert wrap_title("\u200c" * 30 + "word word", 12) == ["\u200c" * 30 + "word word"]


def test_every_line_of_a_persian_label_is_right_to_left():
    """A Persian legend entry's last line held only "SpecDecode-Bench)": not isolated, plotly laid it out
    left-to-right and its bracket faced the wrong way."""
    from specviz import lessons
    from specviz.charts import lines_for

    text = lines_for("EAGLE روی vLLM (اندازه‌گیری منتشرشده، SpecDecode-Bench)", True, 24)
    assert all(line.startswith(lessons.RLI) and line.endswith(lessons.PDI) for line in text.split("<br>"))
    assert lines_for("SpecDecode-Bench (an English name)", True, 20).count(lessons.RLI) == 0


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_every_legend_entry_is_in_lines_a_phone_shows_whole(lang):
    """At 390 px the Persian MBU entry ran off the hardware chart's edge ("ME")."""
    import re

    for fig in _all_figures(lang):
        for trace in fig.data:
            if trace.name and trace.showlegend is not False:
                for line in trace.name.split("<br>"):
                    assert len(re.sub("[\u2066-\u2069]", "", line)) <= LEGEND_CHARS, (lang, trace.name)


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_an_estimate_over_100_percent_is_drawn_not_cut_and_the_peak_is_marked(lang):
    """MFU 231 % (a calibrated peak below what a pass reached) ran off the top of a fixed 0–105 axis."""
    labels, rtl = live_labels(lang), lang == "fa"
    over = lc.hardware_figure(_series(40, value=50), _series(40, value=90), _series(40, value=225),
                              labels["util_psutil"], labels=labels, rtl=rtl)
    assert over.layout.yaxis.range[1] >= 231
    # the peak's line is named in the legend, not by a note over the lines (it covered MBU, and the Persian title)
    (line,) = [tr for tr in over.data if tr.name == lc.lines_for(labels["peak_line"], rtl, lc.LEGEND_CHARS)]
    assert tuple(line.y) == (100, 100) and line.x[0] <= over.data[1].x[0] and line.x[-1] >= over.data[1].x[-1]
    assert not over.layout.annotations and not over.layout.shapes
    # a step timed at about zero seconds (a billion per cent), or inf: the axis stops at TOP_PERCENT
    wild = _series(40, value=225)
    wild.add(10.0, 1e9)
    wild.add(10.25, float("inf"))
    capped = lc.hardware_figure(_series(40, value=50), _series(40, value=90), wild, labels["util_psutil"],
                                labels=labels, rtl=rtl)
    assert capped.layout.yaxis.range[1] == pytest.approx(1.08 * lc.TOP_PERCENT)
    under = lc.hardware_figure(_series(40, value=50), _series(40, value=2), _series(40, value=1),
                               labels["util_psutil"], labels=labels, rtl=rtl)
    assert tuple(under.layout.yaxis.range) == (0, 105) and len(under.data) == 3


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_an_acceptance_chart_with_no_drafts_says_so(lang):
    """At depth 0 the chart was empty axes from −1 to 1, with nothing to say why."""
    labels, rtl = live_labels(lang), lang == "fa"
    empty = lc.acceptance_histogram([0, 0], labels=labels, rtl=rtl)
    (note,) = empty.layout.annotations
    assert note.text.replace("<br>", " ").replace(lessons.RLI, "").replace(lessons.PDI, "").split() == \
        labels["no_drafts"].replace(lessons.RLI, "").replace(lessons.PDI, "").split()
    assert tuple(empty.layout.yaxis.range) == (0, 1)
    drafted = lc.acceptance_histogram([3, 1], labels=labels, rtl=rtl)
    assert not drafted.layout.annotations and drafted.layout.yaxis.range is None


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_a_dial_moved_during_a_run_is_marked_and_named_at_both_ends(lang):
    """The dial moved from A = 0.2 to 0.95 mid-Run: the throughput chart jumped with no mark (the k and B
    moves had theirs), a saved Run replayed without it, and the theory's sentence named only the first A."""
    from types import SimpleNamespace

    from specviz.engine.request import RowStep, RunTotals, StepEvent
    from specviz.hardware.passcurve import PassCurve
    from specviz.serve.live import LiveRun
    from specviz.ui.dialview import theory_md
    from specviz.ui.playground import Playground

    live = LiveRun(control=None, pair_label="pair", peaks=None, sampler=None, lang=lang)
    live.curve = PassCurve((1, 2, 4, 8), (0.01, 0.011, 0.012, 0.02), "cpu: 2 cores", "fixed", 256)
    kept, totals = [], RunTotals()
    for i, rate in enumerate((0.2, 0.2, 0.95)):
        row = RowStep(0, [1, 2], 1, [1, 3], "correction")
        ev = StepEvent(i + 1, 1, 2, "fixed", [row], 0.0, 0.01, 0.0, 0.01, 0.0, 3, 9, 0, 0, 0, 0, 0)
        kept.append(live.record(ev, rate))
        totals.add(kept[-1])
    assert [len(ev.changes) for ev in kept] == [0, 0, 1]        # the Run keeps the move with its step
    replay = LiveRun(control=None, pair_label="pair", peaks=None, sampler=None, lang=lang)
    for ev in kept:
        replay.record(ev)                                       # a replay has no rates: the step names it
    for run in (live, replay):
        notes = [a.text for a in run.figures(read=False)[0].layout.annotations]
        assert any("A=0.95" in n for n in notes) and not any("A=0.2" in n for n in notes), notes
    plain = RunTotals(steps=6, tokens=6, row_steps=6, wall_s=0.06, verify_s=0.06)
    streamer = SimpleNamespace(steps=[(0.0, ev, {}) for ev in kept])
    result = Playground._theory(None, streamer, live, SimpleNamespace(totals=totals), plain, 0.2)
    assert (result["moved"], result["first"], result["last"]) == (True, 0.2, 0.95)
    said = theory_md(lang, result, live.curve, True)
    assert "0.20" in said and "0.95" in said, said


def test_the_pass_time_chart_and_the_counters_place_a_step_at_the_same_knee():
    """A 7-token step beside a measured knee of 6.6 read "past the knee" on the chart and "at the knee
    ≈ 7" in the counters above it (one of 7.3, "below"): both place it against the knee as they name it."""
    from specviz.hardware.passcurve import PassCurve
    from specviz.serve.live import LiveRun
    from specviz.serve.live import PassShape
    from specviz.ui import counters

    live = LiveRun(control=None, pair_label="pair", peaks=None, sampler=None, lang="en")
    live.curve = PassCurve(tokens=(1, 2, 4, 8, 16), seconds=(0.022, 0.022, 0.022, 0.024, 0.040),
                           device="cpu: 2 cores", path="eager", context=64)
    knee, measured = live.knee_for_counters()
    assert 7 < live.curve.knee < 7.5 and knee == 7 and measured
    for n, chart, said in ((6, "below the knee", "below"), (7, "at the knee", "at the knee"), (8, "past the knee", "past")):
        live.passes.append(lc.PassPoint(n, n, 0.03))
        live.last_rows = (1, n - 1)
        assert chart in live._step_label(live_labels("en"), live.curve.knee)
        assert said in counters.pass_md("en", PassShape(n, 1, 64, n), knee, measured)


def test_the_pass_time_axis_starts_at_one_token_a_pass():
    """A replay of plain decoding (every step 1 token a pass, no curve) ticked 0.125, 0.25, 0.5 tokens."""
    import math

    lone = lc.knee_live_figure(None, "curve", None, [lc.PassPoint(1, 1, 0.03)] * 3, "this step", live_labels("en"))
    lo, hi = lone.layout.xaxis.range
    assert 10 ** lo == pytest.approx(0.8) and 10 ** hi == pytest.approx(10)
    wide = lc.knee_live_figure(([1, 2, 64], [0.02, 0.02, 0.2]), "curve", 7.0, [lc.PassPoint(40, 48, 0.1)], "s",
                               live_labels("en"))
    assert 10 ** wide.layout.xaxis.range[1] == pytest.approx(80) and math.isclose(10 ** wide.layout.xaxis.range[0], 0.8)


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_a_runs_charts_share_one_time_axis_from_its_start_and_its_baseline_says_whose_they_are(lang):
    """A teacher saw the throughput chart span 0.25–6.6 s beside the hardware chart's 0.25–11 s: the Run's
    utilisation line went on through the plain baseline that followed it, and while that baseline streamed
    the same charts showed it under the Run's titles."""
    from types import SimpleNamespace

    from specviz.serve.live import LiveRun

    sampler = SimpleNamespace(recent=lambda s: [SimpleNamespace(util=40.0)], source="psutil")
    live = LiveRun(control=None, pair_label="pair", peaks=None, sampler=sampler, lang=lang)
    live.t0 -= 6.0                      # six seconds into the Run
    for i in range(4):
        live.tps.add(0.25 + i * 2.0, 100.0)
        live.util.add(0.1 + i * 1.9, 30.0)
    throughput, hardware, _ = live.figures(read=True)
    assert list(throughput.layout.xaxis.range) == list(hardware.layout.xaxis.range)
    start, end = hardware.layout.xaxis.range
    assert start == 0.0 and end >= 6.0                     # the latest reading joined at 6 s
    live.end()
    live.t0 -= 5.0                      # its baseline ran five seconds more
    _, after, _ = live.figures(read=True)
    assert max(after.data[0].x) < 6.5, after.data[0].x     # no reading of the baseline's time is the Run's
    title = live_labels(lang)["throughput_title"]
    assert throughput.layout.title.text.replace("<br>", " ").startswith(title.split("<br>")[0][:8])
    baseline = LiveRun(control=None, pair_label="pair", peaks=None, sampler=None, lang=lang, baseline=True)
    baseline.tps.add(0.2, 90.0)
    words = lessons.text(lang, "playground.chart.comparison_title", title="").replace("\u2066", "").replace("\u2069", "")
    for fig in (*baseline.figures(read=False)[:2], baseline.knee_figure()):
        shown = fig.layout.title.text.replace("<br>", " ").replace("\u2066", "").replace("\u2069", "").replace("\u2067", "")
        assert "k = 0" in shown and words.split()[-1] in shown, shown
    for fig in (throughput, hardware, live.knee_figure()):
        assert "k = 0" not in fig.layout.title.text, fig.layout.title.text


def test_a_rolled_window_starts_the_time_axis_at_its_oldest_reading():
    old = _series(400)                  # a long Run: the first 100 readings were let go
    assert old.rolled and lc.time_range([old]) == [old.x[0], old.x[-1]]
    assert lc.time_range([_series(10)]) == [0.0, 9 * 0.25] and lc.time_range([lc.Series()]) is None


def test_the_legend_says_which_line_is_one_step_and_which_a_mean_and_the_whole_batch_only_when_shared():
    """At batch 1 a teacher saw "row 1" jump between 25 and 195 tokens/s while "your rows" stayed at 30-105,
    with nothing to say that one is each step's rate and the other a mean; and "whole shared batch (all
    users)" drawn over a batch nobody shared."""
    from specviz.engine.request import RowStep, StepEvent
    from specviz.serve.live import LiveRun

    live = LiveRun(control=None, pair_label="pair", peaks=None, sampler=None, lang="en", shared=True)

    def step(i, users):
        row = RowStep(0, [1, 2], 1, [1, 3], "correction")
        return StepEvent(i, 1, 2, "fixed", [row], 0.0, 0.01, 0.0, 0.01, 0.0, 3, 9, 0, 0, 0, 0, 0, users=users)
    for i in range(3):
        live.record(step(i, 1))
    names = [d.name for d in live.figures(read=False)[0].data]
    assert names == ["row 1, each step", f"all rows, mean of the last {lc.SMOOTH_STEPS} steps"], names
    live.record(step(3, 2))                     # another user joined the batch
    names = [d.name for d in live.figures(read=False)[0].data]
    assert names[1] == f"your rows, mean of the last {lc.SMOOTH_STEPS} steps" and names[2].startswith("whole shared")
    assert live.recent.maxlen == lc.SMOOTH_STEPS
