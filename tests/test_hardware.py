"""Calibration, the sampler without NVML, derived metrics, knee detection, what-if presets, sweep CLI."""
import builtins
import json
import re
import time
from dataclasses import replace

import pytest

from specviz.hardware import device as hw
from specviz.hardware import presets, profiles
from specviz.hardware import roofline as rf


@pytest.mark.parametrize("knee", [8, 40, 200])
def test_find_knee_on_synthetic_curves(knee):
    a = 0.01
    ns = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    ts = [max(a, a * n / knee) * (1 + 0.02 * (i % 2)) for i, n in enumerate(ns)]
    assert hw.find_knee(ns, ts) == pytest.approx(knee, rel=0.15)


def _block(names):
    real = builtins.__import__

    def fake(name, *a, **k):
        if name.split(".")[0] in names:
            raise ImportError(name)
        return real(name, *a, **k)
    return fake


def test_sampler_without_nvml_falls_back_to_psutil(monkeypatch):
    monkeypatch.setattr(builtins, "__import__", _block({"pynvml"}))
    s = hw.Sampler(hz=50)
    assert s.source == "psutil"
    sample = s.read_once()
    assert sample.util is not None and sample.memory > 0 and sample.power is None


def test_sampler_with_nothing_reports_unavailable_not_zero(monkeypatch):
    monkeypatch.setattr(builtins, "__import__", _block({"pynvml", "psutil"}))
    s = hw.Sampler(hz=50).start()
    try:
        sample = s.read_once()
        assert s.source == "none" and sample.util is None and sample.memory is None
    finally:
        s.stop()
    assert not s.running          # its thread has ended, not only been told to
    s.start().stop(wait=0)        # told to stop, not waited for: started again at once, it samples again
    assert s.start().running
    s.stop()


def test_a_sampler_keeps_as_many_samples_as_it_is_told():
    """gpu-check keeps the whole run's NVML samples (4 Hz for 290 s): a fixed 600 kept its last 150 s."""
    s = hw.Sampler(hz=50, keep=1500)
    assert s.samples.maxlen == 1500 and hw.Sampler(hz=50).samples.maxlen == 600


def test_calibration_turns_its_timings_into_the_right_rates(monkeypatch):
    """The figures follow from what was timed: a copy of size_mb (read + write) and an n × n matmul.
    The timer is replaced (a rate on a shared machine has no bound worth asserting); each timed
    operation still runs, and is checked to do the work the formula counts."""
    import torch

    timed = []

    def fake_timed(fn, device, repeats, best=False):
        out = fn()
        timed.append(out)
        return 0.01 if len(timed) == 1 else 0.002          # 10 ms for the copy, 2 ms for the matmul
    monkeypatch.setattr(hw, "_timed", fake_timed)
    peaks = hw.calibrate(size_mb=4, matmul_n=64, repeats=2)
    copy, product = timed
    assert copy.numel() * 4 == 4 * 2**20 and bool((copy == 1).all())
    assert product.shape == (64, 64)
    assert peaks.bandwidth == pytest.approx(2 * 4 * 2**20 / 0.01)
    assert peaks.flops == pytest.approx(2 * 64**3 / 0.002)
    assert peaks.ridge == pytest.approx(peaks.flops / peaks.bandwidth)
    assert peaks.device == "cpu" and peaks.dtype == str(torch.get_default_dtype()).replace("torch.", "")


def test_calibration_times_each_operation_and_keeps_the_fastest(monkeypatch):
    """The real timing path (`_timed`, `timed_once`) under a scripted clock: each operation runs once
    untimed, then `repeats` times between two clock reads, and the fastest duration makes the rate (a
    peak: the medians of a calibration beside other work, kept a week in the cache, read 12 GB/s and
    24 GFLOP/s on a machine that does 33 and 180, and the hardware chart drew MFU at 250 %). The
    clock advances only while a timed operation runs, so each duration is the script's, whatever the
    machine's speed (a real rate on a shared machine has no bound worth asserting)."""
    import types

    copy_s, matmul_s = [0.004, 0.001, 0.002], [0.5, 0.1, 0.3]           # fastest 0.001 and 0.1
    durations, now, reads = iter(copy_s + matmul_s), [100.0], []

    def perf_counter():
        reads.append(now[0])
        if len(reads) % 2:                     # a duration starts: the operation takes the next one
            now[0] += next(durations, 0.0)
        return reads[-1]
    # the wall clock stays real: a hardware sampler left running by an earlier test reads it meanwhile
    monkeypatch.setattr(hw, "time", types.SimpleNamespace(perf_counter=perf_counter, time=time.time))
    peaks = hw.calibrate(size_mb=4, matmul_n=32, repeats=3)
    assert len(reads) == 2 * (len(copy_s) + len(matmul_s))          # no warm-up run was timed
    assert peaks.bandwidth == pytest.approx(2 * 4 * 2**20 / 0.001)
    assert peaks.flops == pytest.approx(2 * 32**3 / 0.1)


def test_on_a_gpu_calibration_times_by_the_device_clock(monkeypatch):
    """On CUDA an operation is timed by CUDA events around CUDA_CALLS calls back to back, and the host's
    clock is not read: a 130 µs copy would read a tenth longer by it (a launch and a wait), the bandwidth
    low and MBU high. Faked events: each records the number of calls made so far, 0.1 ms a call."""
    import contextlib
    import types

    import torch

    calls = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self):
            self.at = len(calls)

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 0.1 * (other.at - self.at)
    fake = types.SimpleNamespace(Event=Event, synchronize=lambda d: None, device=lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch, "cuda", fake)
    monkeypatch.setattr(hw, "time", types.SimpleNamespace(perf_counter=lambda: pytest.fail("host clock read"),
                                                          time=time.time))
    secs = hw._timed(lambda: calls.append(1), torch.device("cuda"), repeats=3)
    assert len(calls) == 1 + 3 * hw.CUDA_CALLS and hw.CUDA_CALLS >= 4      # a warm-up call, then 3 timed runs
    assert secs == pytest.approx(1e-4)


def test_regimes():
    peaks = hw.Peaks("test", bandwidth=100.0, flops=1000.0, dtype="f32")
    assert hw.step_metrics(flops=10, nbytes=100, seconds=1.0, peaks=peaks).regime == "memory-bound"
    assert hw.step_metrics(flops=2000, nbytes=100, seconds=2.0, peaks=peaks).regime == "compute-bound"
    assert hw.step_metrics(flops=10, nbytes=100, seconds=5.0, peaks=peaks).regime == "overhead-bound"
    m = hw.step_metrics(flops=500, nbytes=50, seconds=1.0, peaks=peaks)
    assert m.mbu == pytest.approx(0.5) and m.mfu == pytest.approx(0.5)
    assert hw.step_metrics(1, 1, 1, None).mbu is None


def test_presets_and_whatif():
    assert presets.GPUS["H100 SXM"].ridge == pytest.approx(295, rel=0.01)
    assert presets.GPUS["H200"].ridge == pytest.approx(206, rel=0.01)
    assert 130e6 < presets.MODELS["SmolLM2-135M"].params < 140e6
    assert 6.5e9 < presets.MODELS["Qwen2.5-7B"].params < 8e9
    # bf16 weights, 2 FLOPs per parameter: the knee sits near the ridge / 1 FLOP-per-byte
    h200 = presets.GPUS["H200"]
    knee = rf.predicted_knee(presets.MODELS["Qwen2.5-7B"], h200.bandwidth, h200.flops, context=256)
    assert 120 < knee < 260
    # memory-bound step model: flat up to 64 tokens per pass, linear after
    step = lambda n: max(1.0, n / 64)  # noqa: E731
    assert rf.best_depth(1, 0.8, 0.05, step) >= 4
    assert rf.best_depth(64, 0.8, 0.05, step) == 0
    cross = rf.crossover_batch(0.8, 0.05, step)
    assert cross is not None and 4 <= cross <= 64


def test_sweep_cli_end_to_end(tiny_paths, tmp_path):
    from test_models_and_cli import cli

    out = tmp_path / "sweep"
    r = cli("sweep", "--target", tiny_paths["target"], "--draft", "layerskip:1-2", "--batch-sizes", "1,2",
            "--depths", "0,2", "--max-new-tokens", "4", "--out", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "sweep.json").read_text())
    assert len(data["rows"]) == 4 and set(data["best_depth"]) == {"1", "2"}
    assert (out / "sweep.csv").read_text().startswith("batch_size,depth,tokens_per_s")
    assert "plotly" in (out / "sweep.html").read_text()[:20000].lower()
    assert "plotly" in (out / "crossover.html").read_text()[:20000].lower()
    assert "crossover_batch" in data
    # where it ran and where its files went (a default folder is written over)
    assert data["cpu"].endswith("cores)") and data["device_name"].startswith("cpu")
    assert f"wrote sweep.csv, sweep.json, recorded.json, sweep.html, crossover.html in {out}/" in r.stderr
    # recorded.json: the sweep as assets/sweeps/ keeps it, with the command that measures it again
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "mine.json").write_text((out / "recorded.json").read_text())
    (sw,) = profiles.load_sweeps(tmp_path / "assets")
    cell = {(r["batch_size"], r["depth"]): r for r in data["rows"]}
    assert sw.batch_sizes == [1, 2] and sw.depths == [0, 2] and sw.new_tokens == 4
    assert sw.tokens_per_s == [[round(cell[b, k]["tokens_per_s"], 2) for k in (0, 2)] for b in (1, 2)]
    drafted = cell[1, 2]["drafted"] + cell[2, 2]["drafted"]
    assert drafted and sw.acceptance == {2: round((cell[1, 2]["accepted"] + cell[2, 2]["accepted"]) / drafted, 3)}
    assert sw.prompt_tokens == len(data["prompt_ids"]) and sw.device == data["device_name"]
    assert sw.command.startswith("python -m specviz sweep --compile ") and "--batch-sizes 1,2 --depths 0,2" in sw.command
    # a tiny random model has no preset's shape: the record keeps its path, and the what-if says why it skips it
    assert sw.target == tiny_paths["target"] and "has the shape of no what-if preset" in profiles.cannot_model(sw)
    bad = cli("sweep", "--target", tiny_paths["target"], "--draft", "ngram", "--depths", "0,99")
    assert bad.returncode != 0 and "depths" in bad.stderr


def test_a_record_names_the_presets_of_its_models_shapes(tmp_path, monkeypatch):
    """The what-if models presets: a draft model of a preset's shape is named by it, as the target is;
    a GPU sweep's record names the GPU, not its host CPU."""
    from types import SimpleNamespace

    from specviz.cli import hardware_cmds

    small, mid = presets.MODELS["SmolLM2-135M"], presets.MODELS["SmolLM2-360M"]
    args = SimpleNamespace(compile="auto", target="smollm2-360m-local", draft="/models/my-135m", device="cuda",
                           prompt="hi", max_new_tokens=8, repeats=1)
    rows = [{"batch_size": 1, "depth": k, "tokens_per_s": 10.0 + k, "drafted": 4 * k, "accepted": k} for k in (0, 1)]
    pair = SimpleNamespace(target_spec=mid, draft_spec=small, draft=object(), fast=SimpleNamespace(label="graphs"),
                           target=SimpleNamespace(dtype="torch.bfloat16", device="cuda"))
    monkeypatch.setattr(hardware_cmds, "device_name", lambda d: "cuda: NVIDIA H200")
    monkeypatch.setattr(hardware_cmds, "cpu_name", lambda: "AMD EPYC (16 cores)")
    hardware_cmds._write_record(tmp_path / "r.json", args, rows, [1], [0, 1], pair, 12)
    rec = json.loads((tmp_path / "r.json").read_text())
    assert (rec["target"], rec["draft"]) == ("SmolLM2-360M", "SmolLM2-135M")
    assert rec["about"].startswith("Measured with SpecViz on NVIDIA H200 (host AMD EPYC (16 cores)), bfloat16")
    assert rec["acceptance_rate"] == {"1": 0.25} and rec["tokens_per_s"] == [[10.0, 11.0]]
    # a draft that is no model (n-gram, layer-skip) keeps its name
    lookup = SimpleNamespace(**{**vars(pair), "draft": None, "draft_spec": replace(mid, n_layers=24)})
    hardware_cmds._write_record(tmp_path / "n.json", SimpleNamespace(**{**vars(args), "draft": "layerskip:12-17",
                                                                        "device": None}), rows, [1], [0, 1], lookup, 12)
    assert json.loads((tmp_path / "n.json").read_text())["draft"] == "layerskip:12-17"


def test_sweep_repeats_keep_each_cells_median_run(tiny_paths, tmp_path, monkeypatch):
    from specviz.__main__ import main
    from specviz.cli import hardware_cmds

    real, speeds, order = hardware_cmds._sweep_cell, iter([30.0, 10.0, 50.0, 40.0, 20.0, 60.0]), []

    def scripted(pair, prompt, b, k, *rest):
        row, rows, drafter = real(pair, prompt, b, k, *rest)
        order.append((b, k))
        speed = next(speeds)
        return {**row, "tokens_per_s": speed}, rows, speed          # the run's speed stands for its drafter
    monkeypatch.setattr(hardware_cmds, "_sweep_cell", scripted)
    counted = []
    monkeypatch.setattr(hardware_cmds.Dial, "count", lambda self, drafter: counted.append(drafter))
    out = tmp_path / "sw"
    assert main(["sweep", "--target", tiny_paths["target"], "--draft", "ngram", "--batch-sizes", "1",
                 "--depths", "0,2", "--max-new-tokens", "3", "--repeats", "3", "--out", str(out)]) == 0
    assert order == [(1, 0), (1, 2)] * 3                      # rounds over the grid, not one cell thrice
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert [(r["tokens_per_s"], r["runs"]) for r in rows] == [(30.0, 3), (40.0, 3)]   # medians of 30/50/20, 10/40/60
    assert counted == [30.0, 40.0]            # a synthetic draft's counters: the kept runs', not all six
    rec = json.loads((out / "recorded.json").read_text())
    assert rec["tokens_per_s"] == [[30.0, 40.0]] and "--repeats 3" in rec["command"] and "median of 3" in rec["about"]


def test_roofline_on_a_shape_ref_writes_a_profile(tmp_path):
    from test_models_and_cli import cli

    from specviz.hardware.profiles import load_profile

    prof = tmp_path / "p.json"
    r = cli("roofline", "--target", "shape:SmolLM2-135M", "--max-tokens", "4", "--repeats", "1",
            "--context", "16", "--out", str(tmp_path / "r"), "--profile", str(prof))
    assert r.returncode == 0, r.stderr
    p = load_profile(prof)
    assert p.tokens_per_pass == [1, 2, 4] and p.spec.n_layers == 30 and p.predicted_knee > 0
    assert 0 < json.loads(prof.read_text())["mbu_at_1_token"] < 5
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", p.recorded)          # the day, so a shipped copy can say when
    out = json.loads((tmp_path / "r" / "roofline.json").read_text())      # paired: one ratio per repeat
    assert len(out["pass_vs_roofline_pairs"]) == 1 and out["pass_vs_roofline_1_token"] == out["pass_vs_roofline_pairs"][0]
    bad = cli("generate", "--target", "shape:SmolLM2-135M", "--draft", "ngram", "--prompt", "hi")
    assert bad.returncode != 0 and "has random weights: use it with `roofline`, or as a target" in bad.stderr
    bad = cli("roofline", "--target", "shape:GPT-5")
    assert bad.returncode != 0 and "unknown shape" in bad.stderr


def test_peaks_are_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    calls = []

    def fake_calibrate(device, dtype, **kw):
        calls.append(kw)
        return hw.Peaks(device.type, 1e10 * len(calls), 1e11, "float32")

    monkeypatch.setattr(hw, "calibrate", fake_calibrate)
    # a quiet machine (the tests' own may be busy: then every call re-measures, tested in test_fastpath.py)
    monkeypatch.setattr(hw, "load_now", lambda: {"load": 0.0, "cpus": 2, "at": __import__("time").time()})
    first = hw.cached_peaks()
    assert hw.cached_peaks() == first and len(calls) == 1          # the second call reads the cache
    assert hw.cached_peaks(refresh=True).bandwidth == 2e10          # `calibrate` measures again
    assert hw.cached_peaks().bandwidth == 2e10 and len(calls) == 2
    key = next(iter(json.loads((tmp_path / "peaks.json").read_text())))
    assert "cpu" in key and "float32" in key and "torch" in key
    (tmp_path / "peaks.json").write_text("{broken")                  # a damaged cache is measured anew
    assert hw.cached_peaks().bandwidth == 3e10


def test_memory_and_power_readout_never_invents_zero():
    from specviz.ui.counters import device_md

    assert "unavailable" in device_md("en", None)
    assert "unavailable" in device_md("en", hw.Sample(0.0, None, None, None, "none"))
    cpu = device_md("en", hw.Sample(0.0, 50.0, 2**30, None, "psutil"))
    assert "process memory (RSS) 1.00 GiB" in cpu and "power unavailable" in cpu
    gpu = device_md("en", hw.Sample(0.0, 99.0, 3 * 2**30, 215.4, "nvml"))
    assert "GPU memory 3.00 GiB" in gpu and "215 W" in gpu
    assert "در دسترس نیست" in device_md("fa", hw.Sample(0.0, 50.0, 2**30, None, "psutil"))
