"""The token stream's HTML: one span per token with exactly one tok-* class; chat markup as badges."""
import re

import pytest

from specviz.engine.request import RowStep
from specviz.ui.render import CLASS, RowView, rows_html, special_name, tokens_html
from test_app import browser_page, needs_chromium

KINDS = set(CLASS.values())


def spans(html: str) -> list[tuple[str, bool, str]]:
    """(class attribute, is markup (badge or role name), shown text) of every span."""
    return [(m[1], bool(m[2]), m[3]) for m in
            re.finditer(r'<span class="([^"]*)"( data-special="1"| data-role="1")?(?: title="[^"]*")?>(.*?)</span>',
                         html, re.S)]


def test_chat_markup_becomes_badges_with_their_class():
    view = RowView()
    # step 1: the n-gram draft proposes the chat template; the target rejects it and writes "The"
    view.add_step(0, RowStep(0, [1, 2, 3, 7], 0, [4], "correction"), None,
                  pieces=[[], ["<|im_start|>", "ass", "istant", "\n"], ["The"]])
    # step 2: kept "sky", target's own "<|im_end|>"
    view.add_step(1, RowStep(0, [5], 1, [5, 6], "bonus"), None, pieces=[[" sky"], [], ["<|im_end|>"]])
    got = spans(view.html())
    assert [c for c, _, _ in got] == ["tok-rejected"] * 4 + ["tok-bonus", "tok-accepted", "tok-bonus"]
    assert all(c in KINDS for c, _, _ in got)            # exactly one token class per span
    badges = [(c, text) for c, badge, text in got if badge]
    assert badges == [("tok-rejected", "⟨im_start⟩"), ("tok-rejected", "ass"), ("tok-rejected", "istant"),
                      ("tok-bonus", "⟨im_end⟩")]             # the role line is markup up to its newline
    assert not any("|" in text for _, _, text in got)           # no markup reads as text
    assert 'title="step 2: kept 1 of 1 drafts · &lt;|im_end|&gt;"' in view.html()   # raw text in the tooltip
    # a step's tooltip is said once, on the element around its tokens (not a span: every span is a token)
    step2 = re.search(r'<i class="step" title="step 2: kept 1 of 1 drafts">(.*?)</i>', view.html())[1]
    assert [text for _, _, text in spans(step2)] == [" sky", "⟨im_end⟩"]
    assert view.html().count("title=") == 2 + 2 and view.html().count('<i class="step-sep"></i>') == 1


def test_ordinary_text_and_look_alikes_stay_text():
    assert special_name("<s>") is None                            # also an HTML tag a model may write
    assert special_name("<script>") is None
    assert special_name("a <|b|> c") is None                      # markup inside text is not a whole token
    assert special_name("</s>") == "s" and special_name("<|endoftext|>") == "endoftext"
    view = RowView()
    view.add_step(0, RowStep(0, [], 0, [7], "plain"), None, pieces=[[], [], ['<script>alert("x")</script>']])
    (cls, badge, text), = spans(view.html())
    assert cls == "tok-plain" and not badge and text == "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"


def test_role_line_across_steps_ends_at_its_newline():
    view = RowView()
    for step, piece in enumerate(["<|im_start|>", "user", "\n", "user", "<|im_start|>", "a", "b", "c", "d"]):
        view.add_step(step, RowStep(0, [], 0, [step], "plain"), None, pieces=[[], [], [piece]])
    marks = [b for _, b, _ in spans(view.html())]
    assert marks == [True, True, False, False, True, True, True, True, False]   # a role is at most 3 pieces


def test_each_row_opens_on_its_prompt_and_its_coloured_text():
    views = {}
    for row, prompt in ((0, "Repeat <b>this</b>"), (1, ""), (2, "Summarise")):
        views[row] = RowView(prompt=prompt)
        views[row].add_step(0, RowStep(row, [1, 2], 1, [1, 3], "bonus"), None, pieces=[[f"r{row}"], ["x"], ["y"]])
    page = rows_html(views, {1: "· finished"})
    rows = re.findall(r'<details class="row" data-row="(\d+)"><summary class="row-line">(.*?)</summary>'
                      r'<div class="row-body">(.*?)</div></details>', page, re.S)
    assert [r for r, _, _ in rows] == ["0", "1", "2"] and "Click a row" in page
    line, body = rows[1][1], rows[1][2]
    assert "row 2" in line and "1/2 kept · finished" in line and "tok-" not in line     # the line: counts only
    assert "Prompt" not in body                                    # a row whose prompt is unknown (a replay)
    assert [(c, text) for c, _, text in spans(body)] == [("tok-accepted", "r1"), ("tok-rejected", "x"),
                                                         ("tok-bonus", "y")]
    assert "Repeat &lt;b&gt;this&lt;/b&gt;" in rows[0][2] and "<b>this" not in page      # a prompt is text
    assert rows_html({}, {}) == '<div class="rows" dir="ltr"></div>'                  # no hint before a Run
    # while a Run streams, a row shows its last parts after a mark (every update carries every row)
    for step in range(1, 30):
        views[2].add_step(step, RowStep(2, [], 0, [4], "plain"), None, pieces=[[], [], [f"w{step}"]])
    streaming = rows_html(views, {}, tail=3)
    last = re.search(r'data-row="2">.*?<div class="tok-stream" dir="auto">(.*?)</div>', streaming, re.S)[1]
    assert last.startswith('<i class="row-cut">…</i>') and [t for _, _, t in spans(last)] == ["w27", "w28", "w29"]
    assert "w1<" in rows_html(views, {}) and "row-cut" not in rows_html(views, {})   # the whole text at the end


def test_the_counters_name_the_knee_the_chart_measured_else_the_estimate():
    """The counters sit above the pass-time chart: where the chart has a measured knee they name that one
    (two different knees on one page confused a reader), else the roofline's estimate, said as such."""
    from specviz.serve.live import PassShape
    from specviz.ui.counters import pass_md

    measured = pass_md("en", PassShape(10, 2, 64, 10), 18, measured=True)
    assert "below the knee measured on the pass-time chart ≈ **18**" in measured and "estimate" not in measured
    estimate = pass_md("en", PassShape(10, 2, 64, 10), 7)
    assert "past this device's knee ≈ **7** (estimate)" in estimate
    # a pass of the knee's own size is at it, not past it (a reviewer read "8 tokens … past the knee ≈ 8")
    assert "at the knee measured on the pass-time chart ≈ **10**" in pass_md("en", PassShape(10, 2, 64, 10), 10,
                                                                            measured=True)
    assert "درست روی knee" in pass_md("fa", PassShape(10, 2, 64, 10), 10)
    assert "**1** token per target pass (1 row + 0 verified drafts)" in pass_md("en", PassShape(1, 1, 64, 1), None)


def test_the_counters_count_the_tokens_the_chart_counts():
    """A reader saw "117 tokens per target pass (batch 9 × (k + 1))" above a chart saying "60 tokens per
    pass · 9 rows + 51 verified drafts": the counters now count what the pass carried, as the chart does,
    and name what the path computed where its padding or holes make that more."""
    from specviz.serve.live import PassShape
    from specviz.ui.counters import pass_md

    text = pass_md("en", PassShape(60, 9, 64, 117), None)
    assert text.startswith("**60** tokens per target pass (9 rows + 51 verified drafts); its path computed 117")
    assert "computed" not in pass_md("en", PassShape(60, 9, 64, 60), None)
    fa = pass_md("fa", PassShape(60, 9, 64, 60), None)
    assert "ردیف + " in fa and "حدس verify شده)" in fa and "batch" not in fa


def test_the_regime_says_where_the_two_knees_disagree():
    """At 7 tokens a reader saw "below the knee measured ≈ 8 · regime: compute-bound": the roofline's knee
    (6) and the measured one (8) differ and the pass lies between them; the line says so. Where they
    agree, or nothing was measured, the regime is named as before."""
    from specviz.serve.live import PassShape
    from specviz.ui.counters import regime_md

    at7 = PassShape(7, 1, 64, 7)
    between = regime_md("en", "compute-bound", at7, 8, True, 6)
    assert "whose knee here is ≈ 6" in between and "between that knee and the measured one" in between
    assert regime_md("en", "memory-bound", PassShape(9, 1, 64, 9), 8, True, 12).count("between that knee") == 1
    for agreed in (regime_md("en", "compute-bound", at7, 8, False, 6),      # no measured knee
                   regime_md("en", "compute-bound", PassShape(9, 1, 64, 9), 8, True, 6),
                   regime_md("en", "memory-bound", at7, 8, True, 12)):
        assert agreed.startswith("regime: **") and "between" not in agreed
    # 5 tokens below both knees yet compute-bound (a long prompt's row in the batch): not "between" them
    mixed = regime_md("en", "compute-bound", PassShape(5, 5, 4000, 5), 8, True, 6)
    assert "between" not in mixed and "for this step as it ran, with its 5 rows" in mixed
    assert "for this step as it ran" in regime_md("en", "compute-bound", PassShape(5, 5, 4000, 5), 6, False, 6)
    one = regime_md("en", "compute-bound", PassShape(5, 1, 64, 5), 6, False, 6)        # one row: the draft's passes
    assert "the draft's passes included" in one and "1 row" not in one
    assert regime_md("en", "uncalibrated", at7, 8, True, 6).startswith("regime: not known yet")
    assert regime_md("en", "") == ""


def test_theory_says_which_side_of_the_measurement_the_prediction_lies():
    """A reader could not read "the prediction is -62% off": it now says "62% below the measurement"."""
    from specviz.hardware.passcurve import PassCurve
    from specviz.ui.dialview import theory_md

    curve = PassCurve((1, 2, 4, 8), (0.01, 0.011, 0.012, 0.02), "cpu: 2 cores", "fixed", 256)
    base = dict(predicted_speedup=1.34, measured_speedup=3.57, tokens_per_step=1.8, rate=0.5, agree=False,
                main="tokens", f_tokens=1.81)
    gap = 1.34 / 3.57 - 1
    below = theory_md("en", {**base, "difference": gap, "abs_difference": -gap}, curve, False)
    assert "the prediction lies 62% below the measurement" in below and "off" not in below
    above = theory_md("en", {**base, "difference": 0.25, "abs_difference": 0.25}, curve, False)
    assert "25% above the measurement" in above
    assert "پایین‌تر از" in theory_md("fa", {**base, "difference": -0.62, "abs_difference": 0.62}, curve, False)
    assert "Nearly as large" not in below
    both = {**base, "difference": gap, "abs_difference": -gap, "runner_up": "passes", "f_passes": 0.55, "close": 0.05}
    assert "Nearly as large: the passes themselves (×0.55). The two lie within 5%" in theory_md("en", both, curve, False)
    assert "تقریباً به همان بزرگی: خود passها" in theory_md("fa", both, curve, False)


def test_a_row_that_drafted_nothing_is_not_drawn_as_rejections():
    """A first-time user read a pink 'rejected' bar and '0/0 kept' on rows that never drafted."""
    plain, drafting = RowView(), RowView()
    plain.add_step(0, RowStep(0, [], 0, [5], "plain"), None, pieces=[[], [], ["a"]])
    drafting.add_step(0, RowStep(1, [1, 2], 0, [7], "own"), None, pieces=[[], ["x y"], ["b"]])
    page = rows_html({0: plain, 1: drafting}, {})
    lines = re.findall(r'<summary class="row-line">(.*?)</summary>', page, re.S)
    assert "row-bar-none" in lines[0] and "no drafts (plain decoding)" in lines[0] and "0/0" not in lines[0]
    assert "row-bar-none" not in lines[1] and "0/2 kept" in lines[1]


@needs_chromium
@pytest.mark.parametrize("page_class", ["", "sv-rtl"])
def test_a_line_breaks_between_words_never_inside_a_number_at_a_step(page_class):
    """Plain decoding makes every token a step, and a step's separator let the line break anywhere: "5" | "2,"
    across two lines, a line starting with ", 43" (a first-time user, "Count from 1 to 100")."""
    from pathlib import Path

    view = RowView()
    pieces = [p for n in range(1, 101) for p in ([",", " "] if n > 1 else []) + list(str(n))]
    for i, piece in enumerate(pieces):            # one token a step, as plain decoding draws them
        view.add_step(i, RowStep(row=0, drafted=[], accepted=0, emitted=[i], last_kind="plain"), None, [[], [], [piece]])
    css = (Path(__file__).parents[1] / "assets" / "style.css").read_text(encoding="utf-8")
    with browser_page(700, width=420) as page:
        page.set_content(f"<style>{css}</style><div class='{page_class}'><div id='tokens' style='width:380px'>"
                         f"{tokens_html(view)}</div></div>")
        lines = page.evaluate("""() => { const rows = new Map();
            for (const s of document.querySelectorAll('#tokens span')) {
              const top = Math.round(s.getBoundingClientRect().top);
              rows.set(top, (rows.get(top) || '') + s.textContent); }
            return [...rows.values()]; }""")
    assert len(lines) > 3, lines                      # it did wrap
    for line in lines:
        assert not line.startswith(","), lines
    assert "".join(lines) == "".join(pieces)
    numbers = [int(w) for line in lines for w in line.replace(",", " ").split()]
    assert numbers == list(range(1, 101)), lines          # no number cut in two across lines


def test_the_counters_name_kept_over_drafted_drafts_kept_not_acceptance():
    """At A = 0.70, k = 4 the counter read "acceptance 44 %" beside the dial's 0.70: kept ÷ drafted counts
    the drafts after a rejection, so it is named for what it counts."""
    from specviz.engine.request import RunTotals
    from specviz.ui.counters import counters_md

    line = counters_md("en", RunTotals(steps=10, tokens=20, row_steps=10, drafted=100, accepted=44, wall_s=1.0))
    assert "drafts kept **44%** of all drafted" in line and "acceptance" not in line, line
    # beside the theory's α (of the guesses the target reached) it says what it divides by
    assert "a guess after a rejected one counts as not kept" in line, line
    # nothing drafted yet (plain decoding, the baseline): said so, not "drafts kept — of all drafted"
    plain = counters_md("en", RunTotals(steps=10, tokens=10, row_steps=10, wall_s=1.0))
    assert "no drafts yet" in plain and "drafts kept" not in plain, plain
