"""Model references, bad input and the CLI contract."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specviz.engine.kvcache import RaggedCache
from specviz.pairs.models import ModelError, load_model, parse_draft_ref
from specviz.pairs.pipeline import encode_prompt, load_pair

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "specviz", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.parametrize("ref", ["no/such-model", "/nonexistent/dir", "missing.gguf", "", "bad ref!"])
def test_unknown_model_is_a_clear_error(ref):
    with pytest.raises(ModelError):
        load_model(ref, "cpu")


def test_mismatched_vocabulary_is_refused(tiny_paths, loaded):
    with pytest.raises(ModelError, match="different tokenizers"):
        load_pair(tiny_paths["target"], tiny_paths["foreign"], target=loaded["target"], draft=loaded["foreign"])


@pytest.mark.parametrize("ref", ["layerskip:3-1", "layerskip:abc", "layerskip:0-99"])
def test_bad_layerskip(tiny_paths, loaded, ref):
    with pytest.raises(ModelError):
        load_pair(tiny_paths["target"], ref, target=loaded["target"])


def test_draft_refs_parse():
    assert parse_draft_ref("ngram").kind == "ngram"
    assert parse_draft_ref("layerskip:12-17").skip == (12, 17)
    assert parse_draft_ref("org/model").kind == "model"


def test_empty_prompt_refused(loaded):
    from specviz.limits import LimitError

    with pytest.raises(LimitError, match="empty"):
        encode_prompt(loaded["target"].tokenizer, "   ")
    with pytest.raises(LimitError, match="characters long"):
        encode_prompt(loaded["target"].tokenizer, "a" * 200_000)


def test_holes_do_not_change_logits(loaded, prompts):
    """A row with holes mid-cache and a left-padded neighbour gives the clean sequence's logits."""
    model = loaded["target"].model
    a, b = prompts[1], prompts[2]
    clean = model(torch.tensor([a])).logits[0, -1]
    c = RaggedCache(2, torch.device("cpu"), torch.float32)
    # row 0: a[:3], then two junk tokens that become holes, then the rest of a
    c.forward(model, torch.tensor([a[:3], [0, 0, b[0]]]), torch.tensor([[1, 1, 1], [0, 0, 1]]).bool())
    c.forward(model, torch.tensor([[7, 9], [b[1], b[2]]]), torch.tensor([[1, 1], [1, 1]]).bool())
    c.invalidate(torch.tensor([0, 0]), torch.tensor([3, 4]))
    rest = a[3:]
    tail_b = (b[3:] + [0] * len(rest))[: len(rest)]
    valid_b = [1] * len(b[3:]) + [0] * (len(rest) - len(b[3:]))
    out = c.forward(model, torch.tensor([rest, tail_b]), torch.tensor([[1] * len(rest), valid_b[: len(rest)]]).bool())
    assert torch.allclose(out[0, -1], clean, atol=1e-4)
    assert torch.isfinite(out).all()
    before = out[0, -1].clone()
    assert c.compact(min_waste=0.0, min_holes=1)
    assert c.length == int(c.n_valid.max())      # only left padding of the shorter row remains
    again = c.forward(model, torch.tensor([[5], [5]]), torch.tensor([[1], [1]]).bool())
    ref = model(torch.tensor([a + [5]])).logits[0, -1]
    assert torch.allclose(again[0, -1], ref, atol=1e-4)
    assert not torch.allclose(before, ref)


def test_cli_generate_json(tiny_paths):
    r = cli("generate", "--target", tiny_paths["target"], "--draft", "layerskip:1-2", "--prompt", "the quick",
            "--prompt", "memory bound", "--batch-size", "3", "--depth", "3", "--max-new-tokens", "12", "--raw",
            "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    final = lines[-1]
    assert final["done"] is True
    assert len(final["outputs"]) == 3 and all(len(o) == 12 for o in final["outputs"])
    assert final["prompt_ids"][0] == final["prompt_ids"][2]        # prompts reused in order
    for key in ("texts", "tokens_per_s", "acceptance_rate", "flops_ratio"):
        assert key in final
    steps = lines[:-1]
    assert steps and all("rows" in s and "verify_s" in s for s in steps)
    emitted = [sum((row["emitted"] for s in steps for row in s["rows"] if row["row"] == i), []) for i in range(3)]
    assert emitted == final["outputs"]


@pytest.mark.parametrize("args,needle", [
    (["--batch-size", "0"], "batch size"), (["--batch-size", "65"], "batch size"),
    (["--depth", "17"], "depth"), (["--depth", "-1"], "depth"), (["--prompt", "  "], "prompt"),
    (["--policy", "bogus"], "policy"), (["--draft", "layerskip:5-1"], "layerskip"),
    (["--target", "no/such-model-here"], "could not load"), (["--batch-size", "two"], "invalid int"),
])
def test_cli_bad_input_one_line(tiny_paths, args, needle):
    base = ["generate", "--target", tiny_paths["target"], "--draft", "ngram", "--max-new-tokens", "2"]
    r = cli(*base, *args)
    assert r.returncode != 0
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0]


def test_cli_mismatched_vocab(tiny_paths):
    r = cli("generate", "--target", tiny_paths["target"], "--draft", tiny_paths["foreign"], "--max-new-tokens", "2")
    assert r.returncode != 0 and "different tokenizers" in r.stderr


def test_cli_bench_hf_reports_ratios_and_identity(tiny_paths):
    r = cli("bench-hf", "--target", tiny_paths["target"], "--draft", tiny_paths["draft"], "--depth", "2",
            "--max-new-tokens", "8", "--repeats", "1", "--raw", "--prompt", "the quick")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["identical"] is True and res["lossless"] is True and res["divergence"] == {}
    assert res["vs_assisted"] > 0 and res["vs_plain"] > 0 and 0 <= res["overhead_share"] < 1
    assert set(res["tokens_per_s"]) == {"ours_k", "ours_k0", "plain", "assisted"}


ABORTS = ("terminate called", "Aborted", "core dumped", "Traceback", "Fatal Python error")


def assert_clean_exit(r) -> None:
    """Exit code 0 and no abort or traceback on stderr (a thread left inside torch at interpreter exit
    aborts the process with "terminate called without an active exception", exit code 134 / -6)."""
    assert r.returncode == 0, r.stderr[-2000:]
    assert not [a for a in ABORTS if a in r.stderr], r.stderr[-2000:]


def test_cli_bench_classroom_exits_cleanly(tiny_paths):
    r = cli("bench-classroom", "--target", tiny_paths["target"], "--draft", tiny_paths["draft"], "--users", "3",
            "--depth", "2", "--max-new-tokens", "8", "--separate-concurrency", "2")
    assert_clean_exit(r)
    final = json.loads(r.stdout.strip().splitlines()[-1])
    assert final["done"] and final["identical"] is True and final["shared"]["tokens"] == 3 * 8


def test_cli_whatif_exits_cleanly():
    r = cli("whatif", "--gpu", "H100 SXM", "--target", "Llama-3.1-8B", "--draft", "EAGLE:Llama-3.1-8B",
            "--alpha", "0.7", "--batch-sizes", "1,8", "--depths", "0,3", "--json")
    assert_clean_exit(r)
    assert r.stderr.strip() == "" and json.loads(r.stdout)["rows"]


def test_row_counts_kept_on_the_host_match_the_slots(loaded, prompts):
    """With the block's validity given as lists, a cache keeps its rows' counts on the host (positions and
    the compaction check then read nothing back); after every operation they equal its valid slots, and
    the logits equal those of the same passes counted on the device."""
    model = loaded["target"].model
    a, b = prompts[1], prompts[2]
    hinted, plain = (RaggedCache(2, torch.device("cpu"), torch.float32) for _ in range(2))

    def both(tokens, valid, **kw):
        t, v = torch.tensor(tokens), torch.tensor(valid).bool()
        got = hinted.forward(model, t, v, host_valid=[[bool(x) for x in row] for row in valid], **kw)
        assert torch.equal(got, plain.forward(model, t, v, **kw))

    def counts_match():
        assert hinted.n_valid_list() == hinted.valid.sum(dim=1).tolist() == plain.valid.sum(dim=1).tolist()
        assert hinted.n_valid.tolist() == plain.n_valid.tolist()
    both([a[:3], [0, 0, b[0]]], [[1, 1, 1], [0, 0, 1]])          # unknown on the host yet: counted on the device
    hinted.n_valid_list()
    both([[7, 9, 4], [b[1], b[2], 0]], [[1, 1, 1], [1, 1, 0]])     # known: positions built on the host
    assert hinted._n_dev is None                                 # nothing was counted on the device
    counts_match()
    for c, hint in ((hinted, [0, 0]), (plain, None)):            # two verified drafts of row 0 rejected
        c.invalidate(torch.tensor([0, 0]), torch.tensor([4, 5]), host_rows=hint)
    assert hinted._n_host is not None
    counts_match()
    both([[11, 12, 13], [14, 15, 16]], [[1, 1, 1], [1, 1, 1]])
    for c in (hinted, plain):
        assert c.compact(min_waste=0.0, min_holes=1)
    counts_match()
    for c in (hinted, plain):
        c.select(torch.tensor([1, 0]))                           # rows swap places: known again after one read
    counts_match()
    both([[5], [5]], [[1], [1]])
    counts_match()


def _fake_gguf(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


class _Saves:
    """Stands in for a dequantised model or tokenizer: writes the one file convert_gguf checks for."""
    def __init__(self, name):
        self.name, self.config, self.hf_quantizer = name, object(), "q"

    def save_pretrained(self, folder):
        Path(folder, self.name).write_text("{}")


def test_a_gguf_is_converted_once_per_content_and_old_conversions_go(tmp_path, monkeypatch):
    """Every fresh clone's venv left a 0.5 GB conversion behind (keyed by the file's path): one per content
    now, reused by a copy, and removed once no living file uses it."""
    import transformers

    from specviz.pairs import models
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    loads = []
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: loads.append(a) or _Saves("config.json"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _Saves("tokenizer.json"))
    gguf = tmp_path / "cache" / "gguf"
    stale = [gguf / "m.Q4_1-0123456789abcdef", gguf / "m.Q4_1-fedcba9876543210"]  # path-keyed, venvs gone
    kept = [gguf / "m.Q4_1-v2-0123456789abcdef", gguf / "other-0123456789abcdef",   # other files' caches
            gguf / "m.Q4_1-00000000000000aa"]               # the same name, used by a file that lives
    for d in stale + kept:
        d.mkdir(parents=True)
    alive = _fake_gguf(tmp_path / "elsewhere" / "m.Q4_1.gguf", b"another model")
    (kept[-1] / "sources.txt").write_text(f"{alive}\n")

    one = tmp_path / "venv1" / "m.Q4_1.gguf"
    first = models.convert_gguf(_fake_gguf(one, b"weights" * 1000))
    copy = _fake_gguf(tmp_path / "venv2" / "m.Q4_1.gguf", b"weights" * 1000)
    os.utime(copy, ns=(1, 1))
    assert models.convert_gguf(copy) == first and len(loads) == 1   # a second venv's copy reuses it
    assert not any(d.exists() for d in stale) and all(d.exists() for d in kept)

    newer = models.convert_gguf(_fake_gguf(one, b"weights" * 999 + b"v2"))
    assert newer != first and len(loads) == 2 and first.exists()    # the copy in venv2 still uses it
    copy.unlink()
    models.convert_gguf(_fake_gguf(one, b"weights" * 999 + b"v3"))
    assert not first.exists() and not newer.exists() and kept[-1].exists()   # nothing living used them
