"""Depth policies: what each one plans, and the registry (engine/policies.py) that every user reads: parse
checks without building, build makes one policy per request, the door checks live changes too, and the CLI
runs with the values the door returned."""
import ast
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from specviz import lessons
from specviz.engine.policies import (FIXED, POLICIES, POLICY_NAMES, AdaptiveGoodput, BatchTable, FixedPolicy,
                                     PlanContext, PolicyChoice, PolicyError, StepObservation, make_policy,
                                     parse_table)
from specviz.engine.request import Knobs
from specviz.limits import LimitError
from specviz.serve.control import ControlFile, LocalControl

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specviz"


def test_fixed_and_disable():
    assert make_policy("fixed").plan(PlanContext(32, 5)).depth == 5
    p = make_policy("disable-by-batch-size", threshold=8)
    assert p.plan(PlanContext(8, 4)).depth == 4
    assert p.plan(PlanContext(9, 4)).depth == 0


def test_batch_table_picks_largest_key_not_above_b():
    p = make_policy("batch-table", table=parse_table("1:6,8:2,32:0"))
    assert [p.plan(PlanContext(b, 4)).depth for b in (1, 7, 8, 31, 64)] == [6, 6, 2, 2, 0]


def test_confidence_carries_threshold():
    plan = make_policy("confidence", threshold=0.3).plan(PlanContext(2, 6))
    assert plan.depth == 6 and plan.confidence == 0.3


@pytest.mark.parametrize("bad", [dict(name="nope"), dict(name="confidence", threshold=1.5),
                                 dict(name="disable-by-batch-size", threshold=-1),
                                 dict(name="adaptive", max_depth=99)])
def test_bad_policies_are_refused(bad):
    with pytest.raises(PolicyError):
        make_policy(bad.pop("name"), **bad)


def test_bad_table_text():
    with pytest.raises(PolicyError):
        parse_table("1-6")


def _feed(p: AdaptiveGoodput, batch, alpha, verify_of_n, draft_s=0.01, steps=30):
    for i in range(steps):
        k = p.plan(PlanContext(batch, 4)).depth
        n = batch * (k + 1)
        p.observe(StepObservation(batch, k, batch * k, round(batch * k * alpha), draft_s * k, k,
                                  verify_of_n(n), n))
    return p.plan(PlanContext(batch, 4)).depth


def test_adaptive_speculates_when_verify_is_flat_and_stops_when_it_is_linear():
    flat = lambda n: 0.1                       # memory-bound: any tokens per pass cost the same
    linear = lambda n: 0.1 * n                 # compute-bound: every token costs
    assert _feed(AdaptiveGoodput(max_depth=6), 1, 0.8, flat) >= 3
    assert _feed(AdaptiveGoodput(max_depth=6), 32, 0.3, linear) == 0


def test_adaptive_estimates_alpha_per_draft_the_target_came_to():
    """Each step a row keeps 2 of 4 drafts: the target judged 3 of them (the fourth follows a rejection),
    so α is 2/3. Kept ÷ drafted read 1/2, lower the deeper the policy went, and it shied from depth."""
    p = AdaptiveGoodput(max_depth=4)
    for _ in range(200):
        p.observe(StepObservation(1, 4, 4, 2, 0.0, 0, 0.1, 5, reached=3))
    assert abs(p.alpha - 2 / 3) < 0.01, p.alpha


# --- the registry ------------------------------------------------------------------------------------------

def test_the_registry_is_the_one_list_of_policies():
    assert POLICY_NAMES == tuple(POLICIES) and len(set(POLICY_NAMES)) == len(POLICY_NAMES)
    choice_fields = {f.name for f in dataclasses.fields(PolicyChoice)} - {"name"}
    for name, spec in POLICIES.items():
        assert spec.cls.name == name == spec.name
        for param in spec.params:                  # a parameter travels under one field name, end to end
            assert param.field in choice_fields
            assert param.field in {f.name for f in dataclasses.fields(spec.cls)}
            assert spec.default(param) is not None  # the class's own default passes its own check
        assert spec.label_key == f"policy_label.{name}" and spec.help_key == f"policies.{name}"


# The word "fixed" also names things that are not the fixed policy: a frontier arm code (the JSON contract's
# "arm": "none" | "fixed" | …) and a vLLM server's depth mode (one k, set when it starts).
OTHER_FIXED = ("frontier", "vllm_router.py", "playground.py")


def test_no_policy_name_is_spelled_outside_the_registry():
    """Every module that names a policy reads it from engine/policies.py (the radio, --policy, deep links,
    chapters, the door): a policy's name is written as a string once, in its class."""
    spelled = []
    for path in sorted(PKG.rglob("*.py")) + [ROOT / "app.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in POLICY_NAMES:
                where = path.relative_to(ROOT)
                if not (node.value == FixedPolicy.name and any(o in path.name for o in OTHER_FIXED)):
                    spelled.append((str(where), node.lineno, node.value))
    mine = [s for s in spelled if s[0] == "specviz/engine/policies.py"]
    assert sorted(v for *_, v in mine) == sorted(POLICY_NAMES), mine
    assert spelled == mine, [s for s in spelled if s not in mine]


def test_parse_checks_without_building(monkeypatch):
    def never(self, *a, **k):
        raise AssertionError("parse built a policy")
    for spec in POLICIES.values():
        monkeypatch.setattr(spec.cls, "__init__", never)
    table = {1: 4, 8: 0}
    choices = {name: PolicyChoice.parse(name, threshold=0.5 if name == "confidence" else 3, table=table,
                                        max_depth=5) for name in POLICY_NAMES}
    assert choices["disable-by-batch-size"].threshold == 3 and choices["confidence"].threshold == 0.5
    assert choices["batch-table"].table == ((1, 4), (8, 0)) and choices["adaptive"].max_depth == 5
    with pytest.raises(AssertionError, match="built"):          # the patch is live: build would have built
        choices["adaptive"].build()


def test_parse_keeps_what_the_policy_reads_with_its_defaults():
    assert PolicyChoice.parse(None, threshold=3) == PolicyChoice("fixed")          # the box is not read
    assert PolicyChoice.parse(" confidence ", threshold=None) == PolicyChoice("confidence", 0.5)
    assert PolicyChoice.parse("disable-by-batch-size", threshold=4.0).threshold == 4
    assert PolicyChoice.parse("batch-table").build().table == BatchTable().table
    assert PolicyChoice.parse("adaptive").max_depth == AdaptiveGoodput().max_depth
    assert PolicyChoice.parse("fixed", table={1: 2}, max_depth=3) == PolicyChoice("fixed")


@pytest.mark.parametrize("bad, sentence", [
    (dict(name="nope"), "unknown policy 'nope'; choose one of: " + ", ".join(POLICY_NAMES)),
    (dict(name="confidence", threshold="half"), "the policy threshold must be a number, not 'half'"),
    (dict(name="confidence", threshold=float("nan")), "the policy threshold must be a finite number"),
    (dict(name="disable-by-batch-size", threshold=2.5), "whole-number batch threshold ≥ 0, got 2.5"),
    (dict(name="batch-table", table={0: 2}), "batch table needs batch sizes ≥ 1 and depths 0..16"),
    (dict(name="batch-table", table={"a": 2}), "batch table needs batch sizes ≥ 1 and depths 0..16"),
    (dict(name="adaptive", max_depth=2.5), "adaptive max depth must be 0..16, got 2.5"),
    (dict(name="adaptive", max_depth="9"), "adaptive max depth must be 0..16, got '9'"),
])
def test_parse_refuses_with_one_sentence(bad, sentence):
    with pytest.raises(PolicyError) as info:
        PolicyChoice.parse(bad.pop("name"), **bad)
    assert sentence in str(info.value) and "\n" not in str(info.value)


def test_build_makes_a_fresh_policy_each_time():
    """Policies keep a request's state: two requests never share one."""
    choice = PolicyChoice.parse("adaptive", max_depth=6)
    a, b = choice.build(), choice.build()
    assert a is not b and a.verify_s is not b.verify_s
    a.observe(StepObservation(1, 2, 2, 2, 0.01, 2, 0.1, 3))
    assert b.verify_s == {} and b.max_depth == 6


# --- a live policy change goes through the door ---------------------------------------------------------

def test_a_live_policy_change_with_bad_parameters_is_refused_and_changes_nothing():
    knobs = Knobs(depth=3, batch_size=2)
    control = LocalControl(knobs)
    before = knobs.snapshot()
    for bad in (dict(policy="confidence", threshold=3), dict(policy="nope"),
                dict(policy="disable-by-batch-size", threshold=-1), dict(depth=2, policy="confidence", threshold=9)):
        with pytest.raises(PolicyError) as info:
            control.set(**bad)
        assert str(info.value).strip() and "\n" not in str(info.value)
        assert knobs.snapshot() is before                          # not even the depth moved
    control.set(depth=2, policy="confidence", threshold=0.2)
    after = knobs.snapshot()
    assert (after.depth, after.policy.name, after.policy.threshold) == (2, "confidence", 0.2)
    control.set(policy="confidence", threshold=0.2)                # the same choice again: a new object
    assert knobs.snapshot().policy is not after.policy


def test_a_live_policy_change_reaches_a_worker_only_when_checked():
    ctl = ControlFile.create(Knobs(depth=3, batch_size=1), FIXED)
    try:
        written = Path(ctl.path).read_text()
        with pytest.raises(PolicyError, match="between 0 and 1"):
            ctl.set(policy="confidence", threshold=7)
        assert Path(ctl.path).read_text() == written
        ctl.set(policy="confidence", threshold=0.25)
        worker = Knobs(depth=3, batch_size=1)
        ControlFile(ctl.path, policy=FIXED).apply(worker)
        assert (worker.snapshot().policy.name, worker.snapshot().policy.threshold) == ("confidence", 0.25)
    finally:
        ctl.close()


def test_the_page_sends_a_live_policy_change_to_the_door():
    """The playground hands the radio's name and the threshold box to the run's control as they came; a
    refusal is one sentence in the reader's language (raised: the knobs' events show an error from the
    queue) and the run keeps its policy; picking a policy fills the box with its own default."""
    import gradio as gr

    from specviz.ui import playground

    knobs = Knobs(depth=3, batch_size=1)
    live = SimpleNamespace(control=LocalControl(knobs), baseline=False)
    page = playground.Playground(SimpleNamespace(runs=SimpleNamespace(get=lambda s: live)))
    with pytest.raises(gr.Error) as refused:
        page.on_policy("confidence", 3, None)
    assert refused.value.message == "the confidence threshold is a probability between 0 and 1, not 3"
    assert knobs.snapshot().policy.name == "fixed"
    box = page.on_policy_pick("disable-by-batch-size", 0.3, None)
    assert box["value"] == 8 and knobs.snapshot().policy.threshold == 8


# --- the CLI runs with the values the door returned -------------------------------------------------------

def _counting(monkeypatch):
    calls = {"parse": 0, "build": 0}
    parse, build = PolicyChoice.parse.__func__, PolicyChoice.build

    def counted_parse(cls, *a, **k):
        calls["parse"] += 1
        return parse(cls, *a, **k)

    def counted_build(self):
        calls["build"] += 1
        return build(self)
    monkeypatch.setattr(PolicyChoice, "parse", classmethod(counted_parse))
    monkeypatch.setattr(PolicyChoice, "build", counted_build)
    return calls


def _door_says(monkeypatch, module, **override):
    """The door's answer, changed: a command that re-read its raw arguments would not see the change."""
    real = module.check_run
    monkeypatch.setattr(module, "check_run", lambda *a, **k: dataclasses.replace(real(*a, **k), **override))


def test_generate_parses_once_builds_once_and_runs_what_the_door_returned(monkeypatch, capsys, tiny_paths):
    from specviz.__main__ import main
    from specviz.cli import common

    _door_says(monkeypatch, common, max_new=2, depth=1)
    calls = _counting(monkeypatch)
    rc = main(["generate", "--target", tiny_paths["target"], "--draft", "ngram", "--raw", "--prompt", "the quick",
               "--max-new-tokens", "5", "--depth", "3", "--policy", "confidence", "--threshold", "0.1", "--json"])
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert rc == 0 and calls == {"parse": 1, "build": 1}
    assert len(lines[-1]["outputs"][0]) == 2 and {s["depth"] for s in lines[:-1]} <= {0, 1}
    assert {s["policy"] for s in lines[:-1]} == {"confidence"}


def test_bench_classroom_builds_one_policy_per_request_from_the_door(monkeypatch, capsys, tiny_paths):
    from specviz.__main__ import main
    from specviz.cli import classroom

    _door_says(monkeypatch, classroom, max_new=4)
    calls = _counting(monkeypatch)
    rc = main(["bench-classroom", "--target", tiny_paths["target"], "--draft", tiny_paths["draft"], "--users", "3",
               "--depth", "2", "--max-new-tokens", "8", "--separate-concurrency", "2",
               "--policy", "disable-by-batch-size"])
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and final["identical"] is True
    assert final["shared"]["tokens"] == final["separate"]["tokens"] == 3 * 4 and final["max_new_tokens"] == 4
    # one check; one policy per request: the warm-up's 2 users, then 3 per mode
    assert calls == {"parse": 1, "build": 2 + 3 + 3}


@pytest.mark.parametrize("extra, sentence", [
    (["--users", "0"], "the number of users (--users) must be from 1 to 64; 0 is out of range"),
    (["--users", "65"], "the number of users (--users) must be from 1 to 64; 65 is out of range"),
    (["--repeats", "21"], "the number of rounds (--repeats) must be from 1 to 20; 21 is out of range"),
    (["--separate-concurrency", "0"], "(--separate-concurrency) must be from 1 to 64; 0 is out of range"),
    (["--policy", "confidence", "--threshold", "2"], "the confidence threshold is a probability between 0 and 1"),
    (["--url", "http://example.com:7860/"], "--url must point at this machine (127.0.0.1 or localhost)"),
])
def test_bench_classroom_refuses_at_the_door_with_lesson_sentences(capsys, extra, sentence):
    from specviz.__main__ import main

    rc = main(["bench-classroom", "--target", "no/such-model"] + extra)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("specviz: error: ") and sentence in err and "\n" not in err


def test_class_sizes_speak_persian():
    from specviz.cli.classroom import MAX_REPEATS
    from specviz.serve.door import check_count

    with pytest.raises(LimitError) as info:
        check_count(0, "errors.what_repeats", MAX_REPEATS)
    assert str(info.value).startswith("the number of rounds (--repeats)")
    assert lessons.say("fa", info.value).startswith("تعداد دورها")
