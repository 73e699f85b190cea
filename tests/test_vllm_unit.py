"""Pure parts of the vLLM backend (no vLLM needed): Prometheus parsing, stream chunks, step events,
alignment with vLLM's per-step arrays, launcher argv, error sentences, labels."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specviz.chapters import BY_KEY, sweep
from specviz.engine.policies import FIXED
from specviz.vllm import metrics, steps
from specviz.vllm.client import VllmClient, VllmError, normalise_url, parse_chunk, refusal
from specviz.vllm.launcher import LaunchSpec, server_argv, speculative_config

# a trimmed capture of a vLLM 0.32 CPU server's /metrics (n-gram, k = 4) after a few requests
SAMPLE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smol"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="smol"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="smol"} 0.125
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="smol"} 640.0
vllm:prompt_tokens_total{engine="0",model_name="smol"} 300.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="smol"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="smol"} 400.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="smol"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="0"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="1"} 45.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="2"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="3"} 15.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="smol"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="smol"} 12.0
not a metric line at all
python_gc_objects_collected_total{generation="0"} 1234.0
"""


def test_prometheus_parse_and_snapshot():
    s = metrics.parse_prometheus(SAMPLE)
    assert s["vllm:num_requests_running"] == [({"engine": "0", "model_name": "smol"}, 3.0)]
    assert s["vllm:time_to_first_token_seconds_bucket"][0][0]["le"] == "+Inf"
    snap = metrics.snapshot(SAMPLE, t=10.0)
    assert (snap.running, snap.waiting, snap.kv_usage) == (3.0, 1.0, 0.125)
    assert snap.acceptance_rate == pytest.approx(150 / 400)
    assert snap.accepted_per_pos == {0: 70.0, 1: 45.0, 2: 20.0, 3: 15.0}
    assert metrics.snapshot(SAMPLE, model="other").running is None      # another model's numbers are not ours


def test_metrics_window_is_a_difference_of_counters():
    old = metrics.snapshot(SAMPLE, t=10.0)
    later = (SAMPLE.replace("640.0", "740.0").replace("} 400.0", "} 440.0").replace("} 150.0", "} 170.0")
             .replace("drafts_total{engine=\"0\",model_name=\"smol\"} 100.0", "drafts_total{engine=\"0\",model_name=\"smol\"} 110.0")
             .replace('position="0"} 70.0', 'position="0"} 78.0'))
    w = metrics.window(old, metrics.snapshot(later, t=12.0))
    assert w.tokens_per_s == pytest.approx(50.0)
    assert w.acceptance_rate == pytest.approx(20 / 40)
    assert w.mean_drafted == pytest.approx(4.0)
    assert w.accepted_per_pos[0] == pytest.approx(0.8)


def test_stream_chunks_parse_and_errors():
    ch = parse_chunk({"choices": [{"index": 0, "text": " hi", "token_ids": [5, 6], "finish_reason": None,
                                   "prompt_token_ids": [1, 2]}]})
    assert ch.token_ids == [5, 6] and ch.prompt_ids == [1, 2] and ch.finish is None
    final = parse_chunk({"choices": [], "usage": {"completion_tokens": 8},
                         "metrics": {"speculative_decoding": {"num_draft_tokens": 8, "per_step_accepted": [1]}}})
    assert final.token_ids == [] and final.spec["num_draft_tokens"] == 8
    assert parse_chunk({"choices": []}) is None
    with pytest.raises(VllmError, match="failed during generation: boom"):
        parse_chunk({"error": {"message": "boom\nstack"}})


def test_refusals_are_one_sentence():
    assert "max-model-len" in refusal(400, "This model's maximum context length is 4096 tokens. However…", "u")
    assert "does not serve that model" in refusal(404, "The model `x` does not exist.", "u")
    assert "HTTP 500" in refusal(500, "oops\ntrace", "u") and "\n" not in refusal(500, "oops\ntrace", "u")
    for bad in ("", "ftp://x", "localhost:8000", "http://"):
        with pytest.raises(VllmError, match="must look like"):
            normalise_url(bad)
    assert normalise_url("http://127.0.0.1:8100/v1/") == "http://127.0.0.1:8100"


def test_unreachable_server_is_a_sentence():
    c = VllmClient("http://127.0.0.1:9", timeout_s=2)        # discard port: nothing listens
    assert not c.healthy()
    with pytest.raises(VllmError, match="not reachable"):
        c.models()
    with pytest.raises(VllmError, match="not reachable"):
        list(c.stream("m", [1, 2], 4))


def test_live_step_and_closing_step():
    rs = steps.live_step(2, [7, 8, 9])
    assert (rs.row, rs.drafted, rs.accepted, rs.emitted, rs.last_kind) == (2, [7, 8], 2, [7, 8, 9], "bonus")
    one = steps.live_step(0, [4])
    assert (one.drafted, one.accepted, one.last_kind) == ([], 0, "plain")
    spec = {"num_draft_tokens": 12, "num_accepted_draft_tokens": 5}
    close = steps.closing_step(0, spec, "length")
    assert close.drafted == [steps.REJECTED] * 7 and close.accepted == 0 and close.emitted == []
    assert steps.closing_step(0, {"num_draft_tokens": 5, "num_accepted_draft_tokens": 5}, "length") is None


def test_align_explains_chunks_with_per_step_arrays():
    # prefill token, then a step that kept 2 of 4, a step without drafts, a step that kept 0 of 4, one kept 4 of 4
    chunks = [[1], [2, 3, 4], [5], [6], [7, 8, 9, 10, 11]]
    spec = {"per_step_accepted": [2, 0, 4], "per_step_drafted": [4, 4, 4]}
    got = steps.align(chunks, spec)
    assert [s.tokens for s in got] == [1, 3, 1, 1, 5]
    assert sum(s.drafted for s in got) == 12 and sum(s.accepted for s in got) == 6
    assert got[0].drafted == 0                      # the prefill token never carries drafts
    # two steps merged into one chunk still fit; the token limit may cut the last step
    assert steps.align([[1], [2, 3, 4, 5]], {"per_step_accepted": [1, 0], "per_step_drafted": [3, 3]}) is not None
    assert [s.tokens for s in steps.align([[1], [2, 3]], {"per_step_accepted": [3], "per_step_drafted": [4]})] == [1, 2]
    # arrays that cannot explain the chunks
    assert steps.align([[1], [2]], {"per_step_accepted": [3, 3], "per_step_drafted": [4, 4]}) is None


def test_alpha_counts_the_drafts_vllm_reached_from_its_per_step_lists():
    """The live reading lumps a row's rejections into one closing step (one reached draft), and α came out
    near 1; the per-step lists give the drafts the target came to: kept 2 of 4 (3 reached), 0 of 4 (1), 4 of 4."""
    assert steps.reached_of({"per_step_accepted": [2, 0, 4], "per_step_drafted": [4, 4, 4]}) == 3 + 1 + 4
    assert steps.reached_of({"per_step_accepted": [], "per_step_drafted": []}) == 0     # drafted nothing
    assert steps.reached_of(None) is None and steps.reached_of({"num_draft_tokens": 4}) is None
    assert steps.reached_of({"per_step_accepted": [1], "per_step_drafted": [4, 4]}) is None


def test_speculative_config_and_argv():
    cfg = speculative_config("ngram", 4)
    assert cfg == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert speculative_config("ngram", 0) is None
    with pytest.raises(VllmError, match="layer-skipping"):
        speculative_config("layerskip:12-17", 4)
    spec = LaunchSpec("smollm2-135m-offline", "ngram", 4, 8123, schedule=((1, 4, 4), (5, 256, 1)))
    argv = server_argv(spec, "/models/smol", python="/v/bin/python")
    assert argv[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--dtype") + 1] == "float32"
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 4, 4], [5, 256, 1]]
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "detailed"
    plain = server_argv(LaunchSpec("x", "ngram", 0, 8124), "/models/smol", python="/v/bin/python")
    assert "--speculative-config" not in plain and "--per-request-spec-decode-metrics" not in plain


def test_pair_labels_begin_with_vllm():
    from specviz.vllm.backend import pair_label

    assert pair_label("smollm2-135m-offline", "n-gram", 4) == "vLLM (smollm2-135m-offline, n-gram, k=4)"
    assert pair_label("/root/.cache/x/SmolLM2-dir/", "speculative", 3) == "vLLM (SmolLM2-dir, speculative, k=3)"
    assert pair_label("m", "none", None) == "vLLM (m, no speculation)"
    # no k: a launched pool's servers, whose k follows the depth slider (the label says so, in Persian too)
    assert pair_label("m", "speculative", None) == "vLLM (m, speculative, k = depth slider)"
    from specviz import lessons
    assert lessons.say("fa", pair_label("m", "n-gram", 4)).startswith("vLLM (")
    assert "ثابت" not in lessons.say("fa", pair_label("m", "n-gram", 4)) and "بدون" in lessons.say("fa", pair_label("m", "none", 0))


def test_rejected_drafts_show_as_marks_never_as_text():
    from specviz.ui.render import RowView

    view = RowView()
    view.add_step(0, steps.live_step(0, [5, 6, 7]), lambda ids: "".join(f"<{i}>" for i in ids))
    view.add_step(1, steps.closing_step(0, {"num_draft_tokens": 5, "num_accepted_draft_tokens": 2}, "length"),
                  lambda ids: "".join(f"<{i}>" for i in ids))
    html = view.html()
    assert html.count('class="tok-rejected"') == 3 and html.count("✗") == 3 and "&lt;-1&gt;" not in html
    assert html.count('class="tok-accepted"') == 2 and view.drafted == 5 and view.accepted == 2


def test_router_sends_only_vllm_pairs_to_vllm():
    from specviz.serve.catalog import PairChoice
    from specviz.serve.vllm_router import VllmRouter, vllm_choices
    from specviz.vllm.backend import Endpoint

    class Inner:
        zero_gpu = False

        def packets(self, req, choice, control):
            return iter(["ours"])

    ep = Endpoint("http://127.0.0.1:9", "vLLM (m, n-gram, k=4)", "ngram", 4, target_ref="smollm2-135m-offline")
    (choice,) = vllm_choices([ep])
    assert choice.engine == "vllm" and choice.label.startswith("vLLM") and choice.target == "smollm2-135m-offline"
    router = VllmRouter(Inner(), [ep])
    assert list(router.packets(None, PairChoice("ours", "t", "ngram"), None)) == ["ours"]
    with pytest.raises(VllmError, match="not reachable"):          # a sentence, not a traceback
        next(router.packets(None, choice, None))
    with pytest.raises(VllmError, match="not reachable"):
        router.ready(choice)
    down = Endpoint("http://127.0.0.1:9", "vLLM (server not reachable at start-up)", "?", None)
    (down_choice,) = vllm_choices([down])
    with pytest.raises(VllmError, match="not reachable"):
        VllmRouter(Inner(), [down]).ready(down_choice)


class FakeServer:
    """A launched server's stand-in: dead, and failing to start again."""

    url = "http://127.0.0.1:9"

    def __init__(self):
        self.starts = 0

    def alive(self):
        return False

    def start(self, progress=None):
        self.starts += 1
        raise VllmError("the vLLM server exited while starting (code 1): boom")

    def stop(self):
        pass


def test_launched_server_states_are_sentences():
    import time

    from specviz.vllm.backend import Endpoint, Status

    server = FakeServer()
    ep = Endpoint(server.url, "vLLM (m, n-gram, k=4)", "ngram", 4, server, "smollm2-135m-offline")
    with pytest.raises(VllmError, match="still starting"):
        ep.ready_model()
    ep.status = Status("ready")                  # it was up, then died: reported, and started again
    with pytest.raises(VllmError, match="has stopped; it is being started again"):
        ep.ready_model()
    deadline = time.time() + 5
    while ep.status.state == "starting" and time.time() < deadline:
        time.sleep(0.05)
    assert server.starts == 1 and ep.status.state == "failed"
    with pytest.raises(VllmError, match="could not start: the vLLM server exited while starting"):
        ep.ready_model()


# --- the vLLM sweep (`sweep --engine vllm`) and the lesson's recorded panels ------------------------------

def _recorded_vllm(tmp_path):
    """A recorded vLLM sweep written by `sweep_vllm.recorded` from cell figures (numbers made up for the
    arithmetic; the shipped record in assets/sweeps/ is the measured one)."""
    from types import SimpleNamespace

    from specviz.cli import sweep_vllm

    def cells(tps, mean_depth=0.0):
        return [{"batch_size": b, "tokens_per_s": x, "drafted": 10 * mean_depth, "accepted": 4 * mean_depth,
                 "mean_depth": mean_depth} for b, x in zip((1, 4, 16), tps)]
    per_depth = {0: cells([10, 30, 80]), 1: cells([14, 36, 84], 1), 4: cells([20, 33, 60], 4),
                 "schedule": cells([19, 37, 83], 1.5)}
    args = SimpleNamespace(target="smollm2-135m-offline", draft="ngram", prompt="Count to ten.", max_new_tokens=32,
                           vllm_eager=False, repeats=3)
    rec = sweep_vllm.recorded(args, [1, 4, 16], [0, 1, 4], per_depth, ((1, 4, 4), (5, 8, 2), (9, 256, 1)), 40,
                              "0.32.0", "AMD EPYC (2 cores)", "vLLM 0.32.0 (compiled)")
    (tmp_path / "vllm-cpu.json").write_text(json.dumps(rec))
    return rec


def test_schedule_text_round_trips_and_bad_ones_get_a_sentence():
    from specviz.cli.sweep_vllm import parse_schedule, schedule_text
    from specviz.limits import LimitError

    rows = parse_schedule("1-4:4,5-8:2,9-256:1")
    assert rows == ((1, 4, 4), (5, 8, 2), (9, 256, 1)) and schedule_text(rows) == "1-4:4,5-8:2,9-256:1"
    assert parse_schedule("none") == ()
    for bad in ("1-4", "a-b:c", "4-1:2", "1-4:99", "0-3:1"):
        with pytest.raises(LimitError, match="--schedule"):
            parse_schedule(bad)


def test_recorded_vllm_sweep_loads_apart_from_ours(tmp_path):
    from specviz.hardware import profiles

    rec = _recorded_vllm(tmp_path)
    assert "--engine vllm" in rec["command"] and "--schedule 1-4:4,5-8:2,9-256:1" in rec["command"]
    assert "--repeats 3" in rec["command"] and "median of 3 run(s)" in rec["about"]
    assert rec["acceptance_rate"] == {"1": 0.4, "4": 0.4} and rec["tokens_per_s"][2] == [80, 84, 60]
    assert profiles.load_sweeps(tmp_path) == []                # the what-if compares ours only
    (sw,) = profiles.load_sweeps(tmp_path, engine="vllm")
    assert sw.engine_version == "0.32.0" and sw.device == "cpu: AMD EPYC (2 cores)"
    assert sw.schedule["tokens_per_s"] == [19, 37, 83] and sw.schedule["mean_depth"] == [1.5] * 3
    broken = dict(rec, schedule=dict(rec["schedule"], tokens_per_s=[1.0]))   # one figure for three batches
    (tmp_path / "vllm-cpu.json").write_text(json.dumps(broken))
    assert profiles.load_sweeps(tmp_path, engine="vllm") == []


def test_recorded_vllm_sweep_as_the_lesson_reads_it(tmp_path):
    from specviz.chapters import vllm_panels as vl
    from specviz.hardware import profiles

    _recorded_vllm(tmp_path)
    (sw,) = profiles.load_sweeps(tmp_path, engine="vllm")
    heat = vl.sweep_result(sw)
    cell = {(r["batch_size"], r["depth"]): r["speedup"] for r in heat["table"]}
    assert cell[(1, 4)] == pytest.approx(2.0) and cell[(16, 4)] == pytest.approx(0.75) and cell[(4, 0)] == 1.0
    assert heat["best_depth"] == [{"batch_size": 1, "depth": 4}, {"batch_size": 4, "depth": 1},
                                  {"batch_size": 16, "depth": 1}]
    bars = vl.schedule_result(sw)
    assert {r["policy"] for r in bars["table"]} == {"k = 1", "k = 4", "vLLM schedule"}
    assert [w["policy"] for w in bars["winners"]] == ["k = 4", "vLLM schedule", "k = 1"]
    points = vl.schedule_points(sw)
    assert [(p["batch"], p["best_k"]) for p in points] == [(1, 4), (4, 1), (16, 1)]
    assert points[0]["ratio"] == pytest.approx(19 / 20) and points[1]["ratio"] == pytest.approx(37 / 36)
    # drafting the best fixed depth's own k, the schedule's gap is its server's speed, and the note says so
    from specviz.chapters import policies
    from specviz import lessons
    same = {"batch": 1, "ratio": 0.76, "best_k": 4, "mean_depth": 4.0}
    keys = [k for k, _ in policies.vllm_notes(replace(sw, schedule={**sw.schedule, "mean_depth": [4.0, 2.0, 1.0]}))]
    assert keys[1:] == ["chapter.policies.vllm_point_same", "chapter.policies.vllm_point",
                        "chapter.policies.vllm_point_same"]
    assert "not the depth the schedule chose" in lessons.text("en", keys[1], **same)


def test_recorded_vllm_panels_say_version_machine_and_command_in_both_languages(tmp_path):
    from specviz.chapters import vllm_panels as vl
    from specviz.hardware import profiles
    from dataclasses import replace

    from specviz import lessons
    from specviz.ui.lesson import chart_labels, vllm_md

    rec = _recorded_vllm(tmp_path)
    (sw,) = profiles.load_sweeps(tmp_path, engine="vllm")
    for lang in ("en", "fa"):
        md = vllm_md(lang, BY_KEY["policies"], sw)
        assert "0.32.0" in md and "AMD EPYC" in md and "sweep --engine vllm" in md
        # when, and the machine without brackets inside the heading's brackets (a right-to-left line mirrors them)
        heading = md.splitlines()[0]
        machine = lessons.machine(lang, "AMD EPYC, 2 cores")      # its cores in Persian on a Persian page
        assert rec["recorded_at"] in heading and machine in heading and "((" not in heading
        undated = vllm_md(lang, BY_KEY["policies"], replace(sw, recorded_at="")).splitlines()[0]
        assert machine in undated and "?" not in undated and "2026" not in undated
        assert "0.95×" in md and "1.03×" in md and "{" not in md
        assert "sweep --engine vllm" in vllm_md(lang, BY_KEY["sweep"], sw)
        fig = sweep.figure_recorded_sweep(vl.sweep_result(sw), chart_labels(lang, "sweep"))
        assert fig.data[0].type == "heatmap" and "★2.00" == fig.data[0].text[2][0]


# --- launched servers follow the depth slider (specviz.vllm.pool) ------------------------------------------

def _pool(memory=lambda: 64.0, max_servers=3):
    from specviz.vllm.backend import Endpoint, Status
    from specviz.vllm.pool import LaunchedPool

    made, closed = [], []

    class Ep(Endpoint):
        def close(self):
            closed.append(self.k)

    def launch(k):
        ep = Ep(f"http://127.0.0.1:{9000 + k}", f"vLLM (m, n-gram, k={k})", "ngram", k, FakeServer(),
                "smollm2-135m-offline")
        ep.status = Status("ready")          # as if started (the real launch starts it in a thread)
        made.append(k)
        return ep
    return LaunchedPool("smollm2-135m-offline", "ngram", 4, launch, memory, max_servers), made, closed


def test_launched_pool_starts_a_server_per_depth_and_keeps_them_while_memory_allows():
    from specviz.serve.vllm_router import VllmRouter, vllm_choices

    pool, made, closed = _pool()
    (choice,) = vllm_choices([pool])
    assert choice.label == "vLLM (smollm2-135m-offline, n-gram, k = depth slider)" and choice.engine == "vllm"
    assert made == [4] and pool.endpoint_for(4) is pool.current and made == [4]     # reused, not relaunched
    two = pool.endpoint_for(2)
    assert made == [4, 2] and two.k == 2 and pool.current is two and pool.depths() == [2, 4]
    pool.endpoint_for(1)
    pool.endpoint_for(2)                                      # k=4 is now the least recently used
    pool.endpoint_for(0)                                      # a fourth server: over MAX_SERVERS = 3
    assert closed == [4] and pool.depths() == [0, 1, 2]

    class Inner:
        zero_gpu = False
    router = VllmRouter(Inner(), [pool])
    assert router.depth_mode(choice) == ("follows", None)


def test_launched_pool_never_stops_a_busy_server_and_says_why_it_cannot_start():
    pool, made, closed = _pool(memory=lambda: 7.0, max_servers=2)    # 7 GiB free: room for one more
    pool.endpoint_for(4).enter()                                      # streaming a Run
    pool.endpoint_for(2).enter()
    with pytest.raises(VllmError, match="busy with Runs at other depths"):
        pool.endpoint_for(1)
    assert closed == [] and pool.depths() == [2, 4]
    low, made2, closed2 = _pool(memory=lambda: 1.0)
    low.endpoint_for(4).enter()
    with pytest.raises(VllmError, match="not enough free memory for another vLLM server"):
        low.endpoint_for(2)
    assert made2 == [4] and closed2 == []


def test_a_run_at_a_depth_still_starting_gets_a_sentence_naming_the_ready_ones():
    from specviz.serve.runner import RunRequest
    from specviz.serve.vllm_router import VllmRouter, vllm_choices
    from specviz.vllm.backend import Status

    pool, made, _ = _pool()
    launch = pool._launch

    def starting(k):
        ep = launch(k)
        ep.status = Status("starting")
        return ep
    pool._launch = starting

    class Inner:
        zero_gpu = False
    (choice,) = vllm_choices([pool])
    req = RunRequest("smollm2-135m-offline", "ngram", ((1, 2, 3),), 2, 1, FIXED, 0.0, 8)
    router = VllmRouter(Inner(), [pool])
    for _ in range(2):             # the press that starts it, and a press while it is still starting
        router.ready(choice)       # the pair itself is ready: which server depends on the Run's depth
        with pytest.raises(VllmError, match=r"starting a vLLM server for k = 2 .*ready now: k = 4"):
            next(router.packets(req, choice, None))
    assert made == [4, 2]


def test_a_server_someone_runs_shows_its_own_k_on_the_slider():
    from specviz.serve.catalog import PairChoice
    from specviz.serve.vllm_router import VllmRouter, vllm_choices
    from specviz.vllm.backend import Endpoint

    class Inner:
        zero_gpu = False
    ep = Endpoint("http://127.0.0.1:9", "vLLM (m, n-gram, k=3)", "ngram", 3, target_ref="smollm2-135m-offline")
    router = VllmRouter(Inner(), [ep])
    assert router.depth_mode(vllm_choices([ep])[0]) == ("fixed", 3)
    assert router.depth_mode(PairChoice("ours", "t", "ngram")) == ("ours", None)


def test_picking_a_pair_sets_the_depth_slider_by_its_engine():
    """A server someone runs: the slider shows its k, locked. Launched servers: free, and says it switches.
    Our pairs: free, no note."""
    from types import SimpleNamespace

    from specviz.serve.catalog import PairChoice
    from specviz.serve.vllm_router import VllmRouter, vllm_choices
    from specviz.ui.playground import Playground
    from specviz.vllm.backend import Endpoint

    class Inner:
        zero_gpu = False
    ep = Endpoint("http://127.0.0.1:9", "vLLM (m, n-gram, k=3)", "ngram", 3, target_ref="smollm2-135m-offline")
    pool, *_ = _pool()
    choices = {c.label: c for c in vllm_choices([ep, pool]) + [PairChoice("ours", "t", "ngram")]}
    app = SimpleNamespace(runner=VllmRouter(Inner(), [ep, pool]), choice=lambda label, lang: choices[label])
    page = Playground(app)
    fixed = page.on_pair(ep.label)
    assert fixed["value"] == 3 and fixed["interactive"] is False and "k = 3" in fixed["info"]
    follows = page.on_pair(pool.label)
    assert follows["interactive"] is True and "switches to a vLLM server" in follows["info"] and "value" not in follows
    ours = page.on_pair("ours")
    assert ours["interactive"] is True and not ours["info"]


def test_sweep_on_vllm_writes_our_sweep_files_and_a_record_the_lesson_reads(tiny_paths, tmp_path, monkeypatch):
    """The orchestration of `sweep --engine vllm` with each server's cells stubbed (the servers themselves
    are the real-server tier's business): one server per depth in order, then the schedule's; the same
    CSV/JSON/HTML as our sweep; recorded.json loads as a vLLM sweep with its command and version."""
    from specviz.__main__ import main
    from specviz.cli import sweep_vllm
    from specviz.hardware import profiles
    from specviz.vllm import launcher

    asked = []

    def cells(args, spec, prompt, batches, note):
        asked.append((spec.depth, spec.schedule))
        base = {0: 10.0, 1: 14.0, 2: 15.0}.get(spec.depth, 16.0) + (1.0 if spec.schedule else 0.0)
        return [{"batch_size": b, "tokens_per_s": base * b ** 0.5, "tokens": 8 * b, "wall_s": 1.0,
                 "acceptance_rate": 0.5 if spec.depth else None, "mean_depth": float(spec.depth),
                 "drafted": 10.0 * spec.depth, "accepted": 5.0 * spec.depth} for b in batches]
    monkeypatch.setattr(sweep_vllm, "_server_cells", cells)
    monkeypatch.setattr(sweep_vllm, "vllm_version", lambda python: "0.32.0")
    monkeypatch.setattr(launcher, "vllm_installed", lambda venv=launcher.VENV: True)
    out = tmp_path / "sw"
    rc = main(["sweep", "--engine", "vllm", "--target", tiny_paths["target"], "--draft", "ngram",
               "--batch-sizes", "1,4", "--depths", "2,0,1", "--max-new-tokens", "8", "--out", str(out)])
    assert rc == 0
    assert asked == [(0, ()), (1, ()), (2, ()), (4, ((1, 4, 4), (5, 8, 2), (9, 256, 1)))]
    assert {p.name for p in out.iterdir()} >= {"sweep.csv", "sweep.json", "sweep.html", "recorded.json"}
    data = json.loads((out / "sweep.json").read_text())
    assert data["engine"] == "vllm" and len(data["rows"]) == 6 and len(data["schedule_rows"]) == 2
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "vllm.json").write_text((out / "recorded.json").read_text())
    (sw,) = profiles.load_sweeps(tmp_path / "assets", engine="vllm")
    assert sw.depths == [0, 1, 2] and sw.batch_sizes == [1, 4] and sw.acceptance == {1: 0.5, 2: 0.5}
    assert sw.tokens_per_s[1] == [20.0, 28.0, 30.0] and sw.schedule["tokens_per_s"] == [17.0, 34.0]
    assert sw.command.startswith("python -m specviz sweep --engine vllm") and "--depths 0,1,2" in sw.command


def test_sweep_on_vllm_refuses_what_vllm_cannot_serve(tiny_paths, capsys, monkeypatch):
    from specviz.__main__ import main
    from specviz.vllm import launcher

    monkeypatch.setattr(launcher, "vllm_installed", lambda venv=launcher.VENV: True)
    assert main(["sweep", "--engine", "vllm", "--target", tiny_paths["target"], "--draft", "layerskip:1-2"]) == 2
    assert "vLLM has no layer-skipping draft" in capsys.readouterr().err
    assert main(["sweep", "--engine", "vllm", "--draft", "ngram", "--schedule", "1-4"]) == 2
    assert "--schedule takes LO-HI:K entries" in capsys.readouterr().err


def test_two_students_asking_for_the_same_new_depth_start_one_server():
    """The pool is shared by the class: two Runs at a new k at once launch one server for it."""
    import threading

    pool, made, _ = _pool()
    barrier, got = threading.Barrier(4), []

    def ask():
        barrier.wait()
        got.append(pool.endpoint_for(2))
    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [4, 2] and len({id(ep) for ep in got}) == 1


def _steps_text(count: float, tokens: float, prefill: float, decode: float, requests: float) -> str:
    return "\n".join([
        "# TYPE vllm:iteration_tokens_total histogram",
        f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="smol"}} {count}',
        f'vllm:iteration_tokens_total_count{{engine="0",model_name="smol"}} {count}',
        f'vllm:iteration_tokens_total_sum{{engine="0",model_name="smol"}} {tokens}',
        f'vllm:request_prefill_time_seconds_count{{engine="0",model_name="smol"}} {requests}',
        f'vllm:request_prefill_time_seconds_sum{{engine="0",model_name="smol"}} {prefill}',
        f'vllm:request_decode_time_seconds_count{{engine="0",model_name="smol"}} {requests}',
        f'vllm:request_decode_time_seconds_sum{{engine="0",model_name="smol"}} {decode}',
        f'vllm:request_decode_time_seconds_sum{{engine="0",model_name="other"}} 99.0',
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="smol"}} {tokens}',
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="smol"}} {tokens / 4}'])


def test_engine_time_is_the_difference_of_two_reads():
    """vLLM's side of bench-vllm's time split: steps and tokens per step from the engine's iteration
    histogram, per-request prefill and decode from theirs, between two reads of /metrics (one model)."""
    before, after = _steps_text(10, 200, 1.0, 4.0, 2), _steps_text(50, 1000, 3.0, 20.0, 6)
    got = metrics.engine_time(before, after, "smol")
    assert got["steps"] == 40 and got["prompt_and_generated_per_step"] == 20.0
    assert got["drafts_per_step"] is None                          # no speculation metrics in this capture
    assert got["prefill_s_per_request"] == pytest.approx(0.5) and got["decode_s_per_request"] == pytest.approx(4.0)
    assert got["queue_s_per_request"] is None                      # absent on this server: said, not made up
    assert got["prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert metrics.engine_time("", after, "smol")["steps"] == 50    # a fresh server: from zero


def test_our_time_split_adds_up(make_pair, prompts):
    """Our side: the engine's seconds in prefill, draft, verify and the rest of its steps, summed over a
    run, add up to no more than the run's wall time, and every step is counted — one run's, though one
    scheduler (one engine) serves the warm-up and every run."""
    from specviz.cli.bench_vllm import _median_run, _our_side

    with _our_side(make_pair("ngram"), [prompts[0], prompts[1]], 4) as once:
        got = _median_run([once(12) for _ in range(2)])
    # one run's steps: at most one a token per user, if the two never shared a step (a user admitted late on
    # a busy machine: a tiny model's step is as short as a thread's wake-up; 12 + 3 failed once under load);
    # the warm-up and both runs together took ~3 × 12 at least
    assert len(got["walls"]) == 2 and got["time"]["steps"] <= 2 * 12
    t = got["time"]
    assert t["steps"] >= 12 / 5 and t["emitted_per_step"] * t["steps"] == pytest.approx(24)
    assert t["tokens_per_step"] >= t["emitted_per_step"]              # a row emits at most what its pass verified
    assert t["prefill_s"] > 0 and t["verify_s"] > 0 and t["step_ms"] > 0
    parts = t["prefill_s"] + t["draft_s"] + t["verify_s"] + t["other_s"]
    assert parts <= got["wall_s"] + 1e-6 and t["outside_steps_s"] >= -1e-6


def test_bench_vllm_takes_turns_and_pairs_the_rounds():
    """The engines' runs alternate (ours first in even rounds, vLLM's in odd ones), and the paired ratio
    is the median over rounds of vLLM's wall ÷ ours."""
    from specviz.cli.bench_vllm import _alternate, paired_ratio

    order: list[str] = []
    walls = iter([1.0, 2.0, 3.0, 1.5, 1.0, 4.0])    # round 0: ours 1, vLLM 2; round 1: vLLM 3, ours 1.5; …

    def side(name):
        def once():
            order.append(name)
            return {"wall_s": next(walls)}
        return once
    mine, other = _alternate(side("ours"), side("vllm"), 3)
    assert order == ["ours", "vllm", "vllm", "ours", "ours", "vllm"]
    assert [r["wall_s"] for r in mine] == [1.0, 1.5, 1.0] and [r["wall_s"] for r in other] == [2.0, 3.0, 4.0]
    assert paired_ratio(mine, other) == pytest.approx(2.0)          # ratios 2, 2, 4
    assert paired_ratio([], []) is None


# --- bench-vllm: rows that differ between the engines -------------------------------------------------

NEAR_TIE = 0.05       # logit margin that two engines' kernels (fp32, different summation orders) can flip


def assert_rare_near_ties(differing: list[dict], rows: int) -> None:
    """Rows may differ only through float noise between two engines: at most one row in four, and each
    at a near-tie in our own logits, where our top two are within NEAR_TIE and vLLM's token within
    NEAR_TIE of ours (a real disagreement, or vLLM's token far down our list, fails)."""
    assert len(differing) <= rows // 4, f"{len(differing)} of {rows} rows differ: {differing}"
    for d in differing:
        assert d["top1_minus_top2"] < NEAR_TIE, d
        # (the margins come from one plain forward, not the batched pass that chose ours: either sign)
        assert d["vllm"] is not None and abs(d.get("ours_minus_vllm", NEAR_TIE)) < NEAR_TIE, d


def test_the_near_tie_rule_refuses_what_is_not_one():
    tie = {"row": 0, "position": 5, "ours": 7, "vllm": 9, "top1_minus_top2": 0.01, "ours_minus_vllm": 0.01}
    assert_rare_near_ties([], 4) is None and assert_rare_near_ties([tie], 4) is None
    for bad in ([tie, {**tie, "row": 1}],                       # two rows of four: not rare
                [{**tie, "top1_minus_top2": 0.5}],              # a clear winner in our logits
                [{**tie, "ours_minus_vllm": 0.8}],              # vLLM's token far below ours
                [{**tie, "vllm": None, "ours_minus_vllm": None}]):   # vLLM's answer ended early
        with pytest.raises(AssertionError):
            assert_rare_near_ties(bad, 4)


def test_the_recorded_vllm_charts_follow_the_language_switch(tiny_paths):
    """The language switch's updates give each recorded vLLM chart in the reader's language, every time."""
    from specviz.chapters import vllm_panels
    from specviz.chapters.registry import BY_KEY as CHAPTERS
    from specviz.ui import server
    from specviz.ui.lesson import chart_labels

    def fresh(chapter: str, lang: str) -> dict:
        chap = CHAPTERS[chapter]
        sw = chap.vllm.recording() if chap.vllm.recording else vllm_panels.recorded_vllm_sweep()
        return chap.vllm.figure(chap.vllm.result(sw, lang), chart_labels(lang, chapter)).to_plotly_json()

    app = server.SpecVizApp(tiny_paths["target"], tiny_paths["draft"], preload=False, calibrate_peaks=False)
    try:
        server.build_blocks(app)
        where = [i for i, c in enumerate(app.tr.components) if str(getattr(c, "elem_id", "")).startswith("plot-vllm-")]
        assert where
        for lang in ("fa", "en", "fa"):
            updates = app.tr.updates(lang)
            for i in where:
                chapter = app.tr.components[i].elem_id.removeprefix("plot-vllm-")
                assert updates[i]["value"].to_plotly_json() == fresh(chapter, lang), (lang, chapter)
    finally:
        app.close()
