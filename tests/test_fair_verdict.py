"""The playground's verdict is fair (issue 27): no verdict from a Run measured during the app's own
warm-up (a Run arriving then waits for it, saying so), the plain baseline streams to the page as the
Run did, and "faster"/"slower" only outside the noise band ("about the same" inside it)."""
import json
import re
import time
from types import SimpleNamespace

import pytest

from specviz import lessons
from specviz.ui import counters
from specviz.ui.i18n import t


def test_verdict_names_a_winner_only_outside_the_noise_band():
    assert counters.verdict(1.0 + 2 * counters.NOISE_BAND) == "faster"
    assert counters.verdict(1.0 - 2 * counters.NOISE_BAND) == "slower"
    assert counters.verdict(1.0 + counters.NOISE_BAND / 2) == "same"
    assert counters.verdict(1.0 - counters.NOISE_BAND / 2) == "same"
    assert counters.verdict(None) == "none"


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_baseline_text_per_verdict_and_during_warm_up(lang):
    totals = SimpleNamespace(tokens_per_s=10.2, flops_ratio=1.8, users_max=1)
    same = counters.baseline_md(lang, totals, 10.0)
    faster = counters.baseline_md(lang, SimpleNamespace(tokens_per_s=15.0, flops_ratio=1.8, users_max=1), 10.0)
    warming = counters.baseline_md(lang, totals, 10.0, during_warmup=True)
    assert len({same, faster, warming}) == 3
    assert "1.02" in same and "5%" in same                      # the ratio and the band it sits inside
    assert "1.02" not in warming and "10.0" not in warming       # no figures, no verdict
    if lang == "en":
        assert "about the same" in same and "No verdict" in warming
        assert "decoded **1.50×** faster than plain decoding" in faster
        # the one rate in brackets is plain decoding's, said so (a teacher read it as the Run's)
        assert "plain decoding (which ran at 10.0 tokens/s" in faster and "which ran at 10.0" in same


@pytest.fixture
def local_app(tiny_paths, monkeypatch):
    return _app(tiny_paths["target"], tiny_paths["draft"], monkeypatch)


_APPS: list = []


@pytest.fixture(autouse=True)
def _settled():
    """Each test's apps finish their background work (a curve measured again after a Run): a process that
    exits while a daemon thread is inside torch aborts ("terminate called", exit status 134)."""
    yield
    while _APPS:
        app = _APPS.pop()
        assert app.close(), "an app's background work did not end"
        assert not app.sampler.running
        assert not any(s._thread.is_alive() for s in app.runner.schedulers._by_pair.values() if s._thread)


def _app(target: str, draft: str, monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    from specviz.ui import playground
    from specviz.ui.server import SpecVizApp

    monkeypatch.setattr(playground, "MIN_UPDATE_S", 0.0)        # every step reaches the page
    monkeypatch.setattr(playground, "WARMUP_POLL_S", 0.0)
    app = SpecVizApp(target, draft, preload=False, calibrate_peaks=False)
    app.page = playground.Playground(app)
    _APPS.append(app)
    return app


def _states(app, monkeypatch, states):
    """fast_status answers from `states` (the last one repeats): a warm-up that ends after a few polls."""
    from specviz.serve.catalog import FastStatus

    seq = iter(states)
    last = {"s": states[-1]}

    def status(choice):
        last["s"] = next(seq, last["s"])
        return FastStatus(last["s"])
    monkeypatch.setattr(app.pairs, "fast_status", status)


def _outs(app):
    from specviz.ui.playground import OUTPUTS

    gen = app.page.stream("the quick brown", app.choices[0].label, 1, 4, "fixed", 8, 0, 24, "s1")
    return [dict(zip(OUTPUTS, out)) for out in gen]


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_a_baseline_that_shared_the_batch_where_the_run_did_not_gives_no_verdict(lang):
    """Two students pressing Run together: one Run alone, its baseline beside the other's Run (a first-time
    user saw 3.01× faster against a baseline slowed by another student). Either way round: no verdict."""
    alone, shared = (SimpleNamespace(tokens_per_s=30.0, flops_ratio=1.8, users_max=n) for n in (1, 2))
    for run, plain_users in ((alone, 3), (shared, 1)):
        said = counters.baseline_md(lang, run, 10.0, plain_users=plain_users)
        assert "3.00" not in said and "10.0" not in said, said          # no ratio, no figure of the baseline
        assert said == t(lang, "playground.baseline_unlike_" + ("alone" if run is alone else "shared"), users=plain_users)
    both = counters.baseline_md(lang, shared, 10.0, plain_users=3)
    assert "3.00" in both and both.endswith(t(lang, "playground.baseline_shared_too", users=3, run_users=2))
    assert "3.00" in counters.baseline_md(lang, alone, 10.0, plain_users=1)


def test_the_runs_verdict_is_withheld_when_its_baseline_shared_the_batch(local_app, monkeypatch):
    from dataclasses import replace

    _states(local_app, monkeypatch, ["ready"])
    real = local_app.page._baseline

    def beside_another_run(*args, **kwargs):
        plain = yield from real(*args, **kwargs)
        return replace(plain, users_max=2)
    monkeypatch.setattr(local_app.page, "_baseline", beside_another_run)
    outs = _outs(local_app)
    result = outs[-1]["result"]
    assert result["verdict"] == "none" and result["plain_users_max"] == 2 and result["users_max"] == 1
    assert lessons.text("en", "playground.baseline_unlike_alone", users=2) in outs[-1]["counters"]


def test_a_run_and_baseline_that_both_shared_are_judged_by_the_band_measured_so_far(local_app, monkeypatch):
    """Both shared the batch: a verdict, with the band this request's lone baselines measured (not the
    borrowed ±5 %), and the shared baseline is not added to it."""
    from dataclasses import replace

    _states(local_app, monkeypatch, ["ready"])
    run, baseline = local_app.page._run, local_app.page._baseline

    def shared(real):
        def wrapped(*args, **kwargs):
            out = yield from real(*args, **kwargs)
            return replace(out, totals=replace(out.totals, users_max=3)) if hasattr(out, "totals") else \
                replace(out, users_max=2)
        return wrapped
    monkeypatch.setattr(local_app.page, "_run", shared(run))
    monkeypatch.setattr(local_app.page, "_baseline", shared(baseline))
    calls = []
    measured = counters.Band(0.5, 3)
    monkeypatch.setattr(local_app.page, "bands", SimpleNamespace(
        add=lambda key, tps: calls.append("add") or counters.Band(), band=lambda key: calls.append("band") or measured))
    outs = _outs(local_app)
    result = outs[-1]["result"]
    assert calls == ["band"] and result["noise_band"] == 0.5 and result["noise_band_samples"] == 3
    assert result["users_max"] == 3 and result["plain_users_max"] == 2 and result["verdict"] != "none"
    assert "±50%" in outs[-1]["counters"]
    assert t("en", "playground.baseline_shared_too", users=2, run_users=3) in outs[-1]["counters"]


def test_a_pressed_run_replaces_the_last_runs_done_at_once(local_app, monkeypatch):
    """The first frame of a Run clears the last Run's tokens and its "Done." (left in the language it ended
    in after a switch, for as long as the new Run loaded and read its prompt)."""
    _states(local_app, monkeypatch, ["ready"])
    first = _outs(local_app)[0]
    assert first["status"] == t("en", "playground.status_starting", pair=local_app.choices[0].label)
    assert "<span" not in first["tokens"]


def test_the_runs_end_draws_the_pass_time_chart_with_its_last_step(local_app, monkeypatch):
    """The timer draws the pass-time chart during a Run and stops with it: a Run over between two ticks
    left the chart with no step on it."""
    _states(local_app, monkeypatch, ["ready"])
    _outs(local_app)
    tab, other = SimpleNamespace(session_hash="s1"), SimpleNamespace(session_hash="s2")
    assert not hasattr(local_app.page.on_tick(local_app.choices[0].label, other)[3], "data")   # not another tab's
    knee = local_app.page.on_tick(local_app.choices[0].label, tab)[3]
    assert len([t for t in knee.data if t.meta == "this-step"]) == 1 and knee.layout.annotations
    assert not hasattr(local_app.page.on_tick(local_app.choices[0].label, tab)[3], "data")   # drawn once


def test_a_run_during_the_warm_up_waits_for_it_and_says_so(local_app, monkeypatch):
    _states(local_app, monkeypatch, ["warming", "warming", "warming", "ready"])
    outs = _outs(local_app)
    waits = [o["status"] for o in outs if isinstance(o["status"], str) and "warm-up" in o["status"]]
    assert waits and "s so far" in waits[0]
    result = outs[-1]["result"]
    assert result["done"] and not result["during_warmup"] and result["verdict"] in ("faster", "slower", "same")


def test_a_run_measured_during_the_warm_up_gets_no_verdict(local_app, monkeypatch):
    from specviz.ui import playground

    monkeypatch.setattr(playground, "WARMUP_WAIT_S", 0.0)       # it gave up waiting: runs beside the warm-up
    _states(local_app, monkeypatch, ["warming"])
    outs = _outs(local_app)
    result = outs[-1]["result"]
    assert result["during_warmup"] and result["verdict"] == "none"
    assert "No verdict" in outs[-1]["counters"]


def test_the_baseline_streams_to_the_page_as_the_run_did(local_app, monkeypatch):
    """Every step of the plain baseline reaches the page as a Run's does (the runner's packets are
    split one step each here: how many steps a packet carries depends on thread timing)."""
    from dataclasses import replace

    _states(local_app, monkeypatch, ["ready"])
    real = local_app.runner.packets

    def one_step_each(req, choice, control):
        for p in real(req, choice, control):
            for ev in p.events[:-1]:
                yield replace(p, events=[ev], final=False, outputs=None)
            yield replace(p, events=p.events[-1:])
    monkeypatch.setattr(local_app.runner, "packets", one_step_each)
    outs = _outs(local_app)
    pending = [i for i, o in enumerate(outs) if isinstance(o["status"], str) and "plain decoding" in o["status"]]
    assert pending, "no baseline phase"
    streamed = [o for o in outs[pending[0]:-1] if isinstance(o["tokens"], str)]
    assert streamed, "the baseline's tokens never reached the page"
    assert outs[-1]["result"]["plain_tokens_per_s"]


def test_the_band_is_measured_from_the_same_requests_baselines():
    """One baseline: the borrowed band. From two on, their spread (max − min) ÷ median, never below the
    borrowed band; a ratio that is "faster" against ±5 % is "about the same" against a measured ±30 %."""
    bands = counters.NoiseBands()
    first = bands.add(("pair", (1, 2), 1, 128), 10.0)
    assert first == counters.Band(counters.NOISE_BAND, 0)
    assert bands.add(("other", (1, 2), 1, 128), 13.0).samples == 0      # another request: its own band
    second = bands.add(("pair", (1, 2), 1, 128), 13.0)
    assert second.samples == 2 and second.width == pytest.approx(3.0 / 11.5)
    assert bands.add(("pair", (1, 2), 1, 128), 10.1).width == pytest.approx(3.0 / 10.1)
    fourth = bands.add(("pair", (1, 2), 1, 128), 10.05)       # 13.0 now stands far from three near 10
    assert fourth.outliers == 1 and fourth.width == counters.NOISE_BAND
    steady = counters.NoiseBands()
    steady.add("k", 10.0)
    assert steady.add("k", 10.01).width == counters.NOISE_BAND           # never narrower than the borrowed one
    totals = SimpleNamespace(tokens_per_s=11.5, flops_ratio=1.8, users_max=1)
    assert "faster than plain decoding" in counters.baseline_md("en", totals, 10.0)
    measured = counters.baseline_md("en", totals, 10.0, band=second)
    assert "about the same" in measured and "measured 2 times on this server" in measured
    assert "2" in counters.baseline_md("fa", totals, 10.0, band=second)


def test_two_sessions_record_baselines_at_once():
    """The bands are one object for every session: baselines added from many threads at once all land
    (the last KEEP of each request) and no reader sees a half-written list."""
    import threading

    bands = counters.NoiseBands()
    seen: list = []

    def add(i):
        for j in range(200):
            seen.append(bands.add(("req", i % 2), 10.0 + (j % 7)))
    threads = [threading.Thread(target=add, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(seen) == 800
    assert all(b.samples <= counters.NoiseBands.KEEP for b in seen)
    assert bands.add(("req", 0), 10.0).samples == counters.NoiseBands.KEEP


def test_a_second_press_of_the_same_run_measures_the_band(local_app, monkeypatch):
    _states(local_app, monkeypatch, ["ready"])
    first = _outs(local_app)[-1]["result"]
    second = _outs(local_app)[-1]["result"]
    assert first["noise_band_samples"] == 0 and first["noise_band"] == counters.NOISE_BAND
    assert second["noise_band_samples"] == 2 and second["noise_band"] >= counters.NOISE_BAND


@pytest.mark.parametrize("lang, draft", [("en", "draft"), ("fa", "draft"), ("en", "synthetic:0.7")])
def test_a_run_paused_by_a_timed_experiment_says_why_and_goes_on(tiny_paths, monkeypatch, lang, draft):
    """A lesson chapter (any timed experiment) holds the device: the Run's status says why its tokens
    stopped, in the reader's language, and the Run finishes once the experiment lets go. A synthetic Run
    (an engine of its own, not the shared batch) says so too."""
    import threading

    from specviz import lessons
    from specviz.ui.render import tokens_html

    local_app = _app(tiny_paths["target"], tiny_paths.get(draft, draft), monkeypatch)
    _states(local_app, monkeypatch, ["ready"])
    monkeypatch.setattr(local_app.page, "lang", lambda session: lang)
    th, release = _holding_the_device(local_app)
    timer = threading.Timer(2.0, release.set)
    timer.start()
    try:
        outs = _outs(local_app)
    finally:
        _let_go(th, release, timer)
    said = lessons.text(lang, "playground.status_device_wait").split("(")[0].strip()
    paused = [o["status"] for o in outs if isinstance(o["status"], str) and said in o["status"]]
    assert paused, [o["status"] for o in outs]
    before = outs[:next(i for i, o in enumerate(outs) if isinstance(o["status"], str) and said in o["status"])]
    shown = [o["tokens"] for o in before if isinstance(o["tokens"], str)]
    assert shown == [tokens_html(None)]              # paused before its first token: not "Press Run to start"
    assert re.search("\\*\\*\u2066?[1-9]\\d*\u2069?\\*\\*", paused[0])   # ours, and the app's own pass-curve measurement if queued
    assert outs[-1]["result"]["done"] and not outs[-1]["result"]["stopped"]


@pytest.mark.parametrize("draft", ["draft", "synthetic:0.7"])
def test_stop_during_a_pause_ends_the_run_at_once(tiny_paths, monkeypatch, draft):
    """A timed experiment takes the device in the middle of a Run, and Stop is pressed while the Run is
    paused: the Run ends stopped, with its tokens so far, while the experiment still holds the device
    (it used to wait for the experiment's end: up to a minute for a lesson chapter)."""
    import threading

    from specviz import lessons
    from specviz.ui.playground import OUTPUTS
    from specviz.ui.render import tokens_html

    app = _app(tiny_paths["target"], tiny_paths.get(draft, draft), monkeypatch)
    _states(app, monkeypatch, ["ready"])
    paused = lessons.text("en", "playground.status_device_wait").split("(")[0].strip()
    holding, release, let_go = threading.Event(), threading.Event(), threading.Event()
    ticket, th, step = None, None, app.gate.step

    def slow_step(*args, **kwargs):        # the tiny models' whole Run would be over before the page saw it
        time.sleep(0.02)
        return step(*args, **kwargs)
    monkeypatch.setattr(app.gate, "step", slow_step)
    monkeypatch.setattr(app.gate, "turn_s", 0.0)      # no class's turn after the app's own pass-curve measurement

    def experiment():
        while not ticket.acquire():
            pass
        holding.set()
        release.wait(30)
        ticket.release()
        let_go.set()
    outs = []
    try:
        for out in app.page.stream("the quick brown", app.choices[0].label, 2, 4, "fixed", 8, 0, 96, "s1"):
            outs.append(dict(zip(OUTPUTS, out)))
            tokens, status = outs[-1]["tokens"], outs[-1]["status"]
            if ticket is None and isinstance(tokens, str) and '<span class="tok-' in tokens:
                ticket = app.gate.enqueue()       # from here the steps wait (after the one running)
                th = threading.Thread(target=experiment)
                th.start()
            # Stop in our experiment's pause: the app's own pass-curve measurement may pause the Run before
            # it (on a loaded machine it was still running), and a Stop there ends the Run before any token
            if ticket is not None and isinstance(status, str) and paused in status:
                app.runs.stop("s1")
        ended_while_held = holding.is_set() and not let_go.is_set()
    finally:
        release.set()
        if th is not None:
            th.join(10)
    assert ticket is not None, "no token reached the page before the Run ended"
    assert any(isinstance(o["status"], str) and paused in o["status"] for o in outs)
    assert ended_while_held
    result = outs[-1]["result"]
    assert result["done"] and result["stopped"]
    assert any(result["outputs"]) and all(len(o) < 96 for o in result["outputs"])


def _slow_steps(app, monkeypatch):
    """Each step 20 ms longer: the tiny models' baseline would be over before the page saw it."""
    step = app.gate.step

    def slow_step(*args, **kwargs):
        time.sleep(0.02)
        return step(*args, **kwargs)
    monkeypatch.setattr(app.gate, "step", slow_step)


def test_the_baseline_stops_at_stop_and_keeps_its_depth_when_a_slider_moves(local_app, monkeypatch):
    """The plain baseline after a Run: Stop did nothing (the reader waited for it to end), and it is the
    tab's run meanwhile, so a depth slider moved then must not make it speculate (its figure would no
    longer be plain decoding). The pass-time chart's timer draws its passes, then the Run's again."""
    from specviz.ui.playground import OUTPUTS

    app = local_app
    _states(app, monkeypatch, ["ready"])
    _slow_steps(app, monkeypatch)
    outs, seen = [], []
    for out in app.page.stream("the quick brown", app.choices[0].label, 1, 4, "fixed", 8, 0, 128, "s1"):
        outs.append(dict(zip(OUTPUTS, out)))
        live = app.runs.get("s1")
        if live is not None and live.baseline and live.passes and not seen:
            app.page.set_knobs("s1", depth=4)
            seen.append((live.control.knobs.snapshot().depth, live.knee_figure()))
            app.page.on_stop(None, SimpleNamespace(session_hash="s1"))
    assert seen, "the baseline never reached the timer"
    depth, knee = seen[0]
    assert depth == 0 and "this step: 1 token per pass" in json.dumps(knee.to_plotly_json())
    result = outs[-1]["result"]
    assert result["done"] and not result["stopped"] and result["tokens"] > 0
    assert result["plain_tokens_per_s"] is None                 # stopped: no comparison made
    assert app.runs.get("s1") is None
    ended = app.runs.take_ended("s1")                          # what the timer draws next: the Run's chart
    assert ended is not None and not ended.baseline and ended.control.knobs.snapshot().depth == 4


def _holding_the_device(app):
    """A timed experiment holding the app's device from a thread of its own, until `release` is set."""
    import threading

    holding, release = threading.Event(), threading.Event()

    def experiment():
        with app.gate.exclusive():
            holding.set()
            release.wait(30)
    th = threading.Thread(target=experiment)
    th.start()
    holding.wait(5)
    return th, release


def _let_go(th, release, timer) -> None:
    """End the experiment of `_holding_the_device`, and the app's pass-curve measurement that queued behind it."""
    import threading

    timer.cancel()
    release.set()
    th.join(5)
    for other in threading.enumerate():
        if other.name == "specviz-pass-curve":
            other.join(60)


def test_one_busy_baseline_does_not_widen_every_later_band():
    """After six presses a walkthrough's band read ±62 %: one baseline taken while the machine was busy. A
    far outlier (over 8 robust deviations from the median) is left out of the spread, and the sentence
    says so; ordinary noise is not trimmed (the band of five spread baselines is their whole range)."""
    bands = counters.NoiseBands()
    for tps in (10.0, 10.3, 4.0):                   # three: no outlier can be told from the rest
        band = bands.add("k", tps)
    assert band.width == pytest.approx(6.3 / 10.0) and not band.outliers
    band = bands.add("k", 9.8)                      # 4.0 was the busy one
    assert band.samples == 4 and band.outliers == 1 and band.width == pytest.approx(0.5 / 9.9)
    totals = SimpleNamespace(tokens_per_s=13.6, flops_ratio=1.8, users_max=1)
    said = counters.baseline_md("en", totals, 10.0, band=band)
    assert "faster than plain decoding" in said and "without the 1 far from the rest" in said, said
    spread = counters.NoiseBands()
    for tps in (9.0, 9.5, 10.0, 10.5, 11.0):        # noise, not an outlier: the whole range counts
        band = spread.add("k", tps)
    assert band.outliers == 0 and band.width == pytest.approx(2.0 / 10.0)


def test_after_the_baseline_the_timer_draws_the_runs_own_charts_again(local_app, monkeypatch):
    """While the plain baseline streams, the throughput and hardware charts are its own and say so; a tick
    that drew them could reach the page after the Run's last frame and leave them there (a teacher saw
    "plain decoding for comparison" under Done): the next tick draws the Run's charts, as the Run ended."""
    from specviz.ui.playground import OUTPUTS

    app = local_app
    _states(app, monkeypatch, ["ready"])
    _slow_steps(app, monkeypatch)
    tab, during = SimpleNamespace(session_hash="s2"), []
    label = app.choices[0].label
    for out in app.page.stream("the quick brown", label, 1, 4, "fixed", 8, 0, 64, "s2"):
        last = dict(zip(OUTPUTS, out))
        live = app.runs.get("s2")
        if live is not None and live.baseline and live.passes and not during:
            during = [f.layout.title.text for f in app.page.on_tick(label, tab)[:2]]
    assert during and all("for comparison" in title for title in during), during
    assert last["result"]["plain_tokens_per_s"]
    final = [last["chart_t"], last["chart_h"]]
    drawn = app.page.on_tick(label, tab)[:2]
    for fig, ended in zip(drawn, final):
        assert "for comparison" not in fig.layout.title.text
        assert fig.to_plotly_json()["data"] == ended.to_plotly_json()["data"]
    assert all(not hasattr(x, "layout") for x in app.page.on_tick(label, tab)[:2])     # drawn once
