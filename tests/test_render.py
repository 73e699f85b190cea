"""The token stream's HTML: one span per token with exactly one tok-* class; chat markup as badges."""
import re

from specviz.engine.request import RowStep
from specviz.ui.render import CLASS, RowView, special_name

KINDS = set(CLASS.values())


def spans(html: str) -> list[tuple[str, bool, str]]:
    """(class attribute, is markup (badge or role name), shown text) of every span."""
    return [(m[1], bool(m[2]), m[3]) for m in
            re.finditer(r'<span class="([^"]*)"( data-special="1"| data-role="1")? title="[^"]*">(.*?)</span>',
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


def test_the_counters_name_the_knee_the_chart_measured_else_the_estimate():
    """The counters sit above the pass-time chart: where the chart has a measured knee they name that one
    (two different knees on one page confused a reader), else the roofline's estimate, said as such."""
    from specviz.ui.counters import pass_md

    measured = pass_md("en", (10, 2, 64), 18, measured=True)
    assert "below the knee measured on the pass-time chart ≈ **18**" in measured and "estimate" not in measured
    estimate = pass_md("en", (10, 2, 64), 7)
    assert "past this device's knee ≈ **7** (estimate)" in estimate
    assert "**1** token per target pass" in pass_md("en", (1, 1, 64), None)
