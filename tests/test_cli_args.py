"""The CLI refuses a bad value before anything loads or runs, in one sentence naming its flag, exit 2, and
writes nothing (a first engineer's review found these reaching tracebacks or, worse, exit 0)."""
import subprocess
import sys
from pathlib import Path

import pytest

from specviz.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, said", [
    (["calibrate", "--device", "meta"], "argument --device: must be cpu, cuda or cuda:N, not 'meta'"),
    (["roofline", "--max-tokens", "-4"], "argument --max-tokens: must be a whole number from 1 to 8192, not '-4'"),
    (["roofline", "--repeats", "0"], "argument --repeats: must be a whole number from 1 to 50"),
    (["roofline", "--out", "/proc/nope/x"], "argument --out: cannot write under /proc"),
    (["roofline", "--profile", "/tmp"], "argument --profile: /tmp is a folder, not a file"),
    (["bench-hf", "--repeats", "0"], "argument --repeats: must be a whole number from 1 to 20"),
    (["sweep", "--max-new-tokens", "0"], "argument --max-new-tokens: must be a whole number from 1 to 4096"),
    (["frontier", "--out", ""], "argument --out: needs a folder name, not an empty string"),
    (["generate", "--seed", "99999999999999999999999"], "argument --seed: must be a whole number from 0 to"),
    (["tiny-draft", "--out", "/tmp/specviz-never", "--layers", "-1"], "argument --layers: must be a whole number"),
    (["tiny-draft", "--out", "/tmp/specviz-never", "--hidden", "12"], "argument --hidden: must be a multiple of 8"),
    # a flag the chosen mode or policy would ignore
    (["generate", "--threshold", "5"], "--policy fixed reads no --threshold; it is read by"),
    (["generate", "--draft", "synthetic:0.7", "--temperature", "0.5"], "the synthetic draft proposes the target's"),
    (["whatif", "--published", "--gpu", "T4"], "--published compares the models with every measurement it holds; "
                                              "it takes no --gpu"),
    (["whatif", "--published", "--sweeps"], "argument --sweeps: not allowed with argument --published"),
    (["kernels", "--quick", "--target", "foo"], "--quick times two small fixed shapes"),
    (["frontier", "--users", "1,,4"], "argument --users: must be whole numbers from 1 to 64 separated by commas"),
    (["sweep", "--depths", "0,99"], "argument --depths: must be whole numbers from 0 to 16 separated by commas"),
    (["bench-classroom", "--url", "http://127.0.0.1:9"], "--url http://127.0.0.1:9: no SpecViz app answered there"),
    # the door's sentences (the page's too), led by the flag that set the value
    (["generate", "--depth", "20"], "argument --depth: speculation depth must be from 0 to 16; 20 is out of range"),
    (["generate", "--batch-size", "0"], "argument --batch-size: batch size (rows) must be from 1 to 64"),
    (["generate", "--temperature", "-1"], "argument --temperature: temperature must be a number from 0 to 2"),
    (["bench-vllm", "--max-new-tokens", "0"], "argument --max-new-tokens: max new tokens must be from 1 to 512"),
    (["bench-classroom", "--users", "0"], "the number of users (--users) must be from 1 to"),
    # 1000 threads on a 2-core machine ran for minutes before a word; a port past 65535 reached the launch
    (["bench-vllm", "--threads", "1000"], "argument --threads: must be a whole number from 0 to"),
    (["bench-vllm", "--threads", "-5"], "argument --threads: must be a whole number from 0 to"),
    (["bench-vllm", "--port", "70000"], "argument --port: must be a whole number from 0 to 65535, not '70000'"),
    # a flag only another mode reads is refused, not ignored (sweep --vllm-eager ran our engine as if not given)
    (["sweep", "--vllm-eager"], "--vllm-eager is read only with --engine vllm; our engine takes no such setting"),
    (["sweep", "--repeats", "0"], "argument --repeats: must be a whole number from 1 to 9"),
    (["sweep", "--repeats", "99", "--engine", "vllm"], "argument --repeats: must be a whole number from 1 to 9"),
    (["frontier", "--schedule", "1-4:2", "--vllm-eager"], "--schedule and --vllm-eager are read only with --engine"),
    (["whatif", "--gpu", "H200", "--model", "ideal", "--stack", "sglang"], "--stack picks the calibrated model's"),
    (["download", "--all", "--preset", "x"], "argument --preset: not allowed with argument --all"),
    # a custom GPU's numbers, each by its flag and its bounds (1e16 was "both positive")
    (["whatif", "--bandwidth", "1e16", "--flops", "1e15"], "--bandwidth must be from 1e+09 to 1e+14 bytes/s, not 1e+16"),
    (["whatif", "--bandwidth", "3e12", "--flops", "1e20"], "--flops must be from 1e+09 to 1e+17 FLOP/s, not 1e+20"),
    (["whatif", "--bandwidth", "3e12"], "--bandwidth goes with --flops: a custom GPU needs both"),
    # a model written as a path that is not there, named by its flag before the other model loads
    (["generate", "--draft", "/nonexistent/model"], "argument --draft: there is no model at /nonexistent/model"),
    (["roofline", "--target", "./no-such-model"], "argument --target: there is no model at ./no-such-model"),
    # a list starting with a minus read as a flag: "expected one argument"
    (["sweep", "--depths", "-1,2"], "argument --depths: must be whole numbers from 0 to 16 separated by commas"),
    (["whatif", "--gpu", "H200", "--batch-sizes", "-4,8"], "--batch-sizes must be whole numbers from 1 to 65536"),
    (["generate", "--depth", "-3"], "argument --depth: speculation depth must be from 0 to 16; -3 is out of range"),
    (["generate", "--policy", "adaptive", "--max-depth", "99"], "argument --max-depth: adaptive max depth must be"),
    (["generate", "--policy", "batch-table", "--batch-table", "1:99"], "argument --batch-table: batch table needs"),
    (["generate", "--policy", "nosuch"], "argument --policy: unknown policy 'nosuch'"),
])
def test_bad_values_are_refused_in_one_sentence(argv, said, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specviz: error: " + said) and "\n" not in err and "Traceback" not in err


def test_a_wrong_compile_variable_is_named(monkeypatch, capsys):
    monkeypatch.setenv("SPECVIZ_COMPILE", "bogus")
    assert main(["bench-classroom", "--users", "2"]) == 2
    assert capsys.readouterr().err.strip() == ("specviz: error: SPECVIZ_COMPILE must be one of auto, on, off, static, "
                                               "not 'bogus'")
    assert main(["generate", "--prompt", "Hi"]) == 2 and "SPECVIZ_COMPILE must be" in capsys.readouterr().err
    # the commands that decode nothing are not stopped by it, nor is any command's --help
    assert main(["whatif", "--gpu", "H200", "--json"]) == 0 and "SPECVIZ_COMPILE" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as shown:
        main(["generate", "--help"])
    assert shown.value.code == 0


def test_specviz_debug_0_keeps_the_one_line_error(monkeypatch, capsys):
    import specviz.__main__ as entry

    def boom(args):
        raise RuntimeError("disk full\nsecond line")
    monkeypatch.setattr(entry.whatif, "run", boom)       # add_parser reads it when main builds the parser
    monkeypatch.setenv("SPECVIZ_DEBUG", "0")
    assert main(["whatif", "--gpu", "H200"]) == 1
    assert capsys.readouterr().err.strip() == "specviz: error: RuntimeError: disk full"
    monkeypatch.setenv("SPECVIZ_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["whatif", "--gpu", "H200"])


def test_cuda_is_refused_where_torch_sees_no_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["calibrate", "--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_tiny_draft_writes_only_into_a_new_or_empty_folder(tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "config.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    for out, said in ((used, "is not empty"), (tmp_path / "notes.txt", "is a file, not a folder")):
        assert main(["tiny-draft", "--out", str(out)]) == 2
        assert said in capsys.readouterr().err
    assert (used / "config.json").read_text() == "{}" and (tmp_path / "notes.txt").read_text() == "mine"


def test_gpu_check_refuses_before_it_runs(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-check"), "--dry-run", *args],
                              capture_output=True, text=True, timeout=120)
    r = run("--out", str(tmp_path / "gc"), "--only", "nonsense")
    assert r.returncode == 2 and "--only names no step called nonsense; the steps are calibrate" in r.stderr
    assert not (tmp_path / "gc").exists()                  # nothing written, not even its folder
    r = run("--out", str(tmp_path / "gc"), "--tokenizer", str(tmp_path / "none"))
    assert r.returncode == 2 and "is not a folder" in r.stderr
    r = run("--out", "")
    assert r.returncode == 2 and "needs a folder name" in r.stderr and "Traceback" not in r.stderr


def test_bench_vllm_without_vllm_says_so_before_our_model_loads(monkeypatch, capsys):
    from specviz.pairs import pipeline
    from specviz.vllm import launcher

    monkeypatch.setattr(launcher, "vllm_installed", lambda venv=launcher.VENV: False)
    monkeypatch.setattr(pipeline, "load_pair", lambda *a, **k: pytest.fail("loaded a model first"))
    assert main(["bench-vllm", "--users", "1", "--max-new-tokens", "4", "--repeats", "1"]) == 2
    assert capsys.readouterr().err.strip().startswith("specviz: error: vLLM is not installed (")


def test_the_apps_port_is_refused_by_the_flag_or_the_variable_that_set_it(monkeypatch, capsys):
    import app

    for argv, env, said in ((["--port", "70000"], None, "argument --port: must be a whole number from 1 to 65535"),
                            ([], "abc", "SPECVIZ_PORT must be a whole number from 1 to 65535, not 'abc'")):
        if env is not None:
            monkeypatch.setenv("SPECVIZ_PORT", env)
        with pytest.raises(SystemExit) as exited:
            app.parse_args(argv)
        assert exited.value.code == 2 and said in capsys.readouterr().err
    monkeypatch.setenv("SPECVIZ_PORT", "9000")
    assert app.parse_args([]).port == 9000 and app.parse_args(["--port", "8080"]).port == 8080


@pytest.mark.parametrize("depth", ["-1", "17", "four"])
def test_the_launched_vllm_depth_is_refused_outside_0_to_16(depth, capsys):
    """A negative k once started a vLLM server without speculation, and said nothing."""
    import app

    with pytest.raises(SystemExit) as exited:
        app.parse_args(["--vllm-launch", "--vllm-depth", depth])
    assert exited.value.code == 2 and "argument --vllm-depth: must be a whole number from 0 to 16" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["bench-hf", "--prompt", ""], ["sweep", "--prompt", " "]])
def test_an_empty_prompt_is_refused_before_a_model_loads(argv, monkeypatch, capsys):
    """bench-hf loaded its pair for 9 s before saying the prompt was empty."""
    from specviz.pairs import pipeline

    monkeypatch.setattr(pipeline, "load_pair", lambda *a, **k: pytest.fail("loaded a model first"))
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == ("specviz: error: the prompt is empty: type something for the model "
                                               "to continue")


def test_a_missing_model_path_names_the_variable_that_gave_it(monkeypatch, capsys):
    monkeypatch.setenv("SPECVIZ_TARGET", "/nope/model")
    assert main(["generate"]) == 2
    assert capsys.readouterr().err.strip() == ("specviz: error: argument --target: there is no model at /nope/model "
                                               "(given by SPECVIZ_TARGET): the path does not exist")
    monkeypatch.delenv("SPECVIZ_TARGET")
    assert main(["generate", "--draft", "~nosuchuser/m"]) == 2          # no home directory: still one sentence
    assert "argument --draft: there is no model at ~nosuchuser/m" in capsys.readouterr().err
