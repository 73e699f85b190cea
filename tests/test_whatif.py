"""The what-if model (roofline grids, crossover), recorded profiles, and the What-if tab in the app."""
import json
import re
import shutil
from contextlib import contextmanager
from dataclasses import replace

import pytest

from specviz import lessons
from specviz.hardware import costmodel, presets
from specviz.hardware import roofline as rf
from specviz.hardware.profiles import PROFILES_DIR, load_profiles


def test_whatif_rows_hand_checked():
    # a free draft (n-gram), α = 0.5, depth 1: E[tokens] = 1.5 per pass, verify = a 2-token pass
    h200, m = presets.GPUS["H200"], presets.MODELS["SmolLM2-1.7B"]
    rows = costmodel.whatif_rows(m, None, h200.bandwidth, h200.flops, 0.5, 256, [1], [0, 1])
    t1 = rf.step_time(rf.pass_cost(m, 1, 1, 256), h200.bandwidth, h200.flops)
    t2 = rf.step_time(rf.pass_cost(m, 1, 2, 256), h200.bandwidth, h200.flops)
    assert rows[0]["tokens_per_s"] == pytest.approx(1 / t1)
    assert rows[1]["tokens_per_s"] == pytest.approx(1.5 / t2)
    assert rows[1]["flops_ratio"] == pytest.approx(2 / 1.5)      # 2 tokens checked, 1.5 kept


def test_speculation_pays_at_batch_1_and_stops_at_large_batch():
    h100, t, d = presets.GPUS["H100 SXM"], presets.MODELS["Qwen2.5-7B"], presets.MODELS["Qwen2.5-0.5B"]
    batches, depths = [1, 4, 16, 64, 256, 1024, 4096], [0, 1, 2, 4, 8]
    rows = costmodel.whatif_rows(t, d, h100.bandwidth, h100.flops, 0.7, 128, batches, depths)
    best = costmodel.best_depths(rows)
    assert best[1] >= 2                                  # memory-bound: deep drafts are nearly free
    assert best[4096] == 0                               # compute-bound: speculation only costs
    assert list(best.values()) == sorted(best.values(), reverse=True)   # deeper at small batch
    cross = costmodel.crossover_from_rows(rows)
    assert cross is not None and 64 < cross <= 4096
    # below the crossover the winner spends more FLOPs than plain decoding and still finishes sooner
    r1 = next(r for r in rows if r["batch_size"] == 1 and r["depth"] == best[1])
    plain = next(r for r in rows if r["batch_size"] == 1 and r["depth"] == 0)
    assert r1["flops_ratio"] > 1 and r1["tokens_per_s"] > plain["tokens_per_s"]


def test_crossover_from_rows_on_synthetic_grids():
    def grid(best):
        return [{"batch_size": b, "depth": k, "tokens_per_s": 2.0 if k == d else 1.0}
                for b, d in best.items() for k in (0, 2)]
    assert costmodel.crossover_from_rows(grid({1: 2, 2: 2, 4: 0, 8: 0})) == 4
    assert costmodel.crossover_from_rows(grid({1: 2, 2: 2})) is None
    assert costmodel.crossover_from_rows(grid({1: 0, 2: 2, 4: 0})) == 4      # must stay 0 from there on


def test_recorded_profiles_load_with_a_prediction(tmp_path):
    from specviz.ui import whatif_measured

    profiles = load_profiles()
    assert profiles, f"no profiles in {PROFILES_DIR}"
    for p in profiles:
        assert len(p.tokens_per_pass) == len(p.latency_s) >= 4 and all(t > 0 for t in p.latency_s)
        assert p.spec is not None and p.predicted_knee > 0 and p.measured_knee > 0
        # a first-time reader took a shipped profile for this machine's own measurement: it says it is not
        md, _ = whatif_measured.profile_view([p], p.label)
        assert f"Recorded on {p.recorded} and shipped with the app" in md and "not this one" in md
    # a broken file is skipped, not fatal
    shutil.copy(next(PROFILES_DIR.glob("*.json")), tmp_path / "good.json")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "partial.json").write_text(json.dumps({"target": "x"}))
    assert [p.name for p in load_profiles(tmp_path)] == ["good"]


def test_whatif_compute_labels_estimates_and_rejects_bad_input():
    import gradio as gr

    from specviz.ui import whatif_views

    class NoPeaks:
        peaks = None

    md, lat, cross = whatif_views.compute(NoPeaks(), "H200", "Qwen2.5-7B", "Qwen2.5-0.5B", 0.7, 1024, 0)
    assert "Estimates" in md and "estimate" in lat.layout.title.text and "estimate" in cross.layout.title.text
    assert "| 1 |" in md and "knee" in md
    with pytest.raises(gr.Error, match="not calibrated"):
        whatif_views.compute(NoPeaks(), whatif_views.THIS_MACHINE, "Qwen2.5-7B", whatif_views.NGRAM, 0.7, 1024, 0)
    with pytest.raises(gr.Error, match="Out of range"):
        whatif_views.compute(NoPeaks(), "H200", "Qwen2.5-7B", whatif_views.NGRAM, 1.5, 1024, 0)
    with pytest.raises(gr.Error, match="Unknown GPU"):
        whatif_views.compute(NoPeaks(), "GTX 480", "Qwen2.5-7B", whatif_views.NGRAM, 0.5, 1024, 0)


class NoPeaks:
    peaks = None


def test_whatif_tab_states_its_error_against_published_points():
    from specviz.ui import whatif_views

    vals = dict(whatif_views.DEFAULTS)
    md, lat, cross = whatif_views.compute(NoPeaks(), *vals.values())
    assert vals["gpu"] == "H100 SXM" and vals["draft"] == "EAGLE:Llama-3.1-8B"
    assert "calibrated model" in md and "published measurement" in md and "EAGLE-3 paper" in md
    # every model's worst error on the SGLang series, the stack-fitted one with its held-out figure
    m = re.search(r"worst error over batch 2–64 is \*\*(\d+) %\*\* for the calibrated \+ SGLang bookkeeping "
                  r"\(fitted\) model — SGLang v0.4.4 spends about (\d+) µs per sequence .*?this one's error is "
                  r"(\d+) %\) — (\d+) % for the calibrated \(vLLM\) model and (\d+) % for the ideal roofline", md)
    assert m, md
    fitted, row_us, held, alone, ideal = (int(g) for g in m.groups())
    assert fitted < alone < ideal and fitted <= held and 0 < row_us < 1000
    names = [t.name for t in lat.data]
    assert "calibrated estimate" in names and "roofline estimate" in names
    fig = whatif_views.speedup_view(NoPeaks(), *vals.values())
    markers = [t for t in fig.data if t.mode == "markers"]
    assert markers and all("published measurement" in t.name for t in markers)
    assert {"k=3, calibrated (vLLM) estimate", "k=3, calibrated + SGLang bookkeeping (fitted) estimate",
            "k=3, ideal estimate"} <= {t.name.replace("<br>", " ") for t in fig.data}   # lines a phone shows
    eagle = next(t for t in markers if "EAGLE on SGLang" in t.name)
    assert list(eagle.y)[:2] == [1.40, 1.38]
    # no published setup: the figure has estimates only, and the text says which setups have points
    md2, *_ = whatif_views.compute(NoPeaks(), "H200", "Qwen2.5-7B", "Qwen2.5-0.5B", 0.7, 1024, 0)
    assert "No published measurement matches" in md2 and "H100 SXM + Llama-3.1-8B" in md2
    fig2 = whatif_views.speedup_view(NoPeaks(), "H200", "Qwen2.5-7B", "Qwen2.5-0.5B", 0.7, 1024, 0)
    assert not [t for t in fig2.data if t.mode == "markers"]


def test_whatif_models_custom_gpu_and_eagle_heads():
    import gradio as gr

    from specviz.ui import whatif_views

    args = ["Llama-3.1-8B", "EAGLE:Llama-3.1-8B", 0.7, 800, 0]
    ideal, *_ = whatif_views.compute(NoPeaks(), "H100 SXM", *args, "ideal")
    assert "ideal roofline model" in ideal and "Calibrated: a pass" not in ideal
    def table(md):
        return [line for line in md.splitlines() if line.startswith("| ")]

    md_custom, *_ = whatif_views.compute(NoPeaks(), whatif_views.CUSTOM_GPU, *args, "calibrated", 3.35, 989)
    md_h100, *_ = whatif_views.compute(NoPeaks(), "H100 SXM", *args, "calibrated")
    md_fast, *_ = whatif_views.compute(NoPeaks(), whatif_views.CUSTOM_GPU, *args, "calibrated", 8, 989)
    assert "custom GPU (3.35 TB/s, 989 TFLOP/s)" in md_custom
    assert table(md_custom) == table(md_h100) != table(md_fast)        # a GPU given by its numbers
    with pytest.raises(gr.Error, match="custom GPU"):
        whatif_views.compute(NoPeaks(), whatif_views.CUSTOM_GPU, *args, "calibrated", 0, 989)
    with pytest.raises(gr.Error, match="cost model"):
        whatif_views.compute(NoPeaks(), "H200", *args, "magic")
    with pytest.raises(gr.Error, match="reads its own target"):
        whatif_views.compute(NoPeaks(), "H200", "Llama-3.1-70B", "EAGLE:Llama-3.1-8B", 0.7, 800, 0)
    assert whatif_views.remap_draft("EAGLE-3:Llama-3.1-8B", "Qwen2.5-7B") == "EAGLE-3:Qwen2.5-7B"
    assert whatif_views.remap_draft(whatif_views.NGRAM, "Qwen2.5-7B") == whatif_views.NGRAM
    assert "EAGLE:Qwen2.5-7B" in whatif_views.draft_choices("Qwen2.5-7B")
    assert "EAGLE:Llama-3.1-8B" not in whatif_views.draft_choices("Qwen2.5-7B")


def test_this_machine_is_calibrated_from_its_recorded_profile():
    from specviz.hardware.device import Peaks
    from specviz.ui import whatif_views

    class Cpu:
        peaks = Peaks("cpu", 23e9, 0.24e12, "float32")

    md, _, cross = whatif_views.compute(Cpu(), whatif_views.THIS_MACHINE, "SmolLM2-135M", whatif_views.NGRAM, 0.6, 256, 0)
    # the profile recorded on the fast path, which the app serves where it measured faster
    assert "measured** by calibration" in md and "fitted to cpu-2core-smollm2-135m-fast.json" in md
    # its verdict names the profile it ran on, not vLLM's fit ("By the calibrated (vLLM) estimate")
    assert "By the recorded-profile estimate" in md and "calibrated (vLLM)" not in md
    assert "(recorded-profile estimate)" in cross.layout.title.text
    assert "whatif." not in md and "Estimates from this machine's recorded profile" in md     # no raw key
    for model in whatif_views.KINDS:
        fa, *_ = whatif_views.compute(Cpu(), whatif_views.THIS_MACHINE, "SmolLM2-135M", whatif_views.NGRAM, 0.6, 256,
                                      0, model, lang="fa")
        assert "whatif." not in fa, fa[:200]

    class Gpu:
        peaks = Peaks("cuda", 4e12, 900e12, "bfloat16")

    md, *_ = whatif_views.compute(Gpu(), whatif_views.THIS_MACHINE, "SmolLM2-135M", whatif_views.NGRAM, 0.6, 256, 0)
    assert "no recorded profile for this device" in md


@pytest.mark.parametrize("slot", range(9))
@pytest.mark.parametrize("custom", [False, True], ids=["preset-gpu", "custom-gpu"])
def test_whatif_bad_api_values_become_one_message(slot, custom):
    """A bad value is refused with the one human message. The custom-GPU numbers (slots 7, 8) must be
    numbers always; their range (nan, inf, -1) is checked only when the GPU is the custom one, and ignored
    (the view works) otherwise."""
    import gradio as gr

    from specviz.ui import whatif_views

    base = list(whatif_views.DEFAULTS.values())
    if custom:
        base[0] = whatif_views.CUSTOM_GPU
    if slot == 0 and custom:
        return                           # slot 0 is the GPU itself: the preset-gpu case covers it
    for bad in (None, "abc", float("nan"), float("inf"), -1, [], {}):
        args = list(base)
        args[slot] = bad
        ignored = slot in (7, 8) and not custom and isinstance(bad, (int, float))
        for view in (whatif_views.compute, whatif_views.speedup_view):
            if ignored:
                view(NoPeaks(), *args)       # must not raise: the numbers play no part for a preset GPU
                continue
            with pytest.raises(gr.Error) as info:
                view(NoPeaks(), *args)
            msg = str(info.value.message if hasattr(info.value, "message") else info.value)
            assert msg and "Traceback" not in msg and len(msg) < 400, (slot, bad, msg)


# --- the tab in Persian: every [whatif] text, through the builders and handlers the page uses -------------

ARABIC = re.compile(r"[\u0600-\u06FF]")
UNFILLED = re.compile(r"\{[A-Za-z_]\w*(?:![rsa])?(?::[^{}]*)?\}")     # a {placeholder} nobody filled


def _flat_keys(table: dict, prefix: str) -> set[str]:
    keys = set()
    for k, v in table.items():
        keys |= _flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
    return keys


def _figure_texts(fig) -> tuple[str, ...]:
    """The title (a sentence, so Persian), then axis titles and legend names (some stay Latin: k=2, batch size)."""
    return (fig.layout.title.text, fig.layout.xaxis.title.text, fig.layout.yaxis.title.text,
            *[t.name for t in fig.data])


def _fake_app():
    from types import SimpleNamespace

    from specviz.ui.i18n import Translations

    return SimpleNamespace(peaks=None, tr=Translations(), choices=[SimpleNamespace(label="tiny → tiny")],
                           choice=lambda label, lang="en": SimpleNamespace(label=label))


def _handler(blocks, name: str):
    """A handler of the built tab, by api name (or function name for the private ones)."""
    return next(f.fn for f in blocks.fns.values() if name in (f.api_name, f.name))


def test_whatif_every_key_formats_in_persian(monkeypatch):
    import gradio as gr

    from specviz import lessons
    from specviz.hardware.device import Peaks
    from specviz.hardware.presets import MODELS
    from specviz.serve import runner
    from specviz.ui import whatif, whatif_measured, whatif_views

    used = set()
    template = lessons.template

    def recording(lang, key):
        used.add(key)
        return template(lang, key)
    monkeypatch.setattr(lessons, "template", recording)
    generated, shown = [], []       # generated: whole Persian sentences; shown: every string a student reads

    # the page: labels, intros, buttons and choices registered with the language switch
    app = _fake_app()
    with gr.Blocks() as blocks:
        _, wiring = whatif.build(app)
    for upd in app.tr.updates("fa"):
        shown += [v for k, v in upd.items() if k in ("label", "info", "value") and isinstance(v, str)]
        shown += [label for label, _ in upd.get("choices") or []]
    # handlers find the session's language; an API caller without one gets English
    app.tr.remember("fa-tab", "fa")
    fa, en = type("R", (), {"session_hash": "fa-tab"})(), type("R", (), {"session_hash": "api"})()
    vals = list(whatif_views.DEFAULTS.values())
    md, lat, cross = _handler(blocks, "whatif")(*vals, request=fa)
    generated += [md, _figure_texts(lat), _figure_texts(cross)]
    assert not ARABIC.search(_handler(blocks, "whatif")(*vals, request=en)[0])
    generated.append(_figure_texts(_handler(blocks, "whatif_speedup")(*vals, request=fa)))
    # the language switch re-renders the summary and figures for the knobs as they stand
    md, *figs = wiring.relabel[0]("fa", *vals)[:4]
    generated += [md, *(_figure_texts(f) for f in figs)]
    # every variant of the summary, the published comparison and the figures
    tiny_cpu = type("A", (), {"peaks": Peaks("cpu", 23e9, 0.24e12, "float32")})()
    tiny_gpu = type("A", (), {"peaks": Peaks("cuda", 4e12, 900e12, "bfloat16")})()
    for a, args in [(app, ["H200", "Qwen2.5-7B", "Qwen2.5-0.5B", 0.7, 1024, 0]),
                    (app, ["H200", "Qwen3.5-27B (article)", whatif_views.NGRAM, 0.7, 1024, 0]),      # recorded there
                    (app, ["H100 SXM", "Llama-3.1-8B", "EAGLE-3:Llama-3.1-8B", 0.8, 800, 0, "ideal"]),
                    (app, [whatif_views.CUSTOM_GPU, "Llama-3.1-8B", whatif_views.NGRAM, 0.9, 800, 0, "calibrated", 2, 400]),
                    (tiny_cpu, [whatif_views.THIS_MACHINE, "SmolLM2-135M", whatif_views.NGRAM, 0.6, 256, 0]),
                    (tiny_gpu, [whatif_views.THIS_MACHINE, "SmolLM2-135M", whatif_views.NGRAM, 0.6, 256, 0]),
                    (app, ["H100 SXM", "Llama-3.1-8B", "EAGLE:Llama-3.1-8B", 0.71, 800, 0, whatif_views.SGLANG]),
                    (tiny_cpu, [whatif_views.THIS_MACHINE, "SmolLM2-135M", whatif_views.NGRAM, 0.6, 256, 0, whatif_views.SGLANG]),
                    (app, ["T4", "Llama-3.1-8B", "EAGLE:Llama-3.1-8B", 0.7, 800, 0]),        # does not fit
                    (app, ["L4", "Llama-3.1-8B", whatif_views.NGRAM, 0.7, 800, 0]),          # fits 70-odd rows
                    (app, ["H100 SXM", "SmolLM2-135M", "Llama-3.1-70B", 0.7, 1024, 0]),     # a draft never pays
                    (app, ["H100 SXM", "Llama-3.1-70B", "SmolLM2-1.7B", 0.0, 1024, 0]),
                    (app, ["H100 SXM", "Llama-3.1-8B", whatif_views.NGRAM, 0.0, 1024, 0])]:
        md, lat, cross = whatif_views.compute(a, *args, lang="fa")
        generated += [md, _figure_texts(lat), _figure_texts(cross),
                      _figure_texts(whatif_views.speedup_view(a, *args, lang="fa"))]
    profiles = load_profiles()
    # a GPU preset with a profile recorded on that GPU: the serving stack with the profile's rates
    from specviz.hardware.presets import GPUS
    from specviz.hardware.profiles import gpu_calibration
    h100 = replace(profiles[0], device="cuda: NVIDIA H100 80GB HBM3")
    cal = gpu_calibration(GPUS["H100 SXM"], [h100])
    assert "rates from" in cal.name and "achieved rates" in cal.source          # the English, for the CLI
    generated += [lessons.say("fa", cal.name), lessons.say("fa", cal.source)]
    # a calibration that measured the matrix-multiply peak below what the passes reached: a fit over 100 %
    low_peak = replace(profiles[0], flops=profiles[0].flops / 4)
    for prof in profiles + [replace(profiles[0], spec=None), replace(profiles[0], recorded=""), low_peak]:
        md, fig = whatif_measured.profile_view([prof], prof.label, lang="fa")
        generated += [md, _figure_texts(fig)]
    # a series measured on the base stack (no bookkeeping fitted), and a stack with a single series
    from specviz.hardware.profiles import BASE_STACK, load_published
    eagle, eagle3 = (next(x for x in load_published() if x.id == i)
                     for i in ("eagle3-table4-eagle", "eagle3-table4-eagle3"))
    monkeypatch.setattr(whatif_views, "load_published", lambda: [replace(eagle, stack=BASE_STACK), eagle3])
    for draft in ("EAGLE:Llama-3.1-8B", "EAGLE-3:Llama-3.1-8B"):
        generated.append(whatif_views.compute(app, "H100 SXM", "Llama-3.1-8B", draft, 0.7, 800, 0, lang="fa")[0])
    monkeypatch.setattr(whatif_views, "load_published", lambda: [])
    generated.append(whatif_views.published_md(None, "H200", "x", "y", 0.7, "calibrated", lang="fa"))
    # the knee measured from the page: queue, progress, result (with and without peaks, overhead-bound)
    spec = MODELS["SmolLM2-135M"]
    slow = runner.KneeUpdate([1, 2, 4, 8], [0.05, 0.05, 0.051, 0.06], "cpu: 2 cores", spec,
                             Peaks("cpu", 23e9, 0.24e12, "float32"), done=True)
    app.runner = type("R", (), {"knee": lambda self, choice, context, peaks: iter([runner.Waiting(2), slow])})()
    for out in _handler(blocks, "measure_knee")("tiny → tiny", request=fa):
        generated += [o for o in out if isinstance(o, str)]
    for upd in (replace(slow, done=False), replace(slow, peaks=None)):
        md, fig = whatif_measured.knee_view(upd, lang="fa")
        generated += [md, _figure_texts(fig)]
    # the errors a student can meet
    for call in (lambda: whatif_views.compute(app, whatif_views.THIS_MACHINE, *vals[1:], lang="fa"),
                 lambda: whatif_views.compute(app, "H200", "Qwen2.5-7B", whatif_views.NGRAM, "abc", 1024, 0, lang="fa"),
                 lambda: whatif_views.compute(app, "H200", "Qwen2.5-7B", whatif_views.NGRAM, 1.5, 1024, 0, lang="fa"),
                 lambda: whatif_views.compute(app, "H200", "Qwen2.5-7B", whatif_views.NGRAM, None, 1024, 0, lang="fa"),
                 lambda: _handler(blocks, "whatif")("GTX 480", *vals[1:], request=fa),
                 lambda: whatif_views.compute(app, whatif_views.CUSTOM_GPU, *vals[1:7], 0, 989, lang="fa"),
                 lambda: whatif_views.compute(app, whatif_views.CUSTOM_GPU, *vals[1:7], 3.35, 1e9, lang="fa"),
                 lambda: whatif_views.compute(app, "GTX 480", *vals[1:], lang="fa"),
                 lambda: whatif_views.compute(app, "H200", "GPT-9", whatif_views.NGRAM, 0.5, 1024, 0, lang="fa"),
                 lambda: whatif_views.compute(app, "H200", *vals[1:6], "magic", lang="fa"),
                 lambda: whatif_measured.profile_view(profiles, "nope", lang="fa")):
        with pytest.raises(gr.Error) as err:
            call()
        generated.append(str(err.value))
    monkeypatch.setattr(whatif, "load_profiles", lambda: [])         # a checkout without recorded profiles
    monkeypatch.setattr(whatif, "recorded_curves", lambda: [])
    bare = _fake_app()
    with gr.Blocks():
        whatif.build(bare)
    shown += [u.get("value") for u in bare.tr.updates("fa") if isinstance(u.get("value"), str)]

    figures = [t for t in generated if isinstance(t, tuple)]
    generated = [t for t in generated if isinstance(t, str)] + [f[0] for f in figures]
    shown += [t for f in figures for t in f[1:]]
    for text in generated:
        assert ARABIC.search(text) and not UNFILLED.search(text), text
    for text in shown:
        assert text.strip() and not UNFILLED.search(text), text
    assert lessons.text("fa", "whatif.intro") in shown and lessons.text("fa", "whatif.no_profiles") in shown
    missing = _flat_keys(lessons.load("en")["whatif"], "whatif.") - used
    assert not missing, f"[whatif] keys no builder used: {sorted(missing)}"


def test_whatif_english_words_match_the_data_they_name():
    from specviz import lessons
    from specviz.hardware.profiles import PUBLISHED_LABEL
    from specviz.ui import whatif_views

    # the API values stay English; the English labels say the same, so English pages do not change
    assert [label for label, _ in whatif_views.gpu_options("en")][-2:] == [whatif_views.THIS_MACHINE, whatif_views.CUSTOM_GPU]
    assert (whatif_views.NGRAM, whatif_views.NGRAM) in whatif_views.draft_options("Qwen2.5-7B", "en")
    assert [v for _, v in whatif_views.draft_options("Qwen2.5-7B", "fa")] == whatif_views.draft_choices("Qwen2.5-7B")
    assert lessons.text("en", "whatif.published_label") == PUBLISHED_LABEL
    assert lessons.text("en", "whatif.ideal_note") == costmodel.IDEAL.source


# --- the tab in the running app (API and browser) ------------------------------------------------------

@pytest.fixture(scope="module")
def whatif_app(tiny_paths, tmp_path_factory):
    from apphelp import start_app, stop_app

    proc, url = start_app(tiny_paths["target"], "layerskip:1-2", tmp_path_factory.mktemp("whatif") / "app.log")
    yield url
    stop_app(proc)


def test_whatif_api_with_new_and_old_arguments(whatif_app):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    c = Client(whatif_app, verbose=False)
    md, *_ = c.predict("H100 SXM", "Qwen2.5-7B", "Qwen2.5-0.5B", 0.8, 1024, 0, api_name="/whatif")  # old 6
    assert "calibrated model" in md
    md, *_ = c.predict("H100 SXM", "Llama-3.1-8B", "EAGLE-3:Llama-3.1-8B", 0.8, 800, 0, "ideal", api_name="/whatif")
    assert "ideal roofline model" in md and "EAGLE-3 on SGLang" in md
    md, *_ = c.predict(CUSTOM, "Llama-3.1-8B", "n-gram lookup (no draft model)", 0.8, 800, 0, "calibrated", 2.0,
                       400.0, api_name="/whatif")
    assert "custom GPU (2 TB/s, 400 TFLOP/s)" in md
    plot = c.predict("H100 SXM", "Llama-3.1-8B", "EAGLE:Llama-3.1-8B", 0.7, 800, 0, api_name="/whatif_speedup")
    assert "published measurement" in json.dumps(plot)
    with pytest.raises(AppError, match="reads its own target|not in the list of choices|one of the listed choices"):
        c.predict("H100 SXM", "Llama-3.1-70B", "EAGLE:Llama-3.1-8B", 0.7, 800, 0, api_name="/whatif")


def test_whatif_api_answers_in_english_by_default(whatif_app):
    from gradio_client import Client

    md, *_ = Client(whatif_app, verbose=False).predict(*list(DEFAULTS_FOR_API), api_name="/whatif")
    assert "**Estimates from the calibrated model** (not measurements)" in md and "| batch | best depth k |" in md
    assert "published measurement" in md and not ARABIC.search(md)


DEFAULTS_FOR_API = ("H100 SXM", "Llama-3.1-8B", "EAGLE:Llama-3.1-8B", 0.7, 800, 0, "calibrated", 3.35, 989.0)
CUSTOM = "Custom GPU (bandwidth and FLOP/s below)"


@contextmanager
def _page(width: int = 1400, height: int = 1600):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def _pick(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


TOAST_RECORDER = """() => { window.__toasts = [];
  new MutationObserver(() => { for (const el of document.querySelectorAll('[data-testid=toast-body]')) {
    if (!window.__toasts.includes(el.innerText)) { window.__toasts.push(el.innerText); } } })
  .observe(document, {subtree: true, childList: true, characterData: true}); }"""


def _record_toasts(page) -> None:
    """Every toast the page shows from its start, kept after it fades (gradio's vanish after 10 s)."""
    page.add_init_script(f"({TOAST_RECORDER})()")


def _toasts_seen(page) -> list:
    return page.evaluate("window.__toasts || []")


def _summary_has(page, text: str) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"document.querySelector('#whatif-summary').innerText.includes({text!r})",
                               timeout=30000)
    except PlaywrightTimeout:        # say what the summary showed instead
        shown = page.locator("#whatif-summary").inner_text()[:300]
        raise AssertionError(f"summary never showed {text!r}; it shows: {shown!r}") from None


def test_browser_whatif_calibrated_published_and_custom(whatif_app):
    with _page() as page:
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(whatif_app)
        page.get_by_role("tab", name=re.compile("What if")).click()
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        assert "published measurement" in page.locator("#whatif-speedup").inner_text()
        _summary_has(page, "calibrated model")
        page.screenshot(path="/tmp/specviz-whatif-calibrated.png", full_page=True)
        page.locator("#whatif-model").get_by_label("ideal").check()
        _summary_has(page, "ideal roofline model")
        # a new target takes its own EAGLE head along, without an error
        _pick(page, "whatif-target", "Llama-3.1-70B")
        page.wait_for_function("document.querySelector('#whatif-draft input').value === 'EAGLE:Llama-3.1-70B'",
                               timeout=30000)
        _summary_has(page, "Llama-3.1-70B")
        # the two boxes count only for the custom GPU: a preset's are not editable (typing there did nothing)
        assert page.locator("#whatif-bandwidth input").is_disabled() and page.locator("#whatif-flops input").is_disabled()
        _pick(page, "whatif-gpu", CUSTOM)
        page.wait_for_function("!document.querySelector('#whatif-bandwidth input').disabled", timeout=10000)
        page.locator("#whatif-bandwidth input").fill("8")
        page.locator("#whatif-bandwidth input").press("Enter")
        _summary_has(page, "custom GPU (8 TB/s")
        # the language switch re-renders the summary for the knobs as they stand, and later changes follow it
        page.locator("#lang").get_by_label("فارسی").check()
        _summary_has(page, "تخمین‌های مدل roofline")
        _summary_has(page, "custom GPU (8 TB/s")
        page.locator("#whatif-model").get_by_label("کالیبره‌شده (vLLM)").check()
        _summary_has(page, "تخمین‌های مدل کالیبره‌شده")
        assert not page.locator(".toast-body").count() and not errors, (page.locator(".toast-body").all_inner_texts(), errors)
        # the CSV's box shows once it holds the file (an empty box beside the button read as an upload)
        assert not page.locator("#whatif-csv-file").is_visible()
        page.locator("#whatif-csv").click()
        page.wait_for_function("(document.querySelector('#whatif-csv-file') || {innerText: ''}).innerText.includes('.csv')",
                               timeout=20000)


def test_whatif_chart_data_downloads_as_csv(whatif_app):
    from gradio_client import Client

    c = Client(whatif_app, verbose=False)
    path = c.predict("H100 SXM", "Llama-3.1-8B", "EAGLE:Llama-3.1-8B", 0.7, 800, 0, "calibrated", 3.35, 989,
                     api_name="/whatif_csv")
    text = open(path, encoding="utf-8").read()
    assert text.startswith("chart,") and "latency per pass (estimate)" in text and "tokens/s vs batch (estimate)" in text


def test_browser_whatif_refused_bandwidth_names_itself_and_the_tab_recovers(whatif_app):
    """A custom bandwidth out of bounds is refused by its label and both bounds, in the same words past
    either end, and the box goes back to the value the figures were computed from: it kept the refused
    value, and the next target picked was refused for it. A good bandwidth then computes."""
    with _page() as page:
        page.goto(whatif_app + "?tab=whatif")
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        _pick(page, "whatif-gpu", CUSTOM)
        _summary_has(page, "custom GPU")
        box = page.locator("#whatif-bandwidth input")
        before = box.input_value()
        for typed in ("-5", "1e9"):
            box.fill(typed)
            box.press("Enter")
            bound = "'Custom GPU bandwidth (TB/s)' must be from 0.001 to 100, not "
            page.wait_for_function("t => [...document.querySelectorAll('[data-testid=toast-body]')]"
                                   ".some(e => e.innerText.includes(t))", arg=bound, timeout=20000)
            # Enter left the box already: a click elsewhere sends nothing more, and the sentence shows once
            page.locator("#whatif-summary").click()
            page.wait_for_timeout(2000)
            shown = page.locator("[data-testid=toast-body]").all_inner_texts()
            assert len(shown) == 1 and shown[0].count(bound) == 1 and "(2)" not in shown[0], shown
            assert "Nothing was recomputed" in shown[0], shown      # gradio's own check refused it: said too
            assert box.input_value() == before, (typed, box.input_value())
            for button in page.locator("[data-testid=toast-close]").all():
                button.click()
            page.wait_for_function("!document.querySelector('[data-testid=toast-body]')", timeout=10000)
        _pick(page, "whatif-target", "Llama-3-70B")
        page.wait_for_function("document.querySelector('#whatif-draft input').value === 'EAGLE:Llama-3-70B'",
                               timeout=30000)
        _summary_has(page, "Llama-3-70B")
        assert not page.locator("[data-testid=toast-body]").all_inner_texts()
        box.fill("2")
        box.press("Enter")
        _summary_has(page, "custom GPU (2 TB/s")
        _summary_has(page, "Llama-3-70B")
        # TB/s are fractions: a decimal comma is their point (1,5 went to 15 TB/s, in range, without a word)
        box.click()
        box.press("Control+a")
        page.keyboard.type("1,5")
        box.press("Enter")
        _summary_has(page, "custom GPU (1.5 TB/s")
        for button in page.locator("[data-testid=toast-close]").all():
            button.click()
        # a slider's box counts the number typed, not each key of it ("1" of "1.5" was refused on its own)
        alpha = page.locator("#whatif-alpha input[type=number]")
        alpha.click()
        alpha.press("Control+a")
        alpha.type("1.5", delay=60)
        alpha.press("Tab")
        page.wait_for_selector("[data-testid=toast-body]", timeout=20000)
        page.wait_for_timeout(1500)
        toasts = page.locator("[data-testid=toast-body]").all_inner_texts()
        assert len(toasts) == 1 and "not 1.5" in toasts[0] and "not 1." not in toasts[0].replace("not 1.5", ""), toasts
        assert page.locator("#whatif-alpha input[type=range]").input_value() == "0.99"
        _summary_has(page, "at α = 0.99")       # the end it moved to is what the figures show
        page.locator("#whatif-alpha [data-testid=reset-button]").click()      # ↺ computes too
        _summary_has(page, "at α = 0.70")


def test_browser_an_emptied_slider_box_goes_back_and_persian_digits_count(whatif_app):
    """An emptied α box was refused and then showed 0 (the slider's low end) beside figures of 0.7; a
    Persian keyboard's ۰٫۵ entered nothing at all (a number box drops those digits), and 0,6 read 6."""
    with _page() as page:
        page.goto(whatif_app + "?tab=whatif")
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        alpha = page.locator("#whatif-alpha input[type=number]")
        for typed in ("", "abc"):
            alpha.click()
            alpha.fill("")
            page.keyboard.type(typed)           # letters: the box drops them, as a person's typing
            alpha.press("Enter")
            page.wait_for_selector("[data-testid=toast-body]", timeout=20000)
            assert "its box is empty or holds no number" in page.locator("[data-testid=toast-body]").first.inner_text()
            # back at Enter, while the box still has the focus (the knob sat mid-slider until it lost it)
            page.wait_for_function("document.querySelector('#whatif-alpha input[type=range]').value === '0.7'",
                                   timeout=10000)
            page.locator("#whatif-summary").click()
            assert alpha.input_value() == "0.7"
            _summary_has(page, "at α = 0.70")
            for button in page.locator("[data-testid=toast-close]").all():
                button.click()
            # the next refusal is its own toast, not this one fading out
            page.wait_for_function("!document.querySelector('[data-testid=toast-body]')", timeout=10000)
        alpha.click()
        alpha.press("Control+a")
        page.keyboard.type("۰٫۵")
        alpha.press("Enter")
        _summary_has(page, "at α = 0.50")
        assert alpha.input_value() == "0.5"
        # a decimal comma in a box of fractions is its point (the box dropped it: "0,6" read 6, refused);
        # in a box of whole numbers it stays a thousands mark
        alpha.click()
        alpha.press("Control+a")
        page.keyboard.type("0,6")
        alpha.press("Enter")
        _summary_has(page, "at α = 0.60")
        context = page.locator("#whatif-context input[type=number]")
        context.click()
        context.press("Control+a")
        page.keyboard.type("2,048")
        context.press("Enter")
        page.wait_for_function("document.querySelector('#whatif-context input[type=range]').value === '2048'",
                               timeout=10000)
        assert not page.locator("[data-testid=toast-body]").all_inner_texts()


def test_the_latency_chart_names_the_gpu_as_its_list_does():
    """The Persian chart's title said "Custom GPU (bandwidth and FLOP/s below)", the English value."""
    from specviz.ui import whatif_views

    app = _fake_app()
    vals = list(whatif_views.DEFAULTS.values())
    for lang in ("en", "fa"):
        _, lat, _ = whatif_views.compute(app, whatif_views.CUSTOM_GPU, *vals[1:], lang=lang)
        label = dict((v, k) for k, v in whatif_views.gpu_options(lang))[whatif_views.CUSTOM_GPU]
        title = lat.layout.title.text.replace("<br>", " ")
        assert (whatif_views.CUSTOM_GPU in title) == (lang == "en"), title
        assert all(word in title for word in label.split()[:2]), (label, title)


def test_browser_a_pick_by_keyboard_computes_as_a_click_does(whatif_app):
    """gradio sends a dropdown's .select for a click only: a target picked with the keyboard kept the old
    target's draft list and figures."""
    with _page() as page:
        page.goto(whatif_app + "?tab=whatif")
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        for box, typed in (("#whatif-target input", "Qwen2.5-7B"), ("#whatif-gpu input", "H200")):
            page.locator(box).click()
            page.keyboard.press("Control+a")
            page.keyboard.type(typed, delay=30)
            page.keyboard.press("Enter")
        page.wait_for_function("document.querySelector('#whatif-draft input')?.value === 'EAGLE:Qwen2.5-7B'",
                               timeout=30000)
        _summary_has(page, "EAGLE:Qwen2.5-7B drafting")
        _summary_has(page, "H200")
        page.wait_for_timeout(1000)
        assert not page.locator("[data-testid=toast-body]").all_inner_texts()


def test_a_refused_knob_names_its_box_and_says_nothing_was_recomputed():
    """An emptied box is named alone (not all five), and a refusal says the figures shown are the last
    accepted ones: a reader who changed the target next read the old target's figures as new."""
    import gradio as gr

    from specviz.ui import whatif, whatif_views

    app = _fake_app()
    with gr.Blocks() as blocks:
        whatif.build(app)
    vals = list(whatif_views.DEFAULTS.values())
    with pytest.raises(gr.Error) as err:
        whatif_views.compute(app, whatif_views.CUSTOM_GPU, *vals[1:7], None, vals[8])
    assert err.value.message == "'Custom GPU bandwidth (TB/s)' needs a number; its box is empty.", err.value
    en = type("R", (), {"session_hash": "api"})()
    with pytest.raises(gr.Error) as err:
        _handler(blocks, "whatif")(whatif_views.CUSTOM_GPU, *vals[1:7], 0, 989, request=en)
    assert "bandwidth" in err.value.message and err.value.message.endswith(
        "Nothing was recomputed: the figures shown are still those of the last values accepted."), err.value


def test_browser_copy_link_brings_the_what_if_knobs_back(whatif_app):
    """A first-time user copied the link of an H200, Qwen2.5-7B, α 0.85, ideal-model estimate and got the
    defaults back: the tab's knobs ride the link, a custom GPU's rates with them."""
    with _page() as page:
        page.goto(whatif_app + "?tab=whatif")
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        _pick(page, "whatif-target", "Qwen2.5-7B")
        _pick(page, "whatif-gpu", CUSTOM)
        page.wait_for_function("!document.querySelector('#whatif-bandwidth input').disabled", timeout=10000)
        for box, value in (("#whatif-bandwidth input", "2.5"), ("#whatif-alpha input[type=number]", "0.85")):
            page.locator(box).fill(value)
            page.locator(box).press("Enter")
        page.locator("#whatif-model").get_by_label("ideal").check()
        _summary_has(page, "custom GPU (2.5 TB/s")
        _summary_has(page, "ideal roofline model")
        page.locator("#copy-link").click()
        page.wait_for_function("document.querySelector('#link input').value.includes('model=ideal')", timeout=10000)
        url = page.locator("#link input").input_value()
        shown = page.locator("#whatif-summary").inner_text()
        _record_toasts(page)
        page.goto(url)
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        _summary_has(page, "custom GPU (2.5 TB/s")
        _summary_has(page, "ideal roofline model")
        assert page.locator("#whatif-target input").input_value() == "Qwen2.5-7B"
        assert page.locator("#whatif-alpha input[type=number]").input_value() == "0.85"
        # the same figures, and no word about the draft: the link's draft comes with its target's list
        page.wait_for_function("t => document.querySelector('#whatif-summary').innerText === t", arg=shown,
                               timeout=20000)
        page.wait_for_timeout(1500)
        assert not _toasts_seen(page)
        # a draft set by the link alone (no reader's pick, no other knob changed) is computed too
        page.goto(whatif_app + "?tab=whatif&draft=SmolLM2-135M")
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        _summary_has(page, "with SmolLM2-135M drafting")
        # a Persian link with a target alone: its own EAGLE head, the figures in Persian, and no word
        page.goto(whatif_app + "?tab=whatif&lang=fa&target=Qwen2.5-7B")
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        page.wait_for_function("document.querySelector('#whatif-draft input')?.value === 'EAGLE:Qwen2.5-7B'",
                               timeout=30000)
        _summary_has(page, "EAGLE:Qwen2.5-7B")
        _summary_has(page, "تخمین‌های مدل کالیبره‌شده")
        page.wait_for_timeout(1500)
        assert not _toasts_seen(page)
        page.goto(whatif_app + "?tab=whatif&alpha=2")            # the recorder hears a toast when there is one
        page.wait_for_function("(window.__toasts || []).some((t) => t.includes('alpha = 2'))", timeout=30000)


def test_titles_wrap_between_words_never_inside_a_number_or_an_isolate():
    """Plotly never wraps a title: on a phone a long one lost its end, or vanished."""
    from specviz import lessons
    from specviz.charts import TITLE_CHARS, wrap_title
    from specviz.ui.whatif_views import _for_reader

    lines = wrap_title("Tokens/s by batch and depth, α = 0.70 (calibrated (vLLM) estimate)")
    assert lines == ["Tokens/s by batch and depth, α = 0.70", "(calibrated (vLLM) estimate)"]
    assert all(len(line) <= TITLE_CHARS for line in lines)
    fa = "speed-up نسبت به decoding معمولی، " + lessons.LRI + "k = 3" + lessons.PDI + " در برابر اندازه‌گیری منتشرشده (تخمین)"
    for line in wrap_title(fa, width=36):      # an isolate stays whole on one line, opened and closed there
        assert line.count(lessons.LRI) == line.count(lessons.PDI)
    import plotly.graph_objects as go

    fig = _for_reader(go.Figure(layout=dict(title=dict(text=fa))), "fa")
    parts = fig.layout.title.text.split("<br>")
    assert len(parts) == 2 and all(p.startswith(lessons.RLI) and p.endswith(lessons.PDI) for p in parts)
    assert fig.layout.title.xanchor == "right"


def test_browser_whatif_on_a_phone_keeps_numbers_and_titles_whole(whatif_app):
    """On a 390 px phone the table broke "128" into "12 / 8" and the chart titles ran off the chart."""
    with _page(390, 844) as page:
        page.goto(whatif_app + "?tab=whatif")
        page.wait_for_selector("#whatif-crossover .js-plotly-plot", timeout=30000)
        _summary_has(page, "calibrated model")
        # every cell's text lies on one line
        broken = page.evaluate("""() => [...document.querySelectorAll('#whatif-summary td')].filter((td) => {
            const r = document.createRange(); r.selectNodeContents(td);
            return new Set([...r.getClientRects()].map((x) => Math.round(x.top))).size > 1; }).map((td) => td.innerText)""")
        assert not broken, broken
        # each chart's title lies inside its chart
        for chart in ("whatif-latency", "whatif-crossover"):
            widths = page.evaluate(f"""() => {{ const svg = document.querySelector('#{chart} .main-svg');
                const t = document.querySelector('#{chart} .gtitle'); const b = t.getBoundingClientRect();
                const s = svg.getBoundingClientRect(); return [b.left - s.left, b.right - s.right, t.textContent]; }}""")
            assert widths[0] >= -1 and widths[1] <= 1, (chart, widths)
        # a tap or hover shows no plotly toolbar over the chart's name
        page.locator("#whatif-speedup .nsewdrag").hover()
        page.wait_for_timeout(500)
        assert page.evaluate("getComputedStyle(document.querySelector('#whatif-speedup .modebar-container'))"
                             ".display") == "none"
    for lang in ("en", "fa"):
        with _page(390, 844) as page:
            page.goto(whatif_app + f"?tab=whatif&lang={lang}")
            page.wait_for_selector("#whatif-crossover .js-plotly-plot", timeout=30000)
            _plots_keep_their_room(page, lang)


def _plots_keep_their_room(page, lang: str) -> None:
    """On a phone the legend stacks one entry a line: the crossover chart's squashed its plot to a strip;
    gradio's two-line label covered the speed-up chart's title."""
    for chart in ("whatif-speedup", "whatif-latency", "whatif-crossover"):
        box = page.evaluate(f"""() => {{ const b = document.querySelector('#{chart}');
            const r = (sel) => {{ const q = b.querySelector(sel).getBoundingClientRect(); return [q.top, q.bottom]; }};
            return {{plot: r('.nsewdrag'), title: r('.gtitle'), label: r('[data-testid=block-label]')}}; }}""")
        assert box["plot"][1] - box["plot"][0] >= 150, (lang, chart, box)
        assert box["label"][1] <= box["title"][0] + 1, (lang, chart, box)


def test_the_summary_says_when_the_pair_does_not_fit_the_gpu():
    """A T4 (16 GB) 'ran' Llama-3.1-8B in bf16 (16.6 GB of weights) with speed-ups up to batch 512."""
    from specviz.hardware.costmodel import Setup, memory_fit
    from specviz.hardware.presets import GPUS, MODELS, eagle_head
    from specviz.ui.whatif_views import memory_md

    def setup(gpu, target, context=800):
        t = MODELS[target]
        return Setup(t, eagle_head(t), GPUS[gpu].bandwidth, GPUS[gpu].flops, context)

    t4 = memory_fit(setup("T4", "Llama-3.1-8B"), GPUS["T4"].memory)
    assert t4.max_rows == 0 and t4.weights > GPUS["T4"].memory
    assert "does not fit" in memory_md(setup("T4", "Llama-3.1-8B"), GPUS["T4"])
    # the EAGLE head's lm_head is the target's: counted once (8.03 B + one layer and its fc, in bf16)
    assert 16.0e9 < t4.weights < 17.0e9
    l4 = memory_md(setup("L4", "Llama-3.1-8B"), GPUS["L4"])
    assert "about **68** rows fit" in l4 and "context 800 takes 0.11 GB" in l4
    assert "every batch in the table fit" in memory_md(setup("H200", "Llama-3.1-8B"), GPUS["H200"])
    assert memory_md(setup("H200", "Llama-3.1-8B"), None) == ""          # a custom GPU: memory unknown
    fa = memory_md(setup("T4", "Llama-3.1-70B"), GPUS["T4"], "fa")
    assert "جا نمی" in fa and "143.1" in fa


def test_the_best_depths_labels_are_never_cut_at_the_plots_edge():
    """A reader's review on a phone: the "k=1" over the highest star was cut by the plot's top edge."""
    from specviz.charts import crossover_figure

    rows = [dict(batch_size=b, depth=k, tokens_per_s=b * (100 - 10 * k)) for b in (1, 8, 64) for k in (0, 2)]
    stars = next(t for t in crossover_figure(rows, "t").data if t.mode == "markers+text")
    assert stars.cliponaxis is False and list(stars.text) == ["k=0"] * 3


def test_speculation_that_still_pays_at_batch_512_says_why():
    """H200 + SmolLM2-1.7B: the estimate's speed-up grows with the batch, the opposite of the lesson, and
    said nothing of why (a reviewer's report): the rows' KV caches outweigh the weights there."""
    from specviz.hardware.costmodel import Setup
    from specviz.hardware.presets import GPUS, MODELS
    from specviz.ui.whatif_views import kv_reason

    def setup(target, context):
        return Setup(MODELS[target], None, GPUS["H200"].bandwidth, GPUS["H200"].flops, context)
    small = kv_reason(setup("SmolLM2-1.7B", 1024), 218, "en")
    assert "about 103 GB of KV cache (context 1024) against 3.4 GB of weights" in small
    assert "memory-bound far past the weights' knee of 218" in small
    assert kv_reason(setup("Llama-3.1-70B", 512), 218, "en") == ""       # the weights outweigh the caches
    assert "KV cache" in kv_reason(setup("SmolLM2-1.7B", 1024), 218, "fa")


def test_a_draft_that_never_pays_is_blamed_not_the_batch():
    """A 70B draft for a 135M target: the summary said "stops paying from batch 1: past that, checking
    extra tokens costs real time" — the batch is not why. It names the draft's size; a small draft at a
    hopeless acceptance gets the acceptance's sentence, a free one (n-gram) the wider verify pass's; a draft
    that pays keeps the crossover sentence."""
    from specviz.ui import whatif_views

    big, *_ = whatif_views.compute(NoPeaks(), "H100 SXM", "SmolLM2-135M", "Llama-3.1-70B", 0.7, 1024, 0)
    assert "does not pay at any batch size" in big and "is not smaller than the target" in big
    assert "stops paying from" not in big
    low, *_ = whatif_views.compute(NoPeaks(), "H100 SXM", "Llama-3.1-70B", "SmolLM2-1.7B", 0.0, 1024, 0)
    assert "does not pay at any batch size" in low and "not smaller" not in low
    free, *_ = whatif_views.compute(NoPeaks(), "H100 SXM", "Llama-3.1-8B", whatif_views.NGRAM, 0.0, 1024, 0)
    assert "the draft costs nothing" in free and "a cheaper draft" not in free
    good, *_ = whatif_views.compute(NoPeaks(), "H100 SXM", "Llama-3.1-70B", "Llama-3.1-8B", 0.8, 1024, 0)
    assert "does not pay at any batch size" not in good
    fa, *_ = whatif_views.compute(NoPeaks(), "H100 SXM", "SmolLM2-135M", "Llama-3.1-70B", 0.7, 1024, 0, lang="fa")
    assert "کوچک‌تر نیست" in fa


def test_the_custom_boxes_show_a_preset_gpus_own_rates():
    """With L4 picked the locked boxes showed the H100's 3.35 TB/s and 989 TFLOP/s: they show L4's, and
    this machine's calibrated peaks with "this machine" picked."""
    from specviz.hardware.presets import GPUS
    from specviz.ui.whatif import preset_rates
    from specviz.ui.whatif_views import CUSTOM_GPU, THIS_MACHINE

    bw, fl = preset_rates("L4")
    assert bw["value"] == pytest.approx(GPUS["L4"].bandwidth / 1e12, abs=1e-3) and not bw["interactive"]
    assert fl["value"] == pytest.approx(GPUS["L4"].flops / 1e12, abs=0.1) and not fl["interactive"]
    bw, fl = preset_rates(CUSTOM_GPU)
    assert bw["interactive"] and "value" not in bw                    # the reader's own values stay
    assert not preset_rates(THIS_MACHINE)[0]["interactive"] and "value" not in preset_rates(THIS_MACHINE)[0]
    from specviz.hardware.device import Peaks
    bw, fl = preset_rates(THIS_MACHINE, Peaks("cpu", 46.4e9, 0.188e12, "float32"))   # its calibrated peaks
    assert bw["value"] == pytest.approx(0.046) and fl["value"] == pytest.approx(0.188) and not bw["interactive"]


def test_a_persian_profile_label_keeps_device_and_path_apart_and_names_cores_in_persian():
    """The list read ", static (eager)cpu: 2 cores روی smollm2…": two left-to-right values side by side
    swapped places in the right-to-left line, and the cores stayed English (here and in the summary)."""
    base = next(p for p in load_profiles() if p.device.startswith("cpu"))
    for path in ("static (eager)", "eager"):
        label = replace(base, path=path).label
        assert str(label).startswith(f"{base.target} on {base.device}")        # the value the API exchanges
        fa = lessons.say("fa", label)
        assert "cores" not in fa and "هسته" in fa and "\u2069\u2066" not in fa, fa
        assert ("، \u2066static (eager)\u2069" in fa) == (path == "static (eager)"), fa
    from specviz.ui.whatif_views import tx
    summary = tx("fa", "profile_md", device="AMD EPYC (2 cores)", bw=40, fl=0.2, context=256, knee=9, pred=8)
    assert "(2 هسته)" in summary and "cores" not in summary


def test_the_what_if_charts_hover_in_their_axes_words_with_whole_names():
    """Hover read "EAGLE on SGL...(24, 0.93)" and "(128, 1.209865)"; one depth of three models drew three
    orange lines told apart by dash alone; the measured knee wore the calibrated estimate's red dots."""
    from specviz import charts

    lab = {"model_calibrated": "calibrated", "model_ideal": "ideal"}
    rows = [{"batch_size": b, "depth": k, "speedup": 1.2} for b in (1, 8) for k in (0, 4)]
    fig = charts.speedup_figure({"calibrated": rows, "ideal": rows}, [4], [charts.PointSet("EAGLE on SGLang", [24], [0.93])],
                                "t", lab)
    lines = [t for t in fig.data if t.mode == "lines" and t.hoverinfo != "skip"]
    assert len({t.line.color for t in lines}) == 2
    assert all("%{y:.2f}" in t.hovertemplate and "%{fullData.name}" in t.hovertemplate for t in fig.data[:3])
    lat = charts.latency_figure([1, 2], [1.0, 1.1], 2, ([1, 2], [0.001, 0.0011]), 2, calibrated_ms=[1.2, 1.3])
    knees = {t.line.color: t.line.dash for t in lat.data if t.yaxis == "y2"}
    assert knees[charts.BONUS] == "dashdot" and len(knees) == 2
    assert all("%{y:.2f}" in t.hovertemplate for t in lat.data if t.yaxis != "y2")


def test_browser_the_address_keeps_language_tab_and_chapter_for_a_reload(whatif_app):
    """The address never changed, so a reload opened the first tab and chapter in English after a reader
    had switched to Persian and the What if? tab."""
    with _page() as page:
        page.goto(whatif_app)
        page.wait_for_selector("#chapter input", timeout=30000)
        page.locator("#lang label").filter(has_text="فارسی").click()
        page.wait_for_function("location.search.includes('lang=fa')", timeout=10000)
        page.locator("#chapter label").nth(3).click()
        page.wait_for_function("location.search.includes('chapter=')", timeout=10000)
        chapter = page.locator("#chapter input:checked").get_attribute("value")
        page.reload()
        page.wait_for_function(f"document.querySelector('#chapter input:checked')?.value === {chapter!r}", timeout=30000)
        assert page.evaluate("document.documentElement.lang") == "fa"
        page.locator("button[role=tab]").nth(2).click()
        page.wait_for_function("location.search.includes('tab=whatif')", timeout=10000)
        page.reload()
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        assert page.locator("#whatif").is_visible() and not page.locator("#lesson").is_visible()
        assert page.evaluate("document.documentElement.lang") == "fa"


def test_browser_reset_goes_to_the_pages_default_after_a_link(whatif_app):
    """Opened with ?alpha=0.4, ↺ ("reset to default value") kept 0.4: gradio took the link's value as the
    default."""
    with _page() as page:
        page.goto(whatif_app + "?tab=whatif&alpha=0.4")
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        _summary_has(page, "α = 0.40")
        page.locator("#whatif-alpha [data-testid=reset-button]").click()
        _summary_has(page, "α = 0.70")
        assert page.locator("#whatif-alpha input[type=number]").input_value() == "0.7"
