"""`frontier --engine vllm` without vLLM: its refusals, the default schedule, one cell's figures from a run
and two /metrics reads, and the whole orchestration with the servers, the client and `run_all` faked
(the real servers are the real-server tier's business)."""
from __future__ import annotations

import json

import pytest

from specviz.chapters.frontier_cells import arm_name
from specviz.cli import frontier_vllm
from specviz.cli.frontier_vllm import cell_from_run, check_schedule, default_schedule, vllm_arms
from specviz.engine.request import RunTotals
from specviz.limits import LimitError
from specviz.vllm import launcher
from specviz.vllm.client import ServedModel
from specviz.vllm.run import RunResult


def _frontier(tiny_paths, *extra):
    from specviz.__main__ import main

    return main(["frontier", "--engine", "vllm", "--target", tiny_paths["target"], "--draft", "ngram",
                 "--prompts", "grounded", "--max-new-tokens", "6", *extra])


def test_default_schedule_drafts_deep_for_small_classes_and_shallow_for_large():
    assert default_schedule([1, 4, 16], [0, 2, 4]) == ((1, 1, 4), (2, 16, 2))
    assert default_schedule([1, 4, 16, 64], [0, 2, 4, 8]) == ((1, 1, 8), (2, 16, 4), (17, 64, 2))
    assert default_schedule([4], [2, 8]) == ((1, 4, 8),)
    assert check_schedule(None, [1, 4], [0, 2]) == ((1, 4, 2),)
    assert check_schedule("5-16:2,1-4:4", [1], [2]) == ((1, 4, 4), (5, 16, 2))     # sorted as vLLM sorts
    assert check_schedule("none", [1], [2]) == ()
    arms = vllm_arms([0, 4, 2], ((1, 4, 4), (5, 16, 2)))
    assert arms == [("none", 0, ()), ("fixed", 2, ()), ("fixed", 4, ()), ("schedule", 4, ((1, 4, 4), (5, 16, 2)))]


@pytest.mark.parametrize("text, words", [
    ("1-4", "--schedule takes LO-HI:K entries"),
    ("2-8:4", "must start at batch size 1"),
    ("1-8:4,4-16:2", "must not overlap"),
    ("1-8:0", "needs a depth above 0"),
])
def test_a_bad_schedule_is_one_sentence(text, words):
    with pytest.raises(LimitError, match=words):
        check_schedule(text, [1, 4], [0, 2])


def test_refusals_exit_2_with_one_sentence_before_any_server(tiny_paths, capsys, monkeypatch):
    monkeypatch.setattr(launcher, "VllmServer", lambda spec: pytest.fail("no server may start"))
    monkeypatch.setattr(launcher, "vllm_installed", lambda venv=launcher.VENV: False)
    assert _frontier(tiny_paths, "--users", "1,4", "--depths", "0,2") == 2
    err = capsys.readouterr().err
    assert "vLLM is not installed" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(launcher, "vllm_installed", lambda venv=launcher.VENV: True)
    assert _frontier(tiny_paths, "--users", "1,4", "--depths", "0,2", "--schedule", "3-9:2") == 2
    assert "--schedule must start at batch size 1" in capsys.readouterr().err
    assert _frontier(tiny_paths, "--users", "1", "--depths", "0,2", "--draft", "layerskip:1-2") == 2
    assert "vLLM has no layer-skipping draft" in capsys.readouterr().err
    assert _frontier(tiny_paths, "--users", "0,4", "--depths", "0,2") == 2             # frontier's own checks
    assert "argument --users: must be whole numbers from 1 to 64" in capsys.readouterr().err


def _metrics(gen, steps, drafted=None, accepted=None) -> str:
    lab = '{engine="0",model_name="m"}'
    lines = [f"vllm:generation_tokens_total{lab} {gen}", f"vllm:iteration_tokens_total_count{lab} {steps}",
             f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="m"}} {steps}']
    if drafted is not None:
        lines += [f"vllm:spec_decode_num_draft_tokens_total{lab} {drafted}",
                  f"vllm:spec_decode_num_accepted_tokens_total{lab} {accepted}",
                  f"vllm:spec_decode_num_drafts_total{lab} {steps}"]
    return "\n".join(lines) + "\n"


def _result(outputs: dict, wall: float, latencies: dict, error=None) -> RunResult:
    return RunResult(outputs, {i: [1] for i in outputs}, RunTotals(), error, False, {i: None for i in outputs},
                     {i: None for i in outputs}, wall, latencies)


def test_one_cell_reads_speed_from_the_run_and_acceptance_from_the_metrics_window():
    outs = {0: [5] * 12, 1: [6] * 12}                         # 24 tokens in 2 s; users done at 1 s and 3 s
    r = _result(outs, 2.0, {0: 1.0, 1: 3.0})
    c = cell_from_run("fixed", 4, 2, r, _metrics(100, 50, 400, 150), _metrics(124, 56, 448, 162))
    assert c["tokens"] == 24 and c["tokens_per_s"] == 12.0
    assert c["per_user_tokens_per_s"] == pytest.approx((12 / 1 + 12 / 3) / 2)       # median of 12 and 4
    assert c["acceptance_rate"] == pytest.approx(12 / 48)
    assert c["accepted_length"] == pytest.approx(24 / (24 - 12))                   # a step = accepted + 1
    assert c["drafted_per_step"] == c["verified_per_step"] == pytest.approx(48 / 6)
    assert c["steps"] == 6 and c["engine"] == "vllm" and c["outputs"] == [[5] * 12, [6] * 12]
    plain = cell_from_run("none", 0, 2, r, _metrics(0, 0), _metrics(24, 12))       # no spec counters at all
    assert plain["acceptance_rate"] is None and plain["accepted_length"] == 1.0
    assert plain["drafted_per_step"] == 0.0
    bare = cell_from_run("fixed", 2, 2, r, "", "")                                  # a server without metrics
    assert bare["acceptance_rate"] is None and bare["accepted_length"] is None and bare["drafted_per_step"] is None
    with pytest.raises(LimitError, match="the row broke"):
        cell_from_run("none", 0, 2, _result(outs, 2.0, {0: 1.0, 1: 3.0}, error="the row broke"), "", "")


class _Fake:
    """One fake vLLM per launched spec: run_all adds to its counters as a server would (each step every
    row accepts one draft when it speculates), walls alternate 1.0 s / 1.25 s between timed runs."""

    def __init__(self, differ_in: str | None = None):
        self.asked, self.current, self.differ_in = [], None, differ_in

    def server(self, spec):
        fake = self

        class Server:
            url = "http://127.0.0.1:9"

            def start(self, progress=None):
                fake.asked.append((spec.depth, spec.schedule))
                fake.current = {"spec": spec, "gen": 0, "steps": 0, "drafted": 0, "accepted": 0, "timed": 0}
                return self

            def stop(self):
                fake.current = None
        return Server()

    def client(self, url, timeout_s=0):
        fake = self

        class Client:
            def model(self, name=None):
                return ServedModel("m", 4096, "m")

            def metrics_text(self):
                s = fake.current
                spec = s["spec"].depth > 0
                return _metrics(s["gen"], s["steps"], s["drafted"] if spec else None, s["accepted"] if spec else None)
        return Client()

    def run_all(self, client, model, prompts, max_new, ignore_eos=True, stop=None):
        s, n = self.current, len(prompts)
        k = s["spec"].depth
        outs = {i: [p[-1] + j for j in range(max_new)] for i, p in enumerate(prompts)}
        if self.differ_in == ("schedule" if s["spec"].schedule else "fixed" if k else "none"):
            outs[n - 1][-1] += 1
        steps = max_new // 2 if k else max_new
        s["gen"] += n * max_new
        s["steps"] += steps
        s["drafted"] += k * n * steps if k else 0
        s["accepted"] += n * max_new // 2 if k else 0
        wall = 1.0
        if max_new != frontier_vllm.WARMUP_TOKENS:
            wall = (1.0, 1.25)[s["timed"] % 2]
            s["timed"] += 1
        return _result(outs, wall, {i: wall * (i + 1) / n for i in range(n)})


@pytest.fixture
def fake(monkeypatch):
    from specviz.vllm import run as vllm_run

    def make(differ_in=None):
        f = _Fake(differ_in)
        monkeypatch.setattr(launcher, "vllm_installed", lambda venv=launcher.VENV: True)
        monkeypatch.setattr(launcher, "VllmServer", f.server)
        monkeypatch.setattr(frontier_vllm, "VllmClient", f.client)
        monkeypatch.setattr(vllm_run, "run_all", f.run_all)
        monkeypatch.setattr(frontier_vllm, "vllm_version", lambda python: "0.32.0")
        monkeypatch.setattr(frontier_vllm, "SETTLE_S", 0.0)
        return f
    return make


def test_frontier_on_vllm_runs_one_server_per_arm_and_reports_our_row_schema(tiny_paths, tmp_path, capsys, fake):
    f = fake()
    out = tmp_path / "fv"
    assert _frontier(tiny_paths, "--users", "1,3", "--depths", "0,2", "--repeats", "2", "--out", str(out),
                     "--json") == 0
    assert f.asked == [(0, ()), (2, ()), (2, ((1, 3, 2),))]                   # one at a time, the schedule last
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["engine"] == "vllm" and res["vllm_version"] == "0.32.0" and res["identical"] is True
    assert res["workload"]["schedule"] == "1-3:2" and res["device"] and set(res["server_start_s"]) == {
        "none", "fixed:2", "schedule:2"}
    assert res["command"] == ("python -m specviz frontier --engine vllm --target " + tiny_paths["target"]
                              + " --draft ngram --prompts grounded --users 1,3 --depths 0,2 --schedule 1-3:2"
                              " --max-new-tokens 6 --repeats 2")
    rows = {(r["arm"], r["depth"], r["users"]): r for r in res["rows"]}
    assert list(rows) == [("none", 0, 1), ("none", 0, 3), ("fixed", 2, 1), ("fixed", 2, 3),
                          ("schedule", 2, 1), ("schedule", 2, 3)]
    three = rows[("fixed", 2, 3)]
    mid = (18 / 1.0 + 18 / 1.25) / 2                                          # 3 users × 6 tokens, two runs
    assert three["tokens_per_s"] == pytest.approx(mid)
    assert three["noise"] == pytest.approx((18 / 1.0 - 18 / 1.25) / mid) and three["repeats"] == 2
    assert three["per_user_tokens_per_s"] == pytest.approx((6 / (2 / 3) + 6 / (2 * 1.25 / 3)) / 2)
    assert three["acceptance_rate"] == pytest.approx(0.5) and three["accepted_length"] == pytest.approx(2.0)
    assert three["drafted_per_step"] == pytest.approx(6.0) == three["verified_per_step"]   # k × users
    assert rows[("none", 0, 3)]["acceptance_rate"] is None and rows[("none", 0, 3)]["accepted_length"] == 1.0
    assert all(set(r) >= {"arm", "depth", "users", "tokens_per_s", "per_user_tokens_per_s", "acceptance_rate",
                          "accepted_length", "drafted_per_step", "verified_per_step", "noise", "repeats"}
               and r["engine"] == "vllm" and "outputs" not in r for r in res["rows"])
    assert {p.name for p in out.iterdir()} == {"frontier.csv", "frontier.json", "frontier.html", "recorded.json"}
    rec = json.loads((out / "recorded.json").read_text())
    assert rec["command"] == res["command"] and rec["engine_version"] == "0.32.0" and rec["rows"] == res["rows"]
    assert rec["device"].startswith("cpu: ") and rec["recorded_at"] and rec["workload"]["users"] == [1, 3]
    assert "vLLM schedule" in (out / "frontier.html").read_text()             # the schedule arm has its name


def test_outputs_that_differ_between_vllm_arms_are_reported(tiny_paths, capsys, fake):
    fake("schedule")
    assert _frontier(tiny_paths, "--users", "2", "--depths", "0,2", "--json") == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["identical"] is False


def test_the_schedule_arm_has_a_name_in_both_languages():
    assert arm_name("en", "schedule:4") == "vLLM schedule"
    assert arm_name("fa", "schedule:4") == "schedule در vLLM"
