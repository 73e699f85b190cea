"""The acceptance dial on the command line: `--draft synthetic:A` in bench-hf, sweep and bench-classroom is the
target's own greedy output row for row, its reference is paid apart (`reference_s`), a shape with a
tokenizer folder runs it, and what cannot run it says so in one sentence. Also the class reference helper
(`serve.workload.class_reference`)."""
import json

import pytest
import torch
from test_models_and_cli import assert_clean_exit, cli

from specviz.engine.request import Knobs, Request
from specviz.hardware.presets import MODELS
from specviz.hardware.roofline import ModelSpec
from specviz.limits import Limits
from specviz.serve.gate import DeviceGate
from specviz.serve.scheduler import Scheduler
from specviz.serve.workload import class_reference, users_at_once


def _synthetic_block(res: dict, rate: float) -> None:
    syn = res["synthetic"]
    assert syn["rate"] == rate and syn["reference_s"] > 0
    assert syn["realigned"] == 0 and syn["unreferenced"] == 0
    assert "synthetic draft (A = " in syn["note"] and "drafting is free" in syn["note"]


def test_bench_hf_with_the_dial_is_the_targets_own_and_says_why_assisted_is_not_run(tiny_paths, greedy):
    r = cli("bench-hf", "--target", tiny_paths["target"], "--draft", "synthetic:0.7", "--depth", "3",
            "--batch-size", "2", "--max-new-tokens", "8", "--repeats", "1", "--raw", "--prompt", "the quick")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["identical"] is True and res["lossless"] is True
    assert len(res["outputs"]) == 2
    for ids, out in zip(res["prompt_ids"], res["outputs"]):
        assert out == greedy(ids, 8)
    _synthetic_block(res, 0.7)
    assert 0 < res["acceptance_rate"] <= 1
    # transformers' assisted generation needs a draft model: no such arm, and the output says why
    assert "assisted" not in res["tokens_per_s"] and res["vs_assisted"] is None
    assert "synthetic draft" in res["assisted_skipped"] and "assisted: not run" in r.stdout


def test_sweep_with_the_dial_is_the_targets_own_in_every_cell(tiny_paths, greedy, tmp_path):
    out = tmp_path / "sweep"
    r = cli("sweep", "--target", tiny_paths["target"], "--draft", "synthetic:0.5", "--batch-sizes", "1,3",
            "--depths", "0,2", "--max-new-tokens", "6", "--prompt", "the quick brown", "--out", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "sweep.json").read_text())
    want = greedy(data["prompt_ids"], 6)
    cells = {(c["batch_size"], c["depth"]): c["rows"] for c in data["outputs"]}
    assert set(cells) == {(1, 0), (1, 2), (3, 0), (3, 2)}
    assert all(row == want for rows in cells.values() for row in rows)
    assert [len(cells[(b, 2)]) for b in (1, 3)] == [1, 3]
    _synthetic_block(data, 0.5)
    assert json.loads(r.stdout.strip().splitlines()[-1])["synthetic"]["reference_s"] == data["synthetic"]["reference_s"]
    # the timed rows are the sweep's own (the reference is in none of them) and the CSV keeps its columns
    assert (out / "sweep.csv").read_text().startswith("batch_size,depth,tokens_per_s")
    assert all(r["acceptance_rate"] is not None for r in data["rows"] if r["depth"] > 0)


def test_bench_classroom_with_the_dial_serves_three_users_at_once_exactly(tiny_paths, greedy):
    # users submit from their own threads, as browsers do, and may be admitted in two waves: 8 new tokens
    # could end before a busy machine's third thread joined; 32 leave it steps to join
    r = cli("bench-classroom", "--target", tiny_paths["target"], "--draft", "synthetic:0.7", "--users", "3",
            "--depth", "3", "--max-new-tokens", "32", "--separate-concurrency", "2")
    assert_clean_exit(r)
    final = json.loads(r.stdout.strip().splitlines()[-1])
    assert final["done"] and final["identical"] is True
    assert final["shared"]["largest_shared_batch"] == 3
    assert len(final["outputs"]) == 3 and len({tuple(p) for p in final["prompt_ids"]}) == 3
    for ids, out in zip(final["prompt_ids"], final["outputs"]):
        assert out == greedy(ids, 32)
    _synthetic_block(final, 0.7)


def test_a_shape_with_a_tokenizer_folder_runs_the_dial_through_bench_hf(loaded, tmp_path, monkeypatch, capsys):
    """`shape:NAME@DIR`: random weights with a preset's shape and the tokenizer saved in DIR. The smallest
    real preset (SmolLM2-135M) costs tens of seconds here, so the shape is a tiny preset of the same kind."""
    from specviz.__main__ import main

    folder = tmp_path / "tok"
    loaded["target"].tokenizer.save_pretrained(folder)
    monkeypatch.setitem(MODELS, "Tiny-test", ModelSpec("Tiny-test", 2, 64, 4, 2, 16, 128, 320, True))
    torch.manual_seed(0)            # the random weights, so the run is the same every time
    rc = main(["bench-hf", "--target", f"shape:Tiny-test@{folder}", "--draft", "synthetic:0.8", "--depth", "3",
               "--max-new-tokens", "8", "--repeats", "1", "--raw", "--prompt", "the quick", "--compile", "off"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0
    assert res["identical"] is True and res["lossless"] is True and len(res["outputs"][0]) == 8
    _synthetic_block(res, 0.8)
    assert res["acceptance_rate"] is not None


@pytest.mark.parametrize("argv, needle", [
    (["generate", "--draft", "synthetic:0.7", "--temperature", "0.8", "--prompt", "hi"], "temperature 0 only"),
    (["bench-classroom", "--draft", "synthetic:0.7", "--url", "http://127.0.0.1:9/"], "synthetic draft runs in"),
    (["sweep", "--draft", "synthetic:0.7", "--engine", "vllm"], "vLLM has no lossless synthetic draft"),
])
def test_what_cannot_run_the_dial_says_so_in_one_sentence(tiny_paths, capsys, argv, needle):
    from specviz.__main__ import main

    rc = main([argv[0], "--target", tiny_paths["target"], *argv[1:]])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_class_reference_is_one_depth0_class_ending_where_the_run_ends(make_pair, prompts, reference):
    """The reference class runs through the run's own scheduler, so it stops at EOS where the run's rows do;
    then a synthetic class with each user's own seed is the target's own, with nothing re-aligned."""
    pair = make_pair("synthetic:0.6")
    full = reference(0, 16)
    stop = full[5]                                     # an EOS the first prompt reaches within its 16 tokens
    built = []

    def engine():
        eng = pair.engine(eos_ids=[stop])
        built.append(eng)
        return eng
    sched = Scheduler(engine, Limits(), DeviceGate(), pair.target_spec, name="test-reference")
    try:
        refs, secs = class_reference(sched, prompts[:3], 16)
        assert secs > 0 and set(refs) == {tuple(p) for p in prompts[:3]}
        for i, p in enumerate(prompts[:3]):
            assert list(refs[tuple(p)]) == reference(i, 16, eos=stop)
        assert len(refs[tuple(prompts[0])]) == full.index(stop) + 1 < 16
        reqs = [Request([p], Knobs(4, 1), 16, seed=i, references=refs) for i, p in enumerate(prompts[:3])]
        _, runs = users_at_once(sched, reqs, together=True)
    finally:
        sched.close()
    for i, run in enumerate(runs):
        assert run.error is None and run.outputs == reference(i, 16, eos=stop)
    assert sum(run.totals.proposed for run in runs) > 0
    assert sum(e.drafter.realigned for e in built) == 0 and sum(e.drafter.unreferenced for e in built) == 0
