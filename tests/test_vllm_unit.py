"""Pure parts of the vLLM backend (no vLLM needed): Prometheus parsing, stream chunks, step events,
alignment with vLLM's per-step arrays, launcher argv, error sentences, labels."""
from __future__ import annotations

import json

import pytest

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
    assert pair_label("m", "speculative", None) == "vLLM (m, speculative, k=?)"


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
    from specviz.ui.catalog import PairChoice
    from specviz.ui.vllm_runner import VllmRouter, vllm_choices
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
