"""The calibrated cost model: its rule, its constants against their sources, EAGLE heads, α fitting, the
published points and the `whatif` CLI."""
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from specviz import lessons

from specviz.hardware import costmodel, presets, profiles
from specviz.hardware import roofline as rf

H100 = presets.GPUS["H100 SXM"]
L8 = presets.MODELS["Llama-3.1-8B"]


def _cost(n, ctx=800):
    return rf.pass_cost(L8, 1, n, ctx)


def test_calibrated_pass_grows_from_the_first_extra_token():
    ideal = [costmodel.pass_time(_cost(n), L8.n_layers, H100.bandwidth, H100.flops) for n in (1, 2, 4, 64)]
    cal = [costmodel.pass_time(_cost(n), L8.n_layers, H100.bandwidth, H100.flops, costmodel.SERVING) for n in (1, 2, 4, 64)]
    assert ideal[3] / ideal[0] < 1.001        # the roofline: flat below the knee (only 63 new KV slots)
    assert cal[0] < cal[1] < cal[2] < cal[3] and cal[3] / cal[0] > 1.2    # real kernels: every token adds
    # the arithmetic adds on top of the streaming: one extra token costs its FLOPs at the achieved rate
    per_token = (_cost(2).flops - _cost(1).flops) / (H100.flops * costmodel.SERVING.flops_eff)
    assert cal[1] - cal[0] == pytest.approx(per_token + (_cost(2).bytes - _cost(1).bytes) / H100.bandwidth)


def test_calibration_reduces_to_the_ideal_roofline():
    plain = costmodel.Calibration("no overheads", bandwidth_eff=1.0, flops_eff=1.0, overlap=1.0)
    assert plain.is_ideal and costmodel.IDEAL.is_ideal and not costmodel.SERVING.is_ideal
    for n in (1, 7, 300, 5000):
        c = _cost(n)
        assert costmodel.pass_time(c, L8.n_layers, H100.bandwidth, H100.flops, plain) == rf.step_time(
            c, H100.bandwidth, H100.flops)
    rows_old = costmodel.whatif_rows(L8, None, H100.bandwidth, H100.flops, 0.6, 512, [1, 64, 512], [0, 2])
    rows_new = costmodel.whatif_rows(L8, None, H100.bandwidth, H100.flops, 0.6, 512, [1, 64, 512], [0, 2],
                              calibration=plain)
    assert [r["tokens_per_s"] for r in rows_old] == [r["tokens_per_s"] for r in rows_new]
    # zero overlap is the sum of the two terms; efficiencies stretch each one
    half = costmodel.Calibration("half rates", bandwidth_eff=0.5, flops_eff=0.5, overlap=0.0)
    c = _cost(100)
    assert costmodel.pass_time(c, 1, H100.bandwidth, H100.flops, half) == pytest.approx(
        2 * c.bytes / H100.bandwidth + 2 * c.flops / H100.flops)


def test_serving_calibration_reproduces_the_published_pass_fit():
    # PUBLISHED-RESULTS.md: 5.9 ms + 21 µs per token (+ 39 ns per cached token) + 1.2 ms per step →
    # 7.2 ms at 1 token, 8.5 at 64, 10.5 at 160, 13.0 at 280 (no cache)
    for n, ms in ((1, 7.1), (64, 8.44), (160, 10.46), (280, 12.98)):
        t = costmodel.pass_time(rf.pass_cost(L8, 1, n, 0), L8.n_layers, H100.bandwidth, H100.flops, costmodel.SERVING)
        assert 1000 * (t + costmodel.SERVING.step_overhead_s) == pytest.approx(ms, rel=0.01)
    # 39 ns per cached token: the K and V bytes at the achieved bandwidth
    extra = (costmodel.pass_time(rf.pass_cost(L8, 1, 1, 1000), 32, H100.bandwidth, H100.flops, costmodel.SERVING)
             - costmodel.pass_time(rf.pass_cost(L8, 1, 1, 0), 32, H100.bandwidth, H100.flops, costmodel.SERVING))
    assert extra / 1000 == pytest.approx(39e-9, rel=0.03)
    assert costmodel.SERVING.overlap == 0 and 0.6 < costmodel.SERVING.flops_eff < 0.8 and costmodel.SERVING.step_overhead_s == 1.2e-3


def test_drafts_pay_their_own_pass_overhead():
    setup = costmodel.Setup(L8, presets.resolve_draft("EAGLE:Llama-3.1-8B", L8), H100.bandwidth, H100.flops, 800, costmodel.SERVING)
    ratio = setup.pass_s(setup.draft, 1, 1) / setup.pass_s(L8, 1, 1)
    assert 0.25 < ratio < 0.47            # SpecDecode-Bench measured ≈ 37.5 % for EAGLE on this model
    # eager stacks pay per layer: a deep narrow draft costs about what a wider, shallower model does
    eager = costmodel.Calibration("eager", overlap=0.0, layer_overhead_s=0.15e-3)
    h200 = presets.GPUS["H200"]
    small, big = presets.MODELS["SmolLM2-135M"], presets.MODELS["SmolLM2-1.7B"]
    t_small, t_big = (costmodel.pass_time(rf.pass_cost(m, 1, 1, 256), m.n_layers, h200.bandwidth, h200.flops, eager)
                      for m in (small, big))
    assert t_small > 0.8 * t_big and small.params < big.params / 10


def test_eagle_heads_and_draft_resolution():
    head = presets.eagle_head(L8)
    assert head.name == "EAGLE:Llama-3.1-8B" and head.n_layers == 1 and head.vocab == L8.vocab
    assert head.streamed_params == L8.layer_params + L8.head_params + 2 * 4096 * 4096
    head3 = presets.resolve_draft("EAGLE-3:Llama-3.1-8B", L8)
    assert head3.vocab == 32000 and head3.streamed_params < head.streamed_params
    assert presets.resolve_draft("ngram", L8) is None
    assert presets.resolve_draft("layerskip:4-11", L8).n_layers == 24
    assert "EAGLE:Llama-3.1-70B" in presets.draft_names() and "EAGLE:Llama-3.1-8B" in presets.draft_names(["Llama-3.1-8B"])
    for bad, msg in (("EAGLE:Llama-3.1-70B", "not for Llama-3.1-8B"), ("GPT-5", "unknown draft .GPT-5.: a model preset .*, EAGLE:TARGET, EAGLE-3:TARGET, layerskip:A-B or ngram"),
                     ("layerskip:9-3", "bad layer-skip"), ("EAGLE:nope", "not for")):
        with pytest.raises(presets.PresetError, match=msg):
            presets.resolve_draft(bad, L8)
    # the engine's FLOPs accounting sees no change for plain models
    assert rf.pass_cost(L8, 2, 3, 100) == rf.pass_cost(replace(L8, extra_params=0), 2, 3, 100)


def test_custom_gpu_and_unknown_gpu():
    g = presets.resolve_gpu(None, 2e12, 400e12)
    assert g.bandwidth == 2e12 and g.flops == 400e12 and "custom" in g.name
    for kw in ({"name": "GTX 480"}, {}, {"bandwidth": 2e12}, {"bandwidth": -1, "flops": 1e12},
               {"bandwidth": float("nan"), "flops": 1e12}):
        with pytest.raises(presets.PresetError):
            presets.resolve_gpu(**kw)
    # the rate out of bounds is named with its value (one sentence for both read as if both were wrong)
    for kw, said in (({"bandwidth": 1e24, "flops": 400e12}, "bandwidth must be from 0.001 to 100 TB/s, not 1e+12 TB/s"),
                     ({"bandwidth": 2e12, "flops": 1e19}, "compute must be from 0.001 to 100000 TFLOP/s, not 1e+07")):
        with pytest.raises(presets.PresetError) as refused:
            presets.resolve_gpu(None, **kw)
        assert said in lessons.say("en", refused.value.args[0])
        assert "1e+" in lessons.say("fa", refused.value.args[0])


def test_fit_alpha_round_trip_and_depth_crossover():
    setup = costmodel.Setup(L8, presets.resolve_draft("EAGLE:Llama-3.1-8B", L8), H100.bandwidth, H100.flops, 800, costmodel.SERVING)
    for alpha in (0.3, 0.7, 0.9):
        s = setup.speedup(2, 3, alpha)
        assert costmodel.fit_alpha(setup, 2, 3, s) == pytest.approx(alpha, abs=1e-6)
    free = costmodel.Setup(L8, None, H100.bandwidth, H100.flops, 800, costmodel.SERVING)     # n-gram: a free draft
    cross = costmodel.depth_crossover(free, 0.2, 3)
    assert cross is not None and cross <= 64 and free.speedup(cross, 3, 0.2) < 1 <= free.speedup(cross - 1, 3, 0.2)
    assert costmodel.depth_crossover(free, 0.3, 3) > cross              # better drafts pay to larger batches
    assert costmodel.depth_crossover(free, 0.95, 1, max_batch=8) is None


def test_fit_calibration_recovers_known_constants_and_fits_the_cpu_profile():
    spec, bw, fl = presets.MODELS["SmolLM2-135M"], 20e9, 200e9
    truth = costmodel.Calibration("truth", flops_eff=0.6, overlap=0.0, layer_overhead_s=0.5e-3)
    ns = [1, 2, 4, 8, 16, 32, 64, 128]
    secs = [costmodel.pass_time(rf.pass_cost(spec, 1, n, 256), spec.n_layers, bw, fl, truth) for n in ns]
    got = costmodel.fit_calibration(spec, ns, secs, 256, bw, fl, "fit", "synthetic")
    assert got.flops_eff == pytest.approx(0.6) and got.layer_overhead_s == pytest.approx(0.5e-3)
    prof = profiles.load_profiles()[0]
    cal = profiles.profile_calibration(prof)
    est = costmodel.latency_curve(prof.spec, prof.bandwidth, prof.flops, prof.tokens_per_pass, prof.context,
                           calibration=cal)
    assert all(abs(e / t - 1) < 0.25 for e, t in zip(est, prof.latency_s))
    assert "fitted to" in cal.source and prof.name in cal.source


def test_published_points_load_and_match_presets(tmp_path):
    series = profiles.load_published()
    assert len(series) >= 3
    for s in series:
        assert s.source and s.cite and profiles.PUBLISHED_LABEL in s.legend
        target = presets.resolve_model(s.target)          # every series names presets that exist
        presets.resolve_gpu(s.gpu)
        presets.resolve_draft(s.draft, target)
        assert len(s.batch_sizes) == len(s.speedup) and all(x > 0 for x in s.speedup)
    eagle = next(s for s in series if s.id == "eagle3-table4-eagle")
    assert eagle.matches("H100 SXM", "Llama-3.1-8B", "EAGLE:Llama-3.1-8B")
    assert not eagle.matches("H200", "Llama-3.1-8B", "EAGLE:Llama-3.1-8B")
    assert eagle.speedup[eagle.batch_sizes.index(24)] == 0.93 and eagle.fit_batch == 2
    (tmp_path / "bad.json").write_text("{oops")
    assert profiles.load_published(tmp_path / "bad.json") == []
    (tmp_path / "nosource.json").write_text(json.dumps({"series": [{**eagle.__dict__, "source": ""}]}))
    assert profiles.load_published(tmp_path / "nosource.json") == []


def test_calibrated_beats_the_ideal_roofline_on_published_points():
    for cal_name, cal in (("calibrated", costmodel.SERVING), ("ideal", costmodel.IDEAL)):
        comps = {c.series.id: c for c in profiles.compare_all(profiles.load_published(), cal)}
        for c in comps.values():
            assert c.estimate and len(c.errors) == len(c.series.speedup)
        if cal_name == "calibrated":
            calibrated = comps
    ideal = {c.series.id: c for c in profiles.compare_all(profiles.load_published(), costmodel.IDEAL)}
    for sid in ("eagle3-table4-eagle", "eagle3-table4-eagle3"):
        c = calibrated[sid]
        assert c.errors[0] == pytest.approx(0, abs=1e-6)        # α is fitted there
        assert c.max_error < ideal[sid].max_error
    # the vLLM point borrows the fitted α of the same setup and says so
    assert "from eagle3-table4-eagle" in calibrated["specdecode-bench-eagle-8b"].alpha_note


def test_curve_setup_costs_what_the_profile_measured():
    curve = ((1, 0.040), (4, 0.060), (16, 0.080))
    assert profiles.curve_time(curve, 1) == 0.040 and profiles.curve_time(curve, 4) == pytest.approx(0.060)
    assert 0.060 < profiles.curve_time(curve, 8) < 0.080 and profiles.curve_time(curve, 2) == pytest.approx(0.050)
    assert profiles.curve_time(curve, 32) == pytest.approx(0.160)                # linear past the last point
    target = replace(presets.MODELS["SmolLM2-135M"], bytes_per_param=4.0)
    skip = presets.resolve_draft("layerskip:12-17", target)
    s = profiles.CurveSetup(target, skip, 23e9, 0.2e12, 64, costmodel.IDEAL, curve=curve)
    assert s.pass_s(target, 2, 2) == pytest.approx(0.060)                        # rows × tokens per pass
    assert s.pass_s(skip, 1, 1) == pytest.approx(0.040 * skip.streamed_params / target.streamed_params)
    other = presets.MODELS["SmolLM2-360M"]                                            # another model: the rule
    assert s.pass_s(other, 1, 1) == costmodel.Setup(target, skip, 23e9, 0.2e12, 64, costmodel.IDEAL).pass_s(other, 1, 1)


def test_a_sweep_of_one_prompt_is_charged_one_prefill():
    """The engine prefills rows of the same prompt once and copies them (engine.kvcache.prefill); a sweep's
    B rows are one prompt, so its estimate charges one row's prefill, not B (which was 40 % of a B = 16 run).
    A draft model has no prefill of its own: its first drafting step feeds every row's prompt."""
    target = replace(presets.MODELS["SmolLM2-135M"], bytes_per_param=4.0)
    skip = presets.resolve_draft("layerskip:12-17", target)
    setup = costmodel.Setup(target, skip, 23e9, 0.2e12, 45, costmodel.IDEAL)

    def prefill(b: int, k: int) -> float:          # a run of no new tokens is its prefill alone
        return costmodel.run_seconds(setup, b, k, 0.3, 45, 0)
    one = setup.pass_s(target, 1, 45, context=0)
    assert prefill(16, 0) == pytest.approx(one) and prefill(1, 0) == pytest.approx(one)
    assert prefill(16, 2) == pytest.approx(one + setup.pass_s(skip, 16, 45, context=0))
    assert costmodel.run_seconds(setup, 16, 0, 0.3, 45, 64) > prefill(16, 0)
    sw = {s.name: s for s in profiles.load_sweeps()}["cpu-2core-ngram-fast"]
    prof = profiles.profile_for_device(profiles.load_profiles(), "cpu", sw.path)
    got = profiles.compare_sweep(sw, costmodel.IDEAL, prof.bandwidth, prof.flops)
    b = sw.batch_sizes.index(16)
    plain = costmodel.Setup(replace(presets.MODELS[sw.target], bytes_per_param=4.0), None, prof.bandwidth, prof.flops,
                            sw.prompt_tokens, costmodel.IDEAL)
    assert got.estimate[b][0] == pytest.approx(16 * sw.new_tokens / costmodel.run_seconds(
        plain, 16, 0, sw.acceptance[1], sw.prompt_tokens, sw.new_tokens))


def test_recorded_sweeps_compare_end_to_end():
    sweeps = profiles.load_sweeps()
    assert {s.draft for s in sweeps} == {"ngram", "layerskip:12-17"}
    for sw in sweeps:
        prof = profiles.profile_for_device(profiles.load_profiles(), "cpu", sw.path)
        assert prof is not None and prof.path == sw.path            # each sweep meets its own path's passes
        cal = profiles.compare_sweep(sw, profiles.profile_calibration(prof), prof.bandwidth, prof.flops)
        ideal = profiles.compare_sweep(sw, costmodel.IDEAL, prof.bandwidth, prof.flops)
        mean = lambda e: sum(map(abs, e)) / len(e)  # noqa: E731
        assert mean(cal.errors()) < mean(ideal.errors())
        if sw.path != profiles.EAGER:
            # the engine the app serves: most cells near, where an ideal roofline is far off (BENCHMARKS'
            # What-if-on-sweeps table holds the shipped sweeps' figures)
            errs = cal.errors()
            assert sum(abs(e) <= 0.2 for e in errs) / len(errs) >= 0.7 and mean(errs) < 0.15
        assert len(cal.estimate) == len(sw.batch_sizes) and len(cal.estimate[0]) == len(sw.depths)


def test_a_sweep_names_its_preset_by_shape_and_the_whatif_skips_what_it_cannot_model(tmp_path, capsys, monkeypatch):
    spec = replace(presets.MODELS["SmolLM2-135M"], name="smollm2-135m-offline", bytes_per_param=4.0)
    assert presets.named_by_shape(spec, "smollm2-135m-offline") == "SmolLM2-135M"
    assert presets.named_by_shape(replace(spec, n_layers=3), "/tmp/tiny") == "/tmp/tiny"
    shipped = {sw.name: sw for sw in profiles.load_sweeps()}["cpu-2core-ngram-fast"]
    assert profiles.cannot_model(shipped) is None
    for change, why in ((dict(target="/tmp/tiny"), "its target /tmp/tiny has the shape of no what-if preset"),
                        (dict(draft="synthetic:0.7"), "its draft synthetic:0.7 is not one the what-if models"),
                        (dict(acceptance={2: 0.5}), "it measured no acceptance at depth 1, where the models read α"),
                        (dict(depths=[1, 2, 4]), "it has no depth 0, the plain decoding its speed-ups are measured against")):
        assert profiles.cannot_model(replace(shipped, **change)) == why
    # its pass times come from a profile of the same model on the same device, nothing else
    recorded = profiles.load_profiles()
    prof = profiles.profile_for_sweep(recorded, shipped)
    assert prof.path == shipped.path and prof.device == shipped.device
    assert profiles.profile_for_sweep(recorded, replace(shipped, device="cpu: 16 cores")) is None
    assert profiles.profile_for_sweep(recorded, replace(shipped, target="SmolLM2-360M")) is None
    gpu = replace(prof, device="cuda: NVIDIA H200", cpu="AMD EPYC (16 cores)")
    assert prof.where == prof.cpu and gpu.where == "cuda: NVIDIA H200"        # a GPU profile names the GPU
    odd = replace(shipped, name="odd", target="/tmp/tiny")
    real = profiles.load_sweeps
    monkeypatch.setattr(profiles, "load_sweeps", lambda: real() + [odd])
    rc, out, err = _whatif(capsys, "--sweeps")
    assert rc == 0, err
    assert "skipped odd: its target /tmp/tiny has the shape of no what-if preset" in out and "mean error" in out
    monkeypatch.setattr(profiles, "load_sweeps", lambda: [odd])               # nothing left to compare: one line
    rc, out, err = _whatif(capsys, "--sweeps")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "skipped odd: its target /tmp/tiny" in err


# --- the CLI ---------------------------------------------------------------------------------------------

def _whatif(capsys, *args):
    from specviz.__main__ import main

    rc = main(["whatif", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_whatif_cli_says_whether_the_pair_fits_the_gpu(capsys):
    args = ["--target", "Llama-3.1-8B", "--draft", "EAGLE:Llama-3.1-8B", "--context", "800", "--batch-sizes", "1,8",
            "--depths", "0,2"]
    rc, out, _ = _whatif(capsys, "--gpu", "T4", *args)
    assert rc == 0 and "the weights do not fit" in out
    rc, out, _ = _whatif(capsys, "--gpu", "L4", *args, "--json")
    mem = json.loads(out)["memory"]
    assert mem["max_rows"] == 68 and 16 < mem["weights_gb"] < 17 and mem["gpu_gb"] == 24
    rc, out, _ = _whatif(capsys, "--bandwidth", "2e12", "--flops", "4e14", *args, "--json")
    assert rc == 0 and json.loads(out)["memory"] is None             # a custom GPU's memory is unknown


def test_whatif_cli_prints_the_contract(capsys):
    args = ["--target", "Llama-3.1-8B", "--draft", "EAGLE:Llama-3.1-8B", "--alpha", "0.7", "--context", "800",
            "--batch-sizes", "1,2,16,64,512", "--depths", "0,1,3", "--json"]
    rc, out, err = _whatif(capsys, "--gpu", "H100 SXM", *args)
    assert rc == 0, err
    data = json.loads(out)
    assert data["label"] == "estimate" and data["model"] == "calibrated" and "crossover_batch" in data
    assert len(data["rows"]) == 15
    for r in data["rows"]:
        assert set(r) == {"batch_size", "depth", "tokens_per_s", "speedup"} and r["tokens_per_s"] > 0
        if r["depth"] == 0:
            assert r["speedup"] == pytest.approx(1.0)
    by = {(r["batch_size"], r["depth"]): r for r in data["rows"]}
    assert by[(64, 3)]["speedup"] == pytest.approx(by[(64, 3)]["tokens_per_s"] / by[(64, 0)]["tokens_per_s"])
    # a GPU given by its numbers is the same GPU; the ideal model is the roofline grid
    rc, out2, _ = _whatif(capsys, "--bandwidth", "3.35e12", "--flops", "989e12", *args)
    assert rc == 0 and json.loads(out2)["rows"] == data["rows"]
    rc, out3, _ = _whatif(capsys, "--gpu", "H100 SXM", *args, "--model", "ideal")
    ideal = costmodel.whatif_rows(L8, presets.resolve_draft("EAGLE:Llama-3.1-8B", L8), H100.bandwidth, H100.flops, 0.7, 800,
                           [1, 2, 16, 64, 512], [0, 1, 3])
    assert [r["tokens_per_s"] for r in json.loads(out3)["rows"]] == pytest.approx([r["tokens_per_s"] for r in ideal])
    assert json.loads(out3)["crossover_batch"] == costmodel.crossover_from_rows(ideal)


def test_stack_bookkeeping_is_per_sequence_and_only_when_speculating():
    base = costmodel.Setup(presets.MODELS["Llama-3.1-8B"], presets.resolve_draft("EAGLE:Llama-3.1-8B", presets.MODELS["Llama-3.1-8B"]),
                    3.35e12, 989e12, 800, costmodel.SERVING)
    extra = replace(base, calibration=replace(costmodel.SERVING, spec_row_overhead_s=100e-6))
    assert not replace(costmodel.IDEAL, spec_row_overhead_s=1e-6).is_ideal
    for b in (1, 8, 64):
        assert extra.step_s(b, 0) == base.step_s(b, 0)                       # plain decoding pays nothing
        assert extra.step_s(b, 3) - base.step_s(b, 3) == pytest.approx(b * 100e-6)


def test_stack_fit_on_synthetic_speedups_recovers_the_overhead():
    # speed-ups made by the model itself with 120 µs of bookkeeping: the fit finds it, and the held-out
    # check (fitted to the other series only) finds it too
    made = replace(costmodel.SERVING, spec_row_overhead_s=120e-6)
    series = []
    for i, (draft, alpha) in enumerate((("EAGLE:Llama-3.1-8B", 0.7), ("EAGLE-3:Llama-3.1-8B", 0.85))):
        s = profiles.PublishedSeries(f"s{i}", "x", "x", "synthetic", "H100 SXM", "Llama-3.1-8B", draft, 3, 800, 2,
                                     [2, 8, 32, 64], [], "Other stack 1.0")
        setup = profiles.series_setup(s, made)
        series.append(replace(s, speedup=[setup.speedup(b, 3, alpha) for b in s.batch_sizes]))
    fit = profiles.fit_stack("Other stack 1.0", costmodel.SERVING, series)
    assert fit.row_overhead_s == pytest.approx(120e-6, abs=2e-6) and fit.max_error < 0.01
    assert all(x == pytest.approx(120e-6, abs=2e-6) for _, x, _ in fit.held_out)
    assert profiles.fit_stack(profiles.BASE_STACK, costmodel.SERVING, series) is None      # the fit's own stack
    assert profiles.stack_calibration("Other stack 1.0", costmodel.SERVING, series).spec_row_overhead_s == fit.row_overhead_s


def test_whatif_cli_published_and_sweeps_reports(capsys):
    rc, out, err = _whatif(capsys, "--published", "--json")
    assert rc == 0, err
    comps = json.loads(out)["comparisons"]
    assert {c["model"] for c in comps} == {"calibrated", "calibrated, no stack fit", "ideal"}
    assert all(c["label"] == "published measurement" and c["source"] and c["stack"] for c in comps)
    # the SGLang series: the stack-fitted model closer than the pass-time fit alone, that closer than ideal
    err = {(c["model"], c["series"]): c["max_abs_error"] for c in comps}
    for sid in ("eagle3-table4-eagle", "eagle3-table4-eagle3"):
        assert err[("calibrated", sid)] < err[("calibrated, no stack fit", sid)] < err[("ideal", sid)]
    fits = json.loads(out)["stack_fits"]
    assert [f["stack"] for f in fits] == ["SGLang v0.4.4"]
    assert {h["series"] for h in fits[0]["held_out"]} == set(fits[0]["fitted_to"])
    # a held-out series is never estimated better than when it was part of the fit's data
    assert all(h["max_abs_error"] >= fits[0]["max_abs_error"] - 1e-9 for h in fits[0]["held_out"])
    rc, out, err = _whatif(capsys, "--sweeps")
    assert rc == 0 and "mean error" in out, err


@pytest.mark.parametrize("args, msg", [
    (["--gpu", "GTX 480"], "unknown GPU"),
    (["--gpu", "H200", "--target", "Llama-9B"], "unknown model preset"),
    (["--gpu", "H200", "--draft", "EAGLE:Qwen2.5-7B"], "EAGLE head"),
    (["--gpu", "H200", "--draft", "medusa"], "unknown draft 'medusa': a model preset"),
    (["--gpu", "H200", "--alpha", "1"], "--alpha"),
    (["--gpu", "H200", "--batch-sizes", "0,2"], "--batch-sizes"),
    (["--gpu", "H200", "--depths", "a"], "--depths"),
    (["--gpu", "H200", "--model", "magic"], "--model"),
    (["--gpu", "H200", "--stack", "tgi"], "--stack"),
    (["--bandwidth", "3e12"], "bandwidth"),
    ([], "--gpu"),
])
def test_whatif_cli_refuses_bad_input_in_one_line(capsys, args, msg):
    rc, out, err = _whatif(capsys, *args)
    assert rc == 2 and out == "" and msg in err
    assert err.count("\n") == 1 and err.startswith("specviz: error:")


def test_whatif_cli_subprocess_has_no_traceback():
    r = subprocess.run([sys.executable, "-m", "specviz", "whatif", "--gpu", "H100 SXM", "--target", "Nope"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
