"""ZeroGPU: with `spaces` present and SPACES_ZERO_GPU set, decoding runs in a forked GPU worker, the main
process never touches CUDA, sliders and Stop still reach the run, and the output stays lossless.
`tests/fakespaces` stands in for the real package (forked, reused worker; pickled arguments and
results), since no ZeroGPU exists here."""
import importlib
import os
import re
import sys
from pathlib import Path

import pytest
import torch

FAKE = str(Path(__file__).parent / "fakespaces")


@pytest.fixture
def zero_app(tiny_paths, tmp_path, monkeypatch):
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.syspath_prepend(FAKE)
    sys.modules.pop("spaces", None)
    spaces = importlib.import_module("spaces")
    probe = tmp_path / "cuda-probes"
    real = torch.cuda.is_available

    def recording_is_available():
        with open(probe, "a") as f:        # a file: the forked worker's calls must be seen here too
            f.write(f"{os.getpid()}\n")
        return real()

    monkeypatch.setattr(torch.cuda, "is_available", recording_is_available)
    from specviz.ui.playground import Playground
    from specviz.ui.server import SpecVizApp

    app = SpecVizApp(tiny_paths["target"], "layerskip:1-2", preload=False, allow_custom=True)
    app.page = Playground(app)
    yield app, spaces, probe
    sys.modules.pop("spaces", None)


def _run(app, label, on_first=None, max_new=96, depth=4, batch=2):
    gen = app.page.stream("the quick brown", label, batch, depth, "fixed", 8, 0, max_new, "s1")
    last, n = None, 0
    for out in gen:
        if isinstance(out[0], str):        # tokens streamed from the worker (not a status-only update)
            n += 1
            if n == 1 and on_first is not None:
                on_first()
        last = out
    return last, n


def test_runs_in_a_gpu_worker_and_stays_lossless(zero_app, reference, prompts):
    app, spaces, probe = zero_app
    assert app.runner.zero_gpu and app.sampler is None
    (tokens, _, counters, _, chart_h, _, status, _, _, result), n = _run(app, app.choices[0].label)
    assert result["done"] and not result["stopped"] and "Done." in status
    assert result["worker_pid"] != os.getpid()          # decoded in the forked worker
    assert result["prompt_ids"] == [prompts[0]] * 2          # per row, as in the CLI
    for out in result["outputs"]:
        assert out == reference(0, 96)
    assert 'class="tok-accepted"' in tokens
    # the counters set the step's tokens per pass against the knee estimated from the worker's peaks
    assert re.search(r"tokens per target pass \(2 rows \+ \d+ verified drafts?\)", counters) and "knee ≈" in counters
    assert "process memory (RSS)" in counters
    pids = set(probe.read_text().split())
    assert str(os.getpid()) not in pids                  # the main process never asked for CUDA
    assert str(result["worker_pid"]) in pids             # the worker picked its device itself
    assert spaces.durations and 30 <= spaces.durations[-1] <= 120
    # hardware readings came from the worker (CPU here: the fake worker has no GPU)
    names = [t.name for t in chart_h.data]
    assert any("CPU busy" in (nm or "") for nm in names)


def test_sliders_and_stop_reach_the_worker(zero_app, reference):
    app, _, _ = zero_app
    label = app.choices[0].label
    # depth 0 mid-run: later steps are plain decoding in the worker, and the text is still exact
    (tokens, *_, result), _ = _run(app, label, on_first=lambda: app.page.set_knobs("s1", depth=0), max_new=400)
    assert 'class="tok-plain"' in tokens
    assert all(out == reference(0, 400) for out in result["outputs"])
    # Stop ends the run early, and a new run in the same worker works
    (*_, status, _, _, result), _ = _run(app, label, on_first=lambda: app.page.stop("s1"), max_new=400)
    assert result["stopped"] and "Stopped." in status
    assert all(len(out) < 400 for out in result["outputs"])
    (*_, result2), _ = _run(app, label, max_new=16)
    assert result2["done"] and not result2["stopped"]


def test_worker_errors_are_human_messages(zero_app, tiny_paths):
    import gradio as gr

    app, _, _ = zero_app
    with pytest.raises(gr.Error, match="tokenizer"):
        _run(app, f"{tiny_paths['foreign']} → {tiny_paths['target']}")
    (*_, result), _ = _run(app, app.choices[0].label, max_new=8)   # the worker still serves
    assert result["done"]


def test_without_zero_gpu_the_app_runs_locally(tiny_paths, monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    monkeypatch.syspath_prepend(FAKE)
    from specviz.ui.playground import Playground
    from specviz.ui.server import SpecVizApp

    app = SpecVizApp(tiny_paths["target"], tiny_paths["draft"], preload=False, calibrate_peaks=False)
    app.page = Playground(app)
    try:
        assert not app.runner.zero_gpu
        (*_, result), _ = _run(app, app.choices[0].label, max_new=8)
        assert result["worker_pid"] == os.getpid()
    finally:
        closed = app.close()          # asserted after: an assert here would hide the test's own failure
    assert closed and not app.sampler.running


def test_served_app_streams_from_the_worker(tiny_paths, tmp_path, greedy):
    """The launched app under ZeroGPU: the page's /generate endpoint streams tokens decoded in the worker."""
    from apphelp import start_app, stop_app
    from gradio_client import Client

    env = {"SPACES_ZERO_GPU": "true", "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), FAKE])}
    proc, url = start_app(tiny_paths["target"], "layerskip:1-2", tmp_path / "app.log", env)
    try:
        c = Client(url, verbose=False)
        label = f"layerskip:1-2 → {tiny_paths['target']}"
        job = c.submit("the quick brown", label, 2, 4, "fixed", 8, 0, 64, api_name="/generate")
        final = job.result()[-1]
        assert final["done"] and final["worker_pid"] not in (0, proc.pid)
        assert all(out == greedy(ids, 64) for ids, out in zip(final["prompt_ids"], final["outputs"]))
    finally:
        stop_app(proc)


def test_knee_is_measured_in_the_worker(zero_app):
    app, _, probe = zero_app
    updates = list(app.runner.knee(app.choices[0], 32, None))
    final = updates[-1]
    assert final.done and final.tokens_per_pass[-1] == 128 and len(updates) == len(final.tokens_per_pass) + 1
    assert final.device.startswith("cpu") and final.peaks is not None      # the worker calibrated itself
    assert str(os.getpid()) not in set(probe.read_text().split())


def test_offered_pairs_are_placed_at_start_up_and_the_worker_starts_with_them(tiny_paths, monkeypatch, reference):
    """The documented ZeroGPU pattern: weights go to the (emulated) device in the main process before the
    first worker forks; the worker decodes with them and loads nothing. Loading is made to fail after
    start-up, in this process and so in every worker forked from it."""
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.syspath_prepend(FAKE)
    sys.modules.pop("spaces", None)
    importlib.import_module("spaces")
    from specviz.pairs import pipeline
    from specviz.ui.playground import Playground
    from specviz.ui.server import SpecVizApp

    app = SpecVizApp(tiny_paths["target"], "layerskip:1-2", calibrate_peaks=False)
    try:
        def no_loading(ref, device=None):
            raise AssertionError(f"{ref} was loaded after start-up")
        monkeypatch.setattr(pipeline, "load_model", no_loading)
        app.page = Playground(app)
        (*_, status, _, _, result), _ = _run(app, app.choices[0].label, max_new=32)
        assert result["done"] and result["worker_pid"] != os.getpid(), status
        assert all(out == reference(0, 32) for out in result["outputs"])
    finally:
        sys.modules.pop("spaces", None)
