"""The Lesson tab and the classroom helpers, through the API and in a real browser: every chapter's
experiment runs and renders, the lossless check, save and replay, deep links, English and Persian."""
import json
import re
import shutil
import time

import pytest
from apphelp import client, pair_label
from test_app import browser_page, needs_chromium, swipe

from specviz import lessons
from specviz.chapters import CHAPTERS as REGISTRY

# the registry the page reads: every chapter with an experiment
CHAPTERS = [c.key for c in REGISTRY if c.has_experiment]


@pytest.fixture(scope="module")
def api(classroom):
    _, url, _ = classroom
    c = client(url)
    return c, pair_label(c), url


def _file(value) -> str:
    return value["value"] if isinstance(value, dict) and "value" in value else (
        value.get("path") if isinstance(value, dict) else value)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_chapter_runs_and_concludes_from_measurements(api, chapter):
    c, label, _ = api
    job = c.submit(label, api_name=f"/lesson_{chapter}")
    note, fig, csv, result = job.result()
    assert result["done"] and result["chapter"] == chapter
    assert len(job.outputs()) >= 3                        # it streamed (running, points, conclusion)
    assert "measured on this machine" in note and "with the device held for it" in note
    assert result["others_share"] is None or 0 <= result["others_share"] <= 1
    assert not re.search(r"\{[a-z_]+(:[^}]*)?\}", note), note     # every placeholder was filled
    lines = open(_file(csv), encoding="utf-8").read().splitlines()
    assert len(lines) >= 2                                # the chart's data as CSV, with a header
    assert fig is not None


def test_a_chapter_says_how_long_its_last_run_here_took(api):
    """How long to expect, measured: once a chapter ran, its "running" line gives the seconds its last run
    on this server took (the queue's wait left out). Two students at once: both finish, one queued."""
    c, label, url = api
    jobs = [cl.submit(label, api_name="/lesson_race") for cl in (c, client(url))]
    assert all(job.result()[3]["done"] for job in jobs)
    job = c.submit(label, api_name="/lesson_race")
    job.result()
    first = job.outputs()[0][0]
    assert re.search(r"\(its last run here took about \d+ s\)", first), first


def test_lossless_check_after_a_greedy_run(api):
    c, label, _ = api
    out = c.predict("the quick brown", label, 2, 4, "fixed", 8, 0, 40, True, api_name="/generate")
    assert out[-1]["done"]
    msg = c.predict(api_name="/check_lossless")
    n = sum(len(o) for o in out[-1]["outputs"])                   # both rows, each against the target alone
    assert len(out[-1]["outputs"]) == 2 and msg.startswith(f"Identical: {n} of {n} tokens")
    # the status counts every row's tokens, and says so beside row 1's ("Done. 3 tokens." over 3 rows of 1)
    assert out[6] == f"Done. {out[-1]['tokens']} tokens over 2 rows: row 1 above, every row in the list below.", out[6]


def test_lossless_check_needs_greedy(api):
    c, label, _ = api
    c.predict("the quick brown", label, 1, 2, "fixed", 8, 0.8, 16, True, api_name="/generate")
    assert "temperature to 0" in c.predict(api_name="/check_lossless")


def test_saved_run_replays_the_same_tokens(api):
    c, label, url = api
    live = c.predict("a small draft model guesses and the", label, 2, 3, "fixed", 8, 0, 24, False,
                     api_name="/generate")
    tokens_live, save, result = live[0], live[-2], live[-1]
    path = _file(save)
    rec = json.loads(open(path, encoding="utf-8").read())
    assert rec["format"].startswith("specviz-recording") and rec["date"]
    from specviz.hardware.device import cpu_name
    assert rec["device"] == cpu_name()              # the CPU's model, as a replay names it ("AMD EPYC (2 cores)")
    assert rec["versions"]["torch"] and rec["steps"]
    from gradio_client import handle_file

    replay = c.predict(None, handle_file(path), api_name="/replay")
    assert replay[0] == tokens_live                      # the same coloured tokens, rebuilt from the file
    assert replay[-1]["outputs"] == result["outputs"] and replay[-1]["replay"]
    assert "· recorded on" in replay[6] and replay[6].count("Replay") == 1      # named a replay once
    assert replay[6].startswith(f"Replay ended: {result['tokens']} tokens, as recorded · ")     # it says it ended
    # what the recorded Run was asked: the page's own controls keep the reader's values
    assert "“a small draft model guesses and the”, batch 2, depth 3, up to 24 new tokens" in replay[6], replay[6]
    # the page now shows the recording: the check does not answer for the Run before it, until a new Run;
    # another student's check, meanwhile, still answers for their own Run
    other = client(url)
    other.predict("the quick brown", label, 1, 2, "fixed", 8, 0, 12, False, api_name="/generate")
    assert c.predict(api_name="/check_lossless").startswith("The page shows a recording")
    assert other.predict(api_name="/check_lossless").startswith("Identical")
    c.predict("a small draft model guesses and the", label, 1, 3, "fixed", 8, 0, 12, False, api_name="/generate")
    assert c.predict(api_name="/check_lossless").startswith("Identical")


def test_lossless_check_waits_for_a_run_still_going(api):
    """Check pressed mid-Run answered for the previous Run under the new Run's tokens."""
    c, label, url = api
    job = c.submit("the quick brown", label, 4, 6, "fixed", 8, 0, 512, False, api_name="/generate")
    deadline = time.time() + 60
    while not job.outputs() and time.time() < deadline:      # the Run has started streaming
        time.sleep(0.1)
    msg = c.predict(api_name="/check_lossless")
    done = job.done()
    job.cancel()
    c.predict(api_name="/stop")
    assert done or msg == "A Run is still going in this tab: check it once it is done.", msg


def test_bad_recording_is_a_sentence(api, tmp_path):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    c, _, _ = api
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(AppError, match="not a SpecViz recording"):
        c.predict(None, handle_file(str(bad)), api_name="/replay")
    with pytest.raises(AppError, match="Pick a recorded run"):
        c.predict(None, None, api_name="/replay")


@needs_chromium
def test_browser_a_new_run_or_replay_clears_the_lossless_verdict(api):
    """The verdict spoke of the run it checked: "Identical: 27 of 27" stayed under a later Run or replay."""
    _, _, url = api
    with browser_page(1000) as page:
        page.goto(url + "?tab=playground")
        page.wait_for_selector("#chart-throughput .js-plotly-plot", timeout=60000)
        page.locator("#max-new-tokens input[type=number]").fill("16")
        page.locator("#max-new-tokens input[type=number]").press("Enter")
        verdict = "document.querySelector('#lossless').innerText"
        for press in ("run", "replay"):
            page.locator("#run").click()
            page.wait_for_function("document.querySelector('#status').innerText.includes('Done')", timeout=120000)
            page.locator("#check-lossless").click()
            page.wait_for_function(f"{verdict}.includes('Identical')", timeout=60000)
            if press == "replay":
                page.locator("#replay-pick input").click()
                page.get_by_role("option").first.click()
            page.locator("#" + press).click()
            page.wait_for_function(f"{verdict}.trim() === ''", timeout=30000)
        page.wait_for_function("document.querySelector('#status').innerText.includes('Replay')", timeout=60000)
        page.locator("#check-lossless").click()
        page.wait_for_function(f"{verdict}.includes('shows a recording')", timeout=30000)


@needs_chromium
def test_browser_deep_link_and_persian(api, tmp_path):
    _, _, url = api
    link = url + "?tab=playground&prompt=memory%20bound&batch=3&depth=2&policy=adaptive&lang=fa"
    with browser_page(1300) as page:
        page.goto(link)
        page.wait_for_function("document.documentElement.getAttribute('dir') === 'rtl'", timeout=30000)
        assert page.locator("#prompt textarea").input_value() == "memory bound"
        assert page.locator("#batch-size input[type=number]").input_value() == "3"
        assert page.locator("#depth input[type=number]").input_value() == "2"
        assert page.locator("#policy input[value=adaptive]").is_checked()
        page.wait_for_function("document.querySelector('#run').innerText.includes('اجرا')", timeout=30000)
        # radio groups flow right to left (gradio writes dir="ltr" on each): the first choice at the right
        first, second = (page.locator("#policy label").nth(i).bounding_box() for i in (0, 1))
        assert first["x"] > second["x"], (first, second)
        assert page.evaluate("getComputedStyle(document.querySelector('#chapter')).direction") == "rtl"
        # labels are created in English (the API's names) and still follow the language switch
        fa_label = json.dumps(lessons.text("fa", "app.label_prompt"))
        page.wait_for_function(f"document.querySelector('#prompt').innerText.includes({fa_label})", timeout=30000)
        # gradio draws the upload box in the browser's locale (English here) before the page's: it is redone
        upload = "#replay-file [data-testid=upload-text]"
        drop = json.dumps(lessons.text("fa", "app.upload_drop"))
        page.wait_for_function(f"document.querySelector({upload!r}).innerText.includes({drop})", timeout=10000)
        assert "Click" not in page.locator(upload).inner_text()
        page.screenshot(path=str(tmp_path / "fa.png"), full_page=True)
        shutil.copy(tmp_path / "fa.png", "/tmp/specviz-playground-fa.png")
        # copy link gives the link to the current state
        page.locator("#copy-link").click()
        page.wait_for_function("document.querySelector('#link input').value.includes('tab=playground')",
                               timeout=10000)
        got = page.locator("#link input").input_value()
        assert "batch=3" in got and "depth=2" in got and "lang=fa" in got and "policy=adaptive" in got
        assert re.search(r"temperature=0(&|$)", got) and re.search(r"max_new=\d+", got) and "gpu=" not in got   # its own
        # switching back to English flips the direction and the labels
        page.locator("#lang label", has_text="English").click()
        page.wait_for_function("document.documentElement.getAttribute('dir') === 'ltr'", timeout=10000)
        page.wait_for_function("document.querySelector('#run').innerText.includes('Run')", timeout=10000)
        page.wait_for_function(f"document.querySelector({upload!r}).innerText.includes('Click to Upload')",
                               timeout=10000)
        first, second = (page.locator("#policy label").nth(i).bounding_box() for i in (0, 1))
        assert first["x"] < second["x"], (first, second)


@needs_chromium
def test_browser_walks_the_lesson(api, tmp_path):
    _, _, url = api
    with browser_page(1500) as page:
        page.goto(url)
        page.wait_for_selector("#chapter-intro", timeout=30000)
        texts = {}
        for chapter in CHAPTERS:
            page.locator(f"#next-{_previous(chapter)}").click()
            page.wait_for_selector(f"#chapter-{chapter}", state="visible", timeout=10000)
            # the chapter's download shows once it holds the run's data (pressed before, it did nothing)
            assert not page.locator(f"#csv-{chapter}").is_visible(), chapter
            page.locator(f"#{_button(chapter)}").click()
            page.wait_for_function(
                f"document.querySelector('#conclusion-{chapter}').innerText.includes('measured on this machine')",
                timeout=120000)
            page.wait_for_selector(f"#plot-{chapter} .js-plotly-plot", timeout=30000)
            if chapter == CHAPTERS[0]:
                with page.expect_download(timeout=30000) as got:
                    page.locator(f"#csv-{chapter}").click()
                assert got.value.suggested_filename.endswith(".csv"), got.value.suggested_filename
            texts[chapter] = page.locator(f"#conclusion-{chapter}").inner_text()
            if chapter == "race":
                page.screenshot(path=str(tmp_path / "lesson.png"), full_page=True)
                shutil.copy(tmp_path / "lesson.png", "/tmp/specviz-lesson.png")
        # every chapter concluded in the page, each conclusion its own, every placeholder filled
        assert len(set(texts.values())) == len(CHAPTERS), texts
        assert not any(re.search(r"\{[a-z_]+(:[^}]*)?\}", t) for t in texts.values()), texts
        # switching language redraws what is on screen: no English conclusion left on a Persian page
        page.locator("#lang label", has_text="فارسی").click()
        here = json.dumps(lessons.text("fa", "app.measured_here"))
        for chapter in reversed(CHAPTERS):              # the page shows one chapter at a time: walk back
            if chapter != CHAPTERS[-1]:
                page.locator(f"#prev-{CHAPTERS[CHAPTERS.index(chapter) + 1]}").click()
            page.wait_for_selector(f"#conclusion-{chapter}", state="visible", timeout=10000)
            page.wait_for_function(f"document.querySelector('#conclusion-{chapter}').innerText.includes({here})",
                                   timeout=20000)
            said = page.locator(f"#conclusion-{chapter}").inner_text()
            assert "measured on this machine" not in said
            # its values too: the frontier's class sizes listed the Persian way, not as English "1, 4, 16"
            assert chapter != "frontier" or ("1, 4, 16" not in said and "،" in said), said


@needs_chromium
def test_a_phone_scrolls_a_chart_in_its_box_not_the_page(api):
    """At 390 px a chart keeps the width its panels need and scrolls sideways inside its own box, under a
    hint that says so; the page itself never scrolls sideways. Persian too."""
    _, _, url = api
    with browser_page(844, width=390, touch=True) as page:
        for lang in ("en", "fa"):
            page.goto(url + f"?tab=lesson&chapter=sweep&lang={lang}")
            plot = "#plot-vllm-sweep"                      # the recorded vLLM sweep: drawn without a run
            page.wait_for_selector(f"{plot} .js-plotly-plot", state="visible", timeout=60000)
            drawn = page.evaluate(f"document.querySelector('{plot} .js-plotly-plot').getBoundingClientRect().width")
            box = page.evaluate(f"[document.querySelector('{plot}').scrollWidth, document.querySelector('{plot}').clientWidth]")
            assert drawn >= 640 and box[0] > box[1], (lang, drawn, box)
            assert page.evaluate("document.documentElement.scrollWidth") <= 390, lang
            # a swipe over the chart scrolls its box, and does not zoom the chart (gradio's block hid the
            # overflow, and plotly took the swipe as a zoom)
            axis = f"document.querySelector('{plot} .js-plotly-plot')._fullLayout.xaxis.range.join()"
            shown = page.evaluate(axis)
            page.locator(plot).scroll_into_view_if_needed()
            swipe(page, plot, -150, 0)
            assert page.evaluate(f"document.querySelector('{plot}').scrollLeft") > 50, lang
            assert page.evaluate(axis) == shown, lang
            # a chart cut at the screen's edge looked finished: a hint above it, in the reader's direction
            # (style.css's '.sv-rtl' rules apply: gradio scopes them, and the class is set inside its scope)
            hint = page.evaluate(f"(() => {{ const s = getComputedStyle(document.querySelector('{plot}'), '::before');"
                                 " return [s.content, s.direction]; })()")
            assert hint == [json.dumps(lessons.text(lang, "app.swipe_chart"), ensure_ascii=False),
                            "rtl" if lang == "fa" else "ltr"], hint


def _previous(chapter: str) -> str:
    order = ["intro", *CHAPTERS]
    return order[order.index(chapter) - 1]


def _button(chapter: str) -> str:
    return "run-" + chapter.replace("_", "-")


def test_shipped_recordings_replay_with_their_origin(api):
    import json

    from specviz.serve import recordings

    c, _, _ = api
    shipped = recordings.shipped()
    assert len(shipped) >= 2                      # a cheap draft that pays, an expensive one that does not
    for title, path in shipped.items():
        rec = recordings.load(path)
        out = c.predict(title, None, api_name="/replay")
        assert out[-1]["outputs"] == [rec.outputs[i] for i in sorted(rec.outputs)]
        assert f"recorded on {rec.device}" in out[6] and 'class="tok-' in out[0]
        # what a recording cannot say is said as such: no baseline, no peaks of its machine
        assert "A recording keeps the run, not plain decoding" in out[2] and "No plain-decoding" not in out[2]
        assert "regime: not known (a recording keeps no peaks" in out[2]
        # the hardware chart plays the recorded readings
        traces = json.loads(out[4]["plot"])["data"]
        busy = next(tr for tr in traces if "busy" in tr["name"])
        assert len([y for y in busy["y"] if y is not None]) >= 3, busy
        assert out[-1]["stopped"] is False


def test_stop_ends_a_replay(api, tmp_path):
    """A replay is the tab's live run while it plays: Stop ends it, and the result says so."""
    import json

    from gradio_client import handle_file

    from specviz.serve import recordings

    c, _, _ = api
    rec = json.loads(recordings.load(next(iter(recordings.shipped().values()))).to_json())
    rec["steps"] = [[i * 1.0, rec["steps"][1][1], rec["steps"][1][2]] for i in range(30)]   # 30 s at its pace
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(rec))
    job = c.submit(None, handle_file(str(slow)), api_name="/replay")
    for seen, _ in enumerate(job):
        if seen == 2:
            c.predict(api_name="/stop")
    final = job.outputs()[-1]
    assert final[-1]["stopped"] is True and final[6].startswith("Replay stopped"), final[6]


def test_a_persian_conclusion_names_the_machines_cores_in_persian():
    """A Persian page ended each chapter with "(cpu: 2 cores)"."""
    from specviz.lessons import machine
    from specviz.ui.lesson import conclusion_md

    assert "هسته" in machine("fa", "cpu: 2 cores") and "cores" not in machine("fa", "cpu: 2 cores")
    assert machine("fa", "cuda: NVIDIA H200") == "cuda: NVIDIA H200"
    result = {"chapter": "race", "conclusions": [], "values": {}, "device": "cpu: 2 cores", "settings": {}}
    assert "cores" not in conclusion_md("fa", result) and "2 cores" in conclusion_md("en", result)


def test_only_a_device_field_has_its_cores_named_in_persian():
    """A reader's own words are echoed as typed: a model typed as "llama 8 cores" is not "llama 8 هسته"."""
    from specviz import lessons

    said = lessons.Said("errors.bad_model_ref", ref="llama 8 cores", alias="x")
    assert "llama 8 cores" in lessons.say("fa", said)
    assert "هسته" in lessons.say("fa", lessons.Said("whatif.profile_label", target="t", device="AMD EPYC (2 cores)"))
    assert lessons.machine("fa", "x (2 cores") == "x (2 cores"          # an unclosed bracket: as it is
    # a heading's "AMD EPYC, 2 cores": a Persian comma outside the Latin name (it read "(2 هسته AMD EPYC,)")
    assert lessons.machine("fa", "AMD EPYC, 2 cores") == "\u2066AMD EPYC\u2069، 2 هسته"


def test_a_lossless_check_overtaken_by_a_run_gives_no_verdict(monkeypatch):
    """Check pressed, then Run (or Replay) while it decoded: its "Identical: 300 of 300" sat under the new
    Run's 36 tokens, and under a sampled Run it never checked. It says it gave no verdict, and why."""
    from types import SimpleNamespace

    from specviz.engine.divergence import DivergenceReport
    from specviz.ui import runs

    store = runs.RunStore()
    req = SimpleNamespace(temperature=0)
    store._last["s1"] = runs.FinishedRun(None, "p", req, {"prompt_ids": [[1, 2]], "outputs": [[3, 4]]}, "", "")
    target = SimpleNamespace(model=None, device="cpu", eos_ids=())
    armed = set()
    app = SimpleNamespace(runs=SimpleNamespace(get=lambda s: None, armed=lambda s: s in armed), runner=SimpleNamespace(zero_gpu=False),
                          load=lambda choice, lang: SimpleNamespace(target=target, tokenizer=SimpleNamespace(decode=str)))
    press = {"during": None}

    def check(*args):
        if press["during"]:
            press["during"]()
        return DivergenceReport(rows=1, tokens=2, divergences=())
    monkeypatch.setattr(runs, "check_against_target", check)
    assert store.check_lossless("s1", app, "en")("en").startswith("Identical: 2 of 2")
    for pressed in (lambda: store.pressed("s1"), lambda: store.replayed("s1")):
        press["during"] = pressed
        assert store.check_lossless("s1", app, "en") is None
        store._replayed.clear()
    press["during"] = lambda: store.pressed("another session")     # another student's Run is not this page's
    assert store.check_lossless("s1", app, "en")("en").startswith("Identical")
    # Run pressed first, Check while that Run loads or queues: the check waits for it, as for a Run going
    armed.add("s1")
    assert store.check_lossless("s1", app, "en")("en") == lessons.text("en", "playground.lossless_running")


def test_an_experiment_says_when_other_programs_took_the_cpu_meanwhile():
    """"measured with the device to itself" vouched for a chapter whose plain passes stalled while another
    program ran: the device is held against the app's own work only. Other programs' share of the CPU time
    is measured, and from a quarter of it the conclusion says the figures may be off."""
    import os
    import subprocess
    import sys

    from specviz.hardware.device import OthersMeter
    from specviz.ui.lesson import conclusion_md

    meter = OthersMeter()
    # another program spinning one core for a second and a half: 1 ÷ CPUs of the time, counted at 0.4 ÷ CPUs
    subprocess.run([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"], check=True)
    share = meter.share()
    assert share is not None and share >= 0.4 / os.cpu_count(), share
    result = {"chapter": "race", "conclusions": [], "values": {}, "device": "cpu: 2 cores", "settings": {}}
    for lang in ("en", "fa"):
        assert lessons.text(lang, "app.measured_alone") in conclusion_md(lang, result)
        busy = conclusion_md(lang, {**result, "others_share": 0.4})
        assert lessons.text(lang, "app.measured_alone") not in busy and "40%" in busy, busy
