"""scripts/gpu-check: its dry run on tiny models on this CPU (every step, the JSON's structure), and how it
reports a step that fails, hangs or has no time left while the others go on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check"
STEPS = ["calibrate", "prepare", "roofline-1.7b-graph", "roofline-1.7b-eager", "bench-hf", "sweep", "frontier",
         "scheduler-8", "roofline-27b-graph", "divergence", "divergence-fp32", "roofline-27b-eager",
         "roofline-1.7b-graph-other", "pass-kernels", "nvml", "counters"]
ROOFLINE_KEYS = {"target", "mbu_at_1_token", "measured_knee", "tokens_per_pass", "latency_s"}


@pytest.fixture(scope="module")
def gc():
    return SourceFileLoader("gpu_check", str(SCRIPT)).load_module()


# the app's packages the lent GPU machine lacks (psutil too, but transformers imports whatever it finds of it)
BARE_BOX = ("plotly", "gradio", "gradio_client", "platformdirs")


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """One dry run for the module (several minutes on a busy 2-core machine: it starts a dozen processes),
    as on the bare GPU box: torch and transformers, and none of the app's other packages."""
    out, bare = tmp_path_factory.mktemp("gpu-check"), tmp_path_factory.mktemp("bare-box")
    for name in BARE_BOX:                  # a package of that name first on the path, failing as a missing one
        (bare / name).mkdir()
        (bare / name / "__init__.py").write_text(
            f'raise ModuleNotFoundError("No module named {name!r} (the bare GPU box)", name={name!r})\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bare), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True,
                       text=True, timeout=2400, cwd=ROOT, env=env)
    return r, json.loads((out / "gpu-check.json").read_text()), out


def test_dry_run_passes_every_step_and_writes_the_json(dry):
    r, report, out = dry
    failed = {s["name"]: (s["status"], s.get("error"), s.get("log_tail")) for s in report["steps"]
              if s["status"] != "passed"}
    assert r.returncode == 0 and not failed, (failed, r.stderr[-2000:])
    assert [s["name"] for s in report["steps"]] == STEPS
    assert report["dry_run"] is True and report["goals"] is None and report["format"] == "specviz gpu-check 1"
    assert report["device"]["kind"] == "cpu" and report["device"]["torch"] and report["device"]["name"]
    for s in report["steps"]:
        assert {"name", "status", "path", "seconds", "result"} <= set(s) and s["seconds"] >= 0, s["name"]
        assert isinstance(s["result"], dict), s["name"]
    by = {s["name"]: s for s in report["steps"]}
    assert by["roofline-1.7b-graph"]["path"] == "graph" and by["roofline-1.7b-eager"]["path"] == "eager"
    assert by["roofline-1.7b-graph"]["compile"] == "static" and by["roofline-1.7b-eager"]["compile"] == "off"
    # a dry run's fast path has no graphs, so no forward was kept: the other step runs the compiled one
    assert by["roofline-1.7b-graph-other"]["command"].startswith("SPECVIZ_GRAPH_FORWARD=compiled ")
    for name in ("roofline-1.7b-graph", "roofline-1.7b-eager", "roofline-27b-graph", "roofline-27b-eager",
                 "roofline-1.7b-graph-other"):
        res = by[name]["result"]
        assert ROOFLINE_KEYS <= set(res) and len(res["tokens_per_pass"]) == len(res["latency_s"]) >= 4, name
        assert res["mbu_at_1_token"] > 0 and res["measured_knee"] > 0
    rows = by["sweep"]["result"]["rows"]
    assert {(x["batch_size"], x["depth"]) for x in rows} == {(1, 0), (1, 2), (4, 0), (4, 2)}
    assert by["bench-hf"]["result"]["lossless"] is True
    assert by["frontier"]["result"]["identical"] is True and by["frontier"]["result"]["rows"]
    sched = by["scheduler-8"]["result"]
    assert sched["done"] == sched["users"] == 8 and not sched["errors"] and sched["lossless"] is True
    for name in ("divergence", "divergence-fp32"):
        assert by[name]["result"]["lossless"]["lossless"] is True and by[name]["result"]["lossless"]["rows"] == 4
    kernels = by["pass-kernels"]["result"]["rows"]
    assert [x["tokens"] for x in kernels] == [1, 16] and all(x["graphed"] and x["kernels"] > 0 for x in kernels)
    assert by["nvml"]["result"]["samples"] > 0 and by["counters"]["result"]["recompile_warnings"] == 0
    assert all("nvml" in s for s in report["steps"] if s["name"] not in ("nvml", "counters"))
    # the short table, and each step's log beside the JSON
    assert "roofline-1.7b-graph" in r.stdout and "wrote " in r.stdout
    assert (out / "steps" / "sweep" / "log.txt").exists() and (out / "steps" / "sweep" / "sweep.json").exists()
    assert not list(out.rglob("*.html"))                 # the commands' charts stay out of DIR: it travels back
    # without plotly the measuring commands write their JSON and say which page they left out
    assert "plotly is not installed: roofline.html not written" in (out / "steps" / "roofline-1.7b-graph" /
                                                                     "log.txt").read_text()


def test_dry_run_draft_falls_back_with_a_note_while_the_synthetic_draft_is_unknown(dry, gc):
    r, report, _ = dry
    draft, note = gc.pick_draft(gc.DRAFT)
    assert report["draft"] == draft
    if note:
        assert note in report["notes"] and note in r.stderr and draft == gc.FALLBACK_DRAFT


def test_a_failing_hanging_or_late_step_is_reported_and_the_others_go_on(gc, tmp_path, monkeypatch):
    plan = gc.Plan(tmp_path, tmp_path, True, "ngram", gc.DRY, {"PATH": "/usr/bin:/bin"}, gc.DRY_PATHS)

    class NoSamples:
        def window(self, t0, t1):
            return {"source": "none", "samples": 0}

    py = sys.executable
    says_bug = gc.run_one("a", "graph", 60, [py, "-c", "print('{\"lossless\": false}')"], plan, NoSamples())
    assert says_bug["status"] == "failed" and says_bug["error"] == "lossless is false"
    crash = gc.run_one("b", None, 60, [py, "-c", "import sys; sys.exit('boom')"], plan, NoSamples())
    assert crash["status"] == "failed" and crash["error"] == "boom" and crash["returncode"] == 1
    monkeypatch.setattr(gc, "MIN_STEP_S", 0)
    hang = gc.run_one("c", None, 1, [py, "-c", "import time; time.sleep(600)"], plan, NoSamples())
    assert hang["status"] == "timed out"
    monkeypatch.setattr(gc, "MIN_STEP_S", 15)
    late = gc.run_one("d", None, 3, [py, "-c", "print(1)"], plan, NoSamples())
    assert late["status"] == "skipped" and "deadline" in late["error"]
    blind = gc.run_one("f", "graph", 60, [py, "-c", "print(1)"], plan, NoSamples(), None, gc.NO_BASIS)
    assert blind["status"] == "skipped" and blind["error"] == "skipped: " + gc.NO_BASIS
    fine = gc.run_one("e", "eager", 60, [py, "-c", "print('x'); print('{\"identical\": true, \"graphs\": 3}')"],
                      plan, NoSamples())
    assert fine["status"] == "passed" and fine["result"] == {"identical": True, "graphs": 3}
    assert fine["counters"] == {"graphs": 3} and fine["compile"] == "off"


def test_output_that_is_not_utf8_or_a_stack_dump_does_not_break_or_fail_a_step(gc, tmp_path):
    """A kill can cut a multibyte character (UnicodeDecodeError ended the run), and a hung step's stack dump
    names Dynamo's recompile code: neither is a recompile, nor the end of the run."""
    plan = gc.Plan(tmp_path, tmp_path, True, "ngram", gc.DRY, {"PATH": "/usr/bin:/bin"}, gc.DRY_PATHS)

    class NoSamples:
        def window(self, t0, t1):
            return {"source": "none", "samples": 0}

    code = ("import sys; sys.stdout.buffer.write(b'\\xff\\xfe\\n{\"identical\": true}\\n'); "
            "sys.stderr.write('  File \"torch/_dynamo/guards.py\", line 9, in recompile_reasons\\n'"
            "'  File \"torch/_dynamo/cache_size.py\", line 178 in exceeds_recompile_limit\\n')")
    step = gc.run_one("u", None, 60, [sys.executable, "-c", code], plan, NoSamples())
    assert step["status"] == "passed" and step["result"] == {"identical": True}, step
    assert step["recompile_warnings"] == 0
    said = ("V1204 torch/_dynamo/guards.py:2 [__recompiles] Recompiling function hidden in llama.py:88\n"
            "W1204 torch._dynamo hit config.recompile_limit (16)\n")
    assert len(gc.RECOMPILE_LINE.findall(said)) == 2


def test_a_device_that_does_not_answer_is_reported_in_the_json(gc, tmp_path, monkeypatch):
    plan = gc.Plan(tmp_path, tmp_path, True, "ngram", gc.DRY, {"PATH": "/usr/bin:/bin"}, gc.DRY_PATHS)
    monkeypatch.setattr(gc, "DEVICE_WAIT_S", 1)
    monkeypatch.setattr(gc, "internal", lambda *a: [sys.executable, "-c", "import time; time.sleep(30)"])
    assert gc.device_info(plan)["error"] == "reading the device failed: no answer within 1 s"


def test_goals_read_the_issue_targets_from_the_steps(gc):
    curve = [1e-3 * x for x in (1, 1, 1.05, 1.1, 1.1, 1.15, 1.2, 1.6, 2.2, 3.0, 4.0)]
    steps = [{"name": "roofline-1.7b-graph", "result": {"mbu_at_1_token": 0.7, "measured_knee": 180,
                                                        "tokens_per_pass": [2 ** i for i in range(11)],
                                                        "latency_s": curve}},
             {"name": "sweep", "recompile_warnings": 2, "result": {"rows": [
                 {"batch_size": 1, "depth": 0, "decode_tokens_per_s": 650.0},
                 {"batch_size": 16, "depth": 0, "decode_tokens_per_s": 8000.0}]}}]
    got = {g["goal"]: g["met"] for g in gc.goals(steps, 250)}
    assert got["the whole run within 300 s"] and got["roofline-1.7b-graph: mbu_at_1_token >= 0.67"]
    assert got["roofline-27b-graph: mbu_at_1_token >= 0.8"] is None                  # not measured: unknown
    assert got["1.7B graph: 1024 tokens >= 2.5x one token"] and got["1.7B graph: measured_knee 100-400"]
    assert got["sweep: batch 1, k = 0 decode >= 600 tok/s"] and got["sweep: per-row decode at batch 16 >= 0.7x batch 1"]
    assert got["sweep: no compilation or capture after warm-up"] is False            # Dynamo said it recompiled
    assert not any(g["goal"].startswith("graph path: auto's forward") for g in gc.goals(steps, 250))
    other = {"name": "roofline-1.7b-graph-other", "result": {"latency_s": [0.8e-3], "graphs": {"forward": "eager"}}}
    steps[0]["result"]["graphs"] = {"forward": "compiled"}
    assert gc.step_env("roofline-1.7b-graph-other", "graph", steps, False) == ({"SPECVIZ_GRAPH_FORWARD": "eager"}, None)
    # later graph steps run the forward auto kept, instead of each timing both again (and compiling one)
    assert gc.step_env("sweep", "graph", steps, False) == ({"SPECVIZ_GRAPH_FORWARD": "compiled"}, None)
    assert gc.step_env("roofline-27b-graph", "graph", steps, False) == ({"SPECVIZ_GRAPH_FORWARD": "compiled"}, None)
    assert gc.step_env("roofline-1.7b-eager", "eager", steps, False) == ({}, None)
    # bench-hf decodes one row: its warm-up captures the one-row shapes only (the grid's others stay default)
    assert gc.step_env("bench-hf", "graph", steps, False) == ({"SPECVIZ_GRAPH_FORWARD": "compiled",
                                                               "SPECVIZ_GRAPH_BUCKETS": "rows=1"}, None)
    assert gc.step_env("bench-hf", "graph", steps[1:], False) == ({"SPECVIZ_GRAPH_BUCKETS": "rows=1"}, None)
    assert gc.step_env("bench-hf", "graph", steps, True) == ({"SPECVIZ_GRAPH_FORWARD": "compiled"}, None)
    from specviz.fastpath.buckets import ROWS, TOKENS, parse
    one = parse(gc.ONE_ROW)
    assert one.rows == (1,) and one.tokens == TOKENS and len(one.shapes()) < len(parse("").shapes()) and ROWS[0] == 1
    assert gc.step_env("sweep", "graph", steps[1:], False) == ({}, None)                  # auto decides itself
    assert gc.step_env("roofline-1.7b-graph-other", "graph", steps[1:], False) == ({}, gc.NO_BASIS)   # skipped
    fwd = next(g for g in gc.goals(steps + [other], 250) if g["goal"].startswith("graph path: auto's forward"))
    assert fwd["goal"].startswith("graph path: auto's forward (compiled)")
    assert fwd["met"] is False and fwd["value"] == {"compiled": 1.0, "eager": 0.8}     # the other measured faster
    other["result"]["latency_s"] = [0.97e-3]                                          # within 5 %: level
    assert next(g for g in gc.goals(steps + [other], 250) if "auto's forward" in g["goal"])["met"] is True
    text = gc.table({"steps": [dict(steps[0], status="passed", path="graph", seconds=1.0)], "goals": gc.goals(steps, 400)})
    assert "MBU 0.70" in text and any("NOT met" in line and "within 300 s" in line for line in text.splitlines())


def test_a_chart_is_left_out_only_for_a_missing_plotly(tmp_path, capsys):
    from specviz.cli.common import write_chart

    def missing(name):
        def make():
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return make
    write_chart(tmp_path / "sweep.html", missing("plotly.graph_objects"))
    assert not (tmp_path / "sweep.html").exists()
    assert capsys.readouterr().err.strip() == ("plotly is not installed: sweep.html not written (the JSON beside "
                                               "it has every figure)")
    with pytest.raises(ModuleNotFoundError):               # anything else missing is a fault, not a bare box
        write_chart(tmp_path / "sweep.html", missing("numpy"))


def test_a_step_fails_on_wrong_tokens_by_the_near_tie_rule_not_on_near_ties(gc):
    """bench-hf and frontier report `identical` (token for token) and `lossless` (the near-tie rule);
    generate --check nests its report under `lossless`: only a bug fails the step."""
    assert gc.wrong_outputs({"identical": False, "lossless": True}) == []          # near-ties, reported
    assert gc.wrong_outputs({"identical": False, "lossless": False}) == ["lossless"]
    assert gc.wrong_outputs({"lossless": {"lossless": False, "verdict": "bug"}}) == ["lossless"]
    assert gc.wrong_outputs({"lossless": {"lossless": True, "verdict": "near-ties"}}) == []
    assert gc.wrong_outputs({"identical": False}) == ["identical"]                  # no judgement: exact or not
    assert gc.wrong_outputs({"rows": []}) == [] and gc.wrong_outputs(None) == []


def test_the_sweep_goal_reads_the_graph_counters_after_warm_up(gc):
    clean = {"graphs": {"graphs": 40, "captures_after_warmup": 0, "compiles_after_warmup": 0}}
    assert gc.after_warmup_clean({"counters": clean, "recompile_warnings": 0}) is True
    assert gc.after_warmup_clean({"counters": clean, "recompile_warnings": 2}) is False
    late = {"graphs": {"graphs": 40, "captures_after_warmup": 1, "compiles_after_warmup": 0}}
    assert gc.after_warmup_clean({"counters": late}) is False
    assert gc.after_warmup_clean({"counters": None}) is None and gc.after_warmup_clean({}) is None
    assert gc.after_warmup_clean({"counters": {"graphs": {"graphs": 40}}}) is None       # not counted: unknown
    goal = next(g for g in gc.goals([{"name": "sweep", "result": {"rows": []}, "counters": clean,
                                      "recompile_warnings": 0}], 100.0)
                if g["goal"].startswith("sweep: no compilation"))
    assert goal["met"] is True


def test_a_hung_step_leaves_no_core_file():
    """A step past its limit gets SIGABRT, which dumps core by default: gpu-check gives its steps a core
    limit of 0 (a CUDA process's core would fill the device's disk). Here with core files allowed first."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    if hard == 0:
        pytest.skip("this machine allows no core files at all")
    resource.setrlimit(resource.RLIMIT_CORE, (2**20 if hard == resource.RLIM_INFINITY else min(hard, 2**20), hard))
    try:
        SourceFileLoader("gpu_check_core", str(SCRIPT)).load_module().no_core_files()
        child = subprocess.run([sys.executable, "-c", "import resource as r; print(r.getrlimit(r.RLIMIT_CORE)[0])"],
                               capture_output=True, text=True, timeout=60)
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
    assert child.stdout.strip() == "0"
    assert "no_core_files()" in SCRIPT.read_text().split("def main(", 1)[1]      # the run sets it, before its steps
