"""Recorded GPU truth (assets/gpu/): the runs load, every curve is labelled with where, on which path and
when it was measured, the knee chapter judges it by its own rule (overhead-bound on the H200's eager path,
never memory-bound), and the What-if holds its estimate against it — in English and in Persian."""
from __future__ import annotations

import json
import shutil

import pytest

from specviz import lessons
from specviz.chapters import knee
from specviz.hardware import gpu_records as gr_

H200 = "nvidia-h200-2026-12-04"
WHERE = "NVIDIA H200, eager path, 2026-12-04"


def _english_outside(text: str) -> list[str]:
    from test_persian import english_outside_isolates

    return english_outside_isolates(text)


def test_the_h200_eager_curves_load_labelled():
    curves = [c for c in gr_.recorded_curves() if c.run == H200]
    assert [c.model for c in curves] == ["SmolLM2-1.7B", "Qwen3.5-27B (article)"]
    small, big = curves
    assert str(small.where) == WHERE and str(small.label) == f"SmolLM2-1.7B on {WHERE} (recorded)"
    assert small.path == "eager" and small.tokens_per_pass[-1] == 1024 and small.context == 256
    assert small.mbu_at_1_token == pytest.approx(0.0718, abs=1e-3) and small.flat_to() == 1024
    assert big.flat_to() == 128 and big.predicted_knee == 206
    assert small.on_gpu("H200") and not small.on_gpu("H100 SXM")
    assert gr_.curve_for("H200", "SmolLM2-1.7B") == small and gr_.curve_for("H100 SXM", "SmolLM2-1.7B") is None
    fa = lessons.say("fa", small.label)
    assert "مسیر eager" in fa and lessons.LRI + "NVIDIA H200" + lessons.PDI in fa and not _english_outside(fa)
    data = json.loads((gr_.GPU_DIR / f"{H200}.json").read_text())
    assert data["device"]["name"] == "NVIDIA H200" and data["date"] == "2026-12-04" and "evidence" in data["source"]
    assert all(s["label"] == "eager path" for s in data["steps"] if s["path"] == "eager")


def _run(tmp_path, name: str, date: str, path: str, latency: list[float], dry: bool = False) -> None:
    src = json.loads((gr_.GPU_DIR / f"{H200}.json").read_text())
    step = dict(src["steps"][1], path=path, result={**src["steps"][1]["result"], "latency_s": latency,
                                                    "tokens_per_pass": [1, 2, 4][:len(latency)]})
    (tmp_path / f"{name}.json").write_text(json.dumps({**src, "date": date, "dry_run": dry, "steps": [step]}))


def test_newest_run_and_graph_path_come_first_and_bad_files_are_skipped(tmp_path):
    _run(tmp_path, "a-old", "2026-12-04", "eager", [0.01, 0.01, 0.01])
    _run(tmp_path, "b-new-eager", "2026-12-20", "eager", [0.02, 0.02, 0.02])
    _run(tmp_path, "c-new-graph", "2026-12-20", "graph", [0.001, 0.001, 0.002])
    _run(tmp_path, "d-dry", "2026-12-30", "graph", [0.5, 0.5, 0.5], dry=True)     # a CPU rehearsal: not a curve
    (tmp_path / "e-broken.json").write_text("{not json")
    curves = gr_.recorded_curves(tmp_path)
    assert {c.run for c in curves} == {"a-old", "b-new-eager", "c-new-graph"} and curves[0].date == "2026-12-20"
    (best,) = gr_.newest_per_model(curves)
    assert best.run == "c-new-graph" and "graph path" in str(best.where)
    assert gr_.curve_for("H200", "SmolLM2-1.7B", curves).run == "c-new-graph"


def test_knee_rule_names_overhead_bound_gpu_passes():
    assert knee.knee_conclusion(1.05, 0.01, 0.001, gpu=True) == "conclusion_overhead_bound_gpu"
    assert knee.knee_conclusion(1.05, 0.01, 0.001) == "conclusion_overhead_bound"
    assert knee.knee_conclusion(1.05, 0.01, 0.008, gpu=True) == "conclusion_flat"
    assert knee.knee_conclusion(1.5, 0.01, 0.001, gpu=True) == "conclusion_not_memory_bound"
    text = lessons.text("en", "chapter.knee.conclusion_overhead_bound_gpu", overhead_ms=12.6, knee=1024, mbu=0.07,
                        predicted_knee=206)
    assert "overhead-bound, not memory-bound" in text and "7%" in text and "CUDA graphs" in text


def test_the_recorded_eager_curves_are_overhead_bound_in_both_languages():
    series = knee.recorded_series()
    assert [r["model"] for r in series] == ["SmolLM2-1.7B", "Qwen3.5-27B (article)"]
    for r in series:
        key, values = r["conclusion"]
        assert key == "recorded_overhead_bound"
        en = lessons.text("en", f"chapter.knee.{key}", **values)
        assert en.startswith(f"Recorded on a GPU ({WHERE}, {r['model']})") and "not memory-bound" in en
        fa = lessons.text_bidi("fa", f"chapter.knee.{key}", **values)
        assert "\u2066overhead-bound\u2069" in fa and "مسیر eager" in fa and not _english_outside(fa)
    en = lessons.text("en", "chapter.knee.recorded_overhead_bound", **series[0]["conclusion"][1])
    assert "12.6 ms" in en and "only 7%" in en and "up to 1024 tokens" in en and "near 206 tokens" in en


def test_knee_chapter_draws_and_concludes_the_recorded_curves(make_pair):
    from test_experiments import PEAKS

    last = list(knee.run_knee(make_pair("ngram"), PEAKS, context=8, repeats=1, cap=2))[-1]
    assert last["conclusions"][1:] == ["recorded_overhead_bound", "recorded_overhead_bound"]
    assert len(last["conclusion_values"]) == 3 and last["conclusion_values"][0] == last["values"]
    # every value the GPU variant of this machine's conclusion names is measured (a GPU runs it here)
    gpu_text = lessons.text("en", "chapter.knee.conclusion_overhead_bound_gpu", **last["values"])
    assert "{" not in gpu_text and f"near {last['predicted_knee']} tokens" in gpu_text
    fig = knee.figure_knee(last)
    names = [t.name for t in fig.data]
    assert f"{WHERE}: SmolLM2-1.7B (recorded)" in names
    from specviz.ui.lesson import chart_labels, conclusion_md

    fa = conclusion_md("fa", last)
    assert fa.count("ثبت‌شده روی یک GPU") == 2
    assert any("مسیر eager" in t.name for t in knee.figure_knee(last, chart_labels("fa", "knee")).data)


def test_whatif_holds_the_h200_estimate_against_the_recorded_curve():
    from specviz.ui import whatif_views as wv

    class App:
        peaks = None

    md, lat, _ = wv.compute(App(), "H200", "SmolLM2-1.7B", wv.NGRAM, 0.7, 800, 0)
    assert f"**Held against a recorded curve** ({WHERE}, SmolLM2-1.7B" in md and "overhead-bound" in md
    assert "measured **5.9×** the estimate" in md
    # the legend's lines (a phone shows each whole) keep where and when on one line
    assert f"recorded:<br>{WHERE}" in [t.name for t in lat.data]
    md_fa, lat_fa, _ = wv.compute(App(), "H200", "SmolLM2-1.7B", wv.NGRAM, 0.7, 800, 0, lang="fa")
    assert "منحنی ثبت‌شده" in md_fa and "\u2066overhead-bound\u2069" in md_fa
    md, *_ = wv.compute(App(), "H200", "Qwen2.5-7B", wv.NGRAM, 0.7, 800, 0)
    assert "No GPU curve recorded for Qwen2.5-7B on H200" in md
    md, *_ = wv.compute(App(), "H100 SXM", "SmolLM2-1.7B", wv.NGRAM, 0.7, 800, 0)
    assert "Held against a recorded curve" not in md and "No GPU curve recorded" not in md


def test_whatif_lists_the_recorded_curves_as_profiles():
    from specviz.ui import whatif_measured

    (prof, _) = [gr_.as_profile(c) for c in gr_.recorded_curves() if c.run == H200]
    assert str(prof.label) == f"SmolLM2-1.7B on {WHERE} (recorded)"
    md, fig = whatif_measured.profile_view([prof], prof.label)
    assert "NVIDIA H200" in md and len(fig.data) >= 2


def test_whatif_cli_recorded(capsys):
    from specviz.__main__ import main

    assert main(["whatif", "--recorded", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = [c for c in out["comparisons"] if c["device"] == "NVIDIA H200" and c["model"] == "SmolLM2-1.7B"]
    assert {r["estimate"] for r in rows} == {"calibrated", "ideal"} and out["label"] == "estimate"
    ideal = next(r for r in rows if r["estimate"] == "ideal")
    assert ideal["measured_over_estimate"][0] == pytest.approx(ideal["measured_ms"][0] / ideal["estimate_ms"][0])
    assert main(["whatif", "--gpu", "H200", "--target", "SmolLM2-1.7B", "--json"]) == 0
    grid = json.loads(capsys.readouterr().out)
    assert grid["recorded"]["recorded"] == f"SmolLM2-1.7B on {WHERE} (recorded)" and grid["recorded"]["path"] == "eager"
    assert main(["whatif", "--gpu", "H100 SXM", "--target", "SmolLM2-1.7B", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recorded"] is None


def test_a_checkout_without_recorded_runs_still_works(tmp_path, monkeypatch):
    shutil.copy(gr_.GPU_DIR / f"{H200}.json", tmp_path / "x.json")
    assert len(gr_.recorded_curves(tmp_path)) == 2
    assert gr_.recorded_curves(tmp_path / "none") == []
