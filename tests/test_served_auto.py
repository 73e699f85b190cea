"""The served tier on what a class runs: `python app.py` with the default `--compile auto` (conftest.py sets
SPECVIZ_COMPILE=off for the other served tests), the app's n-gram pair on the tiny target, clients through
the Gradio API.

Under auto the app serves every pair eagerly first and warms its fast path in a background thread
(specviz.serve.warmup): the compact forward's weight layouts and whole passes are timed here (our C layers
among the candidates where gcc builds them), its greedy tokens are checked against the eager path's, and
it replaces the eager pair only where its one-token pass measured faster. Which way that goes depends on
the machine, so the test reads the decision from the app's log and asserts that every step of every Run
ran on the path it names (each step event carries `path`; a Run's recording keeps them)."""
from __future__ import annotations

import json
import re
import shutil
import threading
import time

import pytest
from apphelp import client, start_app, stop_app, unexpected_tracebacks

WARM_DEADLINE_S = 600        # a hang guard for the warm-up (it normally takes well under a minute)
EAGER = "eager (transformers)"
FAST = "static (eager); weights "


@pytest.fixture(scope="module")
def auto_app(tiny_paths, tmp_path_factory):
    """The app on auto with the n-gram pair; yields (url, label, log, the path its Runs must report).
    A cache folder of its own: the layouts, whole passes and C kernel are measured and built here, as on
    a machine that serves for the first time."""
    tmp = tmp_path_factory.mktemp("served-auto")
    log = tmp / "app.log"
    env = {"SPECVIZ_COMPILE": "auto", "SPECVIZ_CACHE": str(tmp / "cache")}
    proc, url = start_app(tiny_paths["target"], "ngram", log, env)
    try:
        decided = _wait_for_warm_up(log)
        yield url, f"ngram → {tiny_paths['target']}", log, decided
    finally:
        stop_app(proc)


def _wait_for_warm_up(log) -> str:
    """The warm-up's verdict line ("fast path for <pair>: …"), once it is in the log."""
    deadline = time.time() + WARM_DEADLINE_S
    while True:
        line = next((ln for ln in log.read_text().splitlines() if "fast path for " in ln), None)
        if line is not None:
            return line
        assert time.time() < deadline, f"the warm-up never finished:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def expected_path(decided: str) -> str:
    """What a step's `path` starts with after the warm-up: the fast path where it was handed over
    ("ready after …"), else the stock modules (measured slower, or other tokens)."""
    return FAST if "ready after" in decided else EAGER


def step_paths(recording_file: str) -> list[str]:
    with open(recording_file, encoding="utf-8") as f:
        return [ev["path"] for _, ev, _ in json.load(f)["steps"]]


def test_auto_warms_up_and_says_which_path_it_chose(auto_app):
    _, _, log, decided = auto_app
    text = log.read_text()
    assert "ready after" in decided or "staying eager" in decided or "running eager" in decided, decided
    # the whole passes were timed on this machine, the C layers among them wherever a C compiler builds
    # them (specviz.fastpath.passes); with the fast path served, its label names what serves
    timed = [ln for ln in text.splitlines() if "whole passes timed" in ln and "1 row:" in ln]
    assert timed, text[-3000:]
    if shutil.which("cc") or shutil.which("gcc"):
        assert "C layers" in timed[0], timed[0]
    if "ready after" in decided:
        assert "weights " in decided


def _run(url, prompt, label, batch, depth, max_new, start: threading.Barrier | None = None):
    c = client(url, timeout=120)
    if start is not None:
        start.wait(60)
    out = c.predict(prompt, label, batch, depth, "fixed", 8, 0, max_new, api_name="/generate")
    return out[-1], out[8]


def test_two_clients_at_once_get_the_targets_own_tokens_on_the_chosen_path(auto_app, greedy):
    url, label, log, decided = auto_app
    start, results = threading.Barrier(2), [None, None]

    def one(i, prompt, depth):
        try:
            results[i] = _run(url, prompt, label, 2, depth, 48, start)
        except Exception as exc:          # reported below with the client's number
            results[i] = exc
    threads = [threading.Thread(target=one, args=(i, p, d)) for i, (p, d) in
               enumerate([("the quick brown fox jumps over the quick brown", 4), ("memory bound decode streams", 2)])]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    want = expected_path(decided)
    for i, res in enumerate(results):
        assert not isinstance(res, Exception) and res is not None, (i, res)
        final, rec = res
        assert final["done"] and not final["stopped"] and not final["during_warmup"], final
        assert len(final["outputs"]) == 2
        for ids, out in zip(final["prompt_ids"], final["outputs"]):
            assert out == greedy(ids, 48), f"client {i} differs from the target's own greedy output"
        paths = step_paths(rec)
        assert paths and all(p.startswith(want) for p in paths), (decided, set(paths))
    assert not unexpected_tracebacks(log.read_text())


def _shared_rows(counters) -> int | None:
    m = re.search(r"tokens? per target pass \((\d+) rows? \+", counters if isinstance(counters, str) else "")
    return int(m.group(1)) if m else None


def test_a_stop_ends_only_that_clients_run(auto_app, greedy):
    """A streams 4 rows, B joins its batch with 2; A's Stop ends A (a prefix of the target's own tokens)
    while B runs on to its last token, exact."""
    url, label, log, decided = auto_app
    a, b = client(url), client(url)
    # depth 0: one token a step, so A's 512 tokens take the most steps a Run can; B joins at once
    job_a = a.submit("the quick brown", label, 4, 0, "fixed", 8, 0, 512, api_name="/generate")
    job_b = b.submit("speculative decoding spends", label, 2, 3, "fixed", 8, 0, 160, api_name="/generate")
    shared = False
    for out in job_b:
        if _shared_rows(out[2]) == 6:
            shared = True
            a.predict(api_name="/stop")
            break
    assert shared, "B never shared a step with A"
    final_a = job_a.result(120)[-1]
    outs_b = job_b.result(300)
    final_b, rec_b = outs_b[-1], outs_b[8]
    assert final_a["stopped"] and all(len(o) < 512 for o in final_a["outputs"]), final_a
    for ids, out in zip(final_a["prompt_ids"], final_a["outputs"]):
        assert out == greedy(ids, 512)[:len(out)]         # what A got before its Stop is the target's own
    assert final_b["done"] and not final_b["stopped"] and final_b["users_max"] == 2, final_b
    for ids, out in zip(final_b["prompt_ids"], final_b["outputs"]):
        assert out == greedy(ids, 160)
    paths = step_paths(rec_b)
    assert paths and all(p.startswith(expected_path(decided)) for p in paths), (decided, set(paths))
    assert not unexpected_tracebacks(log.read_text())
