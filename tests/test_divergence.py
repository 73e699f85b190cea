"""The divergence report and its one near-tie rule (specviz.engine.divergence), on tiny models: identical
output, a forced near-tie, a forced real divergence, and the commands that use it (generate --check,
bench-hf) failing loudly on a bug."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from specviz import lessons
from specviz.engine import divergence as dv
from specviz.engine.request import Knobs


class TieAt:
    """The tiny target, except that after `length` tokens token `b`'s logit sits `gap` below token `a`'s:
    a near-tie (or not) forced at one position, everything else the model's own."""

    def __init__(self, model, length: int, a: int, b: int, gap: float):
        self.model, self.length, self.a, self.b, self.gap = model, length, a, b, gap

    def __call__(self, ids):
        out = self.model(ids)
        if ids.shape[1] == self.length:
            logits = out.logits.clone()
            logits[0, -1, self.b] = logits[0, -1, self.a] - self.gap
            return SimpleNamespace(logits=logits)
        return out


@pytest.fixture(scope="module")
def case(loaded, prompts, reference):
    """A prompt, the target's own 12 tokens, and its logits at position 5 (top token first)."""
    model = loaded["target"].model
    prompt, ref = prompts[0], reference(0, 12)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + ref[:5]])).logits[0, -1]
    order = torch.argsort(logits, descending=True).tolist()
    assert order[0] == ref[5]
    return model, prompt, ref, order


def test_the_rule_is_one_threshold():
    assert dv.NEAR_TIE == 0.05
    assert dv.is_near_tie(0.049) and not dv.is_near_tie(0.05) and not dv.is_near_tie(0.2)
    assert dv.is_near_tie(0.01, 0.0, 0.01)
    assert not dv.is_near_tie(0.01, 0.0, 0.3)          # the other candidate is far below the best
    assert dv.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert dv.first_difference([1, 2, 3], [1, 5, 3]) == 1 and dv.first_difference([1, 2], [1, 2, 3]) == 2


def test_identical_rows(loaded, make_pair, prompts):
    pair = make_pair("ngram")
    eng = pair.engine()
    list(eng.generate(prompts[:3], Knobs(depth=3, batch_size=3), 10))
    outs = eng.outputs()
    t = loaded["target"]
    rep = dv.check_against_target(t.model, t.device, t.eos_ids, [eng.prompt_of(i) for i in outs], list(outs.values()))
    assert rep.identical and rep.lossless and rep.verdict == "identical" and rep.rows == 3
    assert rep.tokens == sum(map(len, outs.values()))
    assert str(rep.sentences()[0]).startswith(f"Identical: all 3 rows, {rep.tokens} tokens")


def test_forced_near_tie_is_labelled_not_a_bug(case):
    model, prompt, ref, order = case
    ours = ref[:5] + [order[1]] + ref[6:]
    tied = TieAt(model, len(prompt) + 5, order[0], order[1], 0.01)
    rep = dv.compare_rows(tied, "cpu", [prompt, prompt], [ref, ours], [ref, ref])
    assert not rep.identical and rep.lossless and rep.verdict == "near-ties"
    (d,) = rep.divergences
    assert (d.row, d.position, d.ours, d.reference) == (1, 5, order[1], order[0])
    assert d.near_tie and d.margins.top1_minus_top2 == pytest.approx(0.01, abs=1e-4)
    assert d.margins.ours_minus_reference == pytest.approx(-0.01, abs=1e-4)
    said = d.said()
    assert said.key == "lossless.row_near_tie" and "Row 2: first difference at token 6" in said
    assert rep.as_dict()["divergences"][0]["near_tie"] is True


def test_forced_real_divergence_is_a_bug(case):
    model, prompt, ref, order = case
    worst = order[-1]                                   # the token the target likes least there
    ours = ref[:5] + [worst] + ref[6:]
    rep = dv.compare_rows(model, "cpu", [prompt], [ours], [ref])
    assert rep.verdict == "bug" and not rep.lossless and len(rep.bugs) == 1
    d = rep.bugs[0]
    assert d.margins.ours_gap > dv.NEAR_TIE and d.margins.reference_gap == pytest.approx(0.0, abs=1e-6)
    # a near-tie between the two best logits does not excuse a candidate far below them
    tied = TieAt(model, len(prompt) + 5, order[0], order[1], 0.01)
    assert dv.compare_rows(tied, "cpu", [prompt], [ours], [ref]).verdict == "bug"
    assert d.said().key == "lossless.row_bug" and "this is a bug" in d.said()
    assert "top-1 − top-2 < 0.05" in str(dv.rule_said())


def test_a_shorter_output_is_a_divergence_at_its_end(case):
    model, prompt, ref, _ = case
    rep = dv.compare_rows(model, "cpu", [prompt], [ref[:4]], [ref[:6]])
    (d,) = rep.divergences
    assert d.position == 4 and d.ours is None and d.reference == ref[4]
    assert "(end of output)" in d.said()


def test_sentences_speak_persian(case):
    from test_persian import english_outside_isolates

    model, prompt, ref, order = case
    tied = TieAt(model, len(prompt) + 5, order[0], order[1], 0.01)
    for ours, m in ((ref[:5] + [order[1]] + ref[6:], tied), (ref[:5] + [order[-1]] + ref[6:], model)):
        rep = dv.compare_rows(m, "cpu", [prompt], [ours], [ref])
        for said in rep.sentences(lambda ids: "x"):
            fa = lessons.say("fa", said)
            assert lessons.ARABIC_SCRIPT.search(fa) and not english_outside_isolates(fa), fa


def test_playground_check_writes_a_bug_in_red(case):
    """The Playground's answer: a near-tie plain with its explanation; a bug in the red class."""
    from specviz.ui.runs import lossless_md

    model, prompt, ref, order = case
    bug = dv.compare_rows(model, "cpu", [prompt], [ref[:5] + [order[-1]]], [ref[:6]])
    md = lossless_md("en", bug, 3, lambda ids: f"<t{ids[0]}>")
    assert md.count('<span class="sv-bug">') == 1 and "&lt;t" in md and "Checked the first 1 of 3 rows" in md
    tied = TieAt(model, len(prompt) + 5, order[0], order[1], 0.01)
    tie = dv.compare_rows(tied, "cpu", [prompt], [ref[:5] + [order[1]]], [ref[:6]])
    md = lossless_md("fa", tie, 1, lambda ids: "x")
    assert "sv-bug" not in md and lessons.text("fa", "app.lossless_near_tie") in md


def _cli(monkeypatch, capsys, *args):
    from specviz.__main__ import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_check_reports_and_fails_loudly_on_a_bug(tiny_paths, monkeypatch, capsys):
    args = ("generate", "--target", tiny_paths["target"], "--draft", tiny_paths["draft"], "--raw", "--prompt",
            "the quick", "--batch-size", "2", "--depth", "3", "--max-new-tokens", "8", "--compile", "off", "--check")
    code, out, err = _cli(monkeypatch, capsys, *args, "--json")
    final = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and final["lossless"]["verdict"] == "identical" and final["lossless"]["rows"] == 2
    # the same run with its check forced to find a divergence above the rule: exit 1, the bug on stderr
    real = dv.check_against_target

    def broken(model, device, eos, prompts, ours):
        ours = [list(o) for o in ours]
        with torch.inference_mode():
            logits = model(torch.tensor([prompts[1] + ours[1][:1]])).logits[0, -1]
        ours[1][1] = int(logits.argmin())               # the token the target likes least there
        return real(model, device, eos, prompts, ours)
    monkeypatch.setattr("specviz.cli.generate.check_against_target", broken)
    code, out, err = _cli(monkeypatch, capsys, *args)
    assert code == 1 and "Row 2: first difference at token 2" in err and "this is a bug" in err
    assert "--- lossless check ---" in out
    # the text output says what ran, where, and that its FLOPs are counted, not measured
    assert f"--- {tiny_paths['target']} with draft {tiny_paths['draft']}, depth 3, 2 rows, on " in out
    assert "--- forward path: eager" in out and "(counted from the models' shapes)" in out


def test_generate_check_needs_greedy(tiny_paths, monkeypatch, capsys):
    code, _, err = _cli(monkeypatch, capsys, "generate", "--target", tiny_paths["target"], "--draft", "ngram",
                        "--temperature", "0.7", "--check", "--max-new-tokens", "4")
    assert code == 2 and "--check compares greedy runs" in err


def test_dtype_flag_is_offered_and_says_what_it_costs(capsys):
    from specviz.__main__ import build_parser

    for command in ("generate", "bench-hf"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--dtype {auto,float32}" in text and "TF32 off" in text and "twice the memory" in text
    with pytest.raises(Exception, match="invalid choice"):
        build_parser().parse_args(["generate", "--dtype", "float16"])
