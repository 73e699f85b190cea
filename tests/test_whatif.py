"""The what-if model (roofline grids, crossover), recorded profiles, and the What-if tab in the app."""
import json
import shutil

import pytest

from specviz import roofline as rf
from specviz.profiles import PROFILES_DIR, load_profiles


def test_whatif_rows_hand_checked():
    # a free draft (n-gram), α = 0.5, depth 1: E[tokens] = 1.5 per pass, verify = a 2-token pass
    h200, m = rf.GPUS["H200"], rf.MODELS["SmolLM2-1.7B"]
    rows = rf.whatif_rows(m, None, h200.bandwidth, h200.flops, 0.5, 256, [1], [0, 1])
    t1 = rf.step_time(rf.pass_cost(m, 1, 1, 256), h200.bandwidth, h200.flops)
    t2 = rf.step_time(rf.pass_cost(m, 1, 2, 256), h200.bandwidth, h200.flops)
    assert rows[0]["tokens_per_s"] == pytest.approx(1 / t1)
    assert rows[1]["tokens_per_s"] == pytest.approx(1.5 / t2)
    assert rows[1]["flops_ratio"] == pytest.approx(2 / 1.5)      # 2 tokens checked, 1.5 kept


def test_speculation_pays_at_batch_1_and_stops_at_large_batch():
    h100, t, d = rf.GPUS["H100 SXM"], rf.MODELS["Qwen2.5-7B"], rf.MODELS["Qwen2.5-0.5B"]
    batches, depths = [1, 4, 16, 64, 256, 1024, 4096], [0, 1, 2, 4, 8]
    rows = rf.whatif_rows(t, d, h100.bandwidth, h100.flops, 0.7, 128, batches, depths)
    best = rf.best_depths(rows)
    assert best[1] >= 2                                  # memory-bound: deep drafts are nearly free
    assert best[4096] == 0                               # compute-bound: speculation only costs
    assert list(best.values()) == sorted(best.values(), reverse=True)   # deeper at small batch
    cross = rf.crossover_from_rows(rows)
    assert cross is not None and 64 < cross <= 4096
    # below the crossover the winner spends more FLOPs than plain decoding and still finishes sooner
    r1 = next(r for r in rows if r["batch_size"] == 1 and r["depth"] == best[1])
    plain = next(r for r in rows if r["batch_size"] == 1 and r["depth"] == 0)
    assert r1["flops_ratio"] > 1 and r1["tokens_per_s"] > plain["tokens_per_s"]


def test_crossover_from_rows_on_synthetic_grids():
    def grid(best):
        return [{"batch_size": b, "depth": k, "tokens_per_s": 2.0 if k == d else 1.0}
                for b, d in best.items() for k in (0, 2)]
    assert rf.crossover_from_rows(grid({1: 2, 2: 2, 4: 0, 8: 0})) == 4
    assert rf.crossover_from_rows(grid({1: 2, 2: 2})) is None
    assert rf.crossover_from_rows(grid({1: 0, 2: 2, 4: 0})) == 4      # must stay 0 from there on


def test_recorded_profiles_load_with_a_prediction(tmp_path):
    profiles = load_profiles()
    assert profiles, f"no profiles in {PROFILES_DIR}"
    for p in profiles:
        assert len(p.tokens_per_pass) == len(p.latency_s) >= 4 and all(t > 0 for t in p.latency_s)
        assert p.spec is not None and p.predicted_knee > 0 and p.measured_knee > 0
    # a broken file is skipped, not fatal
    shutil.copy(next(PROFILES_DIR.glob("*.json")), tmp_path / "good.json")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "partial.json").write_text(json.dumps({"target": "x"}))
    assert [p.name for p in load_profiles(tmp_path)] == ["good"]


def test_whatif_compute_labels_estimates_and_rejects_bad_input():
    import gradio as gr

    from specviz.ui import whatif

    class NoPeaks:
        peaks = None

    md, lat, cross = whatif.compute(NoPeaks(), "H200", "Qwen2.5-7B", "Qwen2.5-0.5B", 0.7, 1024, 0)
    assert "Estimates" in md and "estimate" in lat.layout.title.text and "estimate" in cross.layout.title.text
    assert "| 1 |" in md and "knee" in md
    with pytest.raises(gr.Error, match="not calibrated"):
        whatif.compute(NoPeaks(), whatif.THIS_MACHINE, "Qwen2.5-7B", whatif.NGRAM, 0.7, 1024, 0)
    with pytest.raises(gr.Error, match="Out of range"):
        whatif.compute(NoPeaks(), "H200", "Qwen2.5-7B", whatif.NGRAM, 1.5, 1024, 0)
    with pytest.raises(gr.Error, match="Unknown GPU"):
        whatif.compute(NoPeaks(), "GTX 480", "Qwen2.5-7B", whatif.NGRAM, 0.5, 1024, 0)
