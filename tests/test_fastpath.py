"""The fast path (specviz.fastpath): the compact forward matches transformers, the static cache keeps
the engine lossless, and the --compile switch. Most cases run the static path uncompiled ("static");
one test compiles (tiny models compile in seconds)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_engine_exact import MAX_NEW, assert_exact, run

from specviz.chapters import knee
from specviz.engine.request import Knobs
from specviz.fastpath import FastPath, cache_factory, check_compile, resolve
from specviz.fastpath.cache import StaticCache, bucket
from specviz.fastpath.llama import CompactLlama, Unsupported

ROOT = Path(__file__).resolve().parents[1]


def _clean_logits(model, seq: list[int]) -> torch.Tensor:
    """transformers' own logits for one row without padding or holes: [len(seq), V]."""
    return model(input_ids=torch.tensor([seq])).logits[0]


def _check_against_transformers(model, tol=1e-4):
    """Left padding (rows of different lengths), then a verify block whose rejected tokens become holes,
    then one more token: every valid position's logits equal transformers' on the clean sequence."""
    compact = CompactLlama(model)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, V, (n,), generator=g).tolist() for n in (7, 3, 5)]
    cache = StaticCache(compact, len(rows))
    T = max(map(len, rows))
    toks = torch.zeros(3, T, dtype=torch.long)
    valid = torch.zeros(3, T, dtype=torch.bool)
    for i, r in enumerate(rows):
        toks[i, T - len(r):], valid[i, T - len(r):] = torch.tensor(r), True
    with torch.inference_mode():
        out = cache.forward(model, toks, valid)
        for i, r in enumerate(rows):
            ref = _clean_logits(model, r)
            assert (out[i, T - len(r):] - ref).abs().max() < tol
        # a 3-token block; row 0 keeps 1, row 1 keeps all, row 2 keeps 0 (holes mid-cache)
        blk = torch.randint(3, V, (3, 3), generator=g)
        L0 = cache.length
        cache.forward(model, blk, torch.ones(3, 3, dtype=torch.bool))
        keep = [1, 3, 0]
        for i, n in enumerate(keep):
            cache.invalidate(torch.full((3 - n,), i), torch.arange(L0 + n, L0 + 3))
            rows[i] = rows[i] + blk[i, :n].tolist()
        nxt = torch.randint(3, V, (3, 1), generator=g)
        out = cache.forward(model, nxt, torch.ones(3, 1, dtype=torch.bool))
        for i, r in enumerate(rows):
            ref = _clean_logits(model, r + nxt[i].tolist())[-1]
            assert (out[i, -1] - ref).abs().max() < tol
            assert torch.isfinite(torch.stack(cache.kbufs)).all()


@pytest.mark.parametrize("weights", ["as measured", "rows"])
def test_a_verify_with_ragged_drafts_computes_only_its_real_tokens(loaded, monkeypatch, weights):
    """Rows that drafted 4, 0 and 1 tokens: the block is [3, 5] with 8 holes of 15, so only the 7 real
    tokens go through the matrices (`StaticCache._packable`); each real position's logits equal
    transformers' on the clean sequence, and equal the unpacked block's. "rows": our packed weights,
    where the layers run in C over the real tokens only (rows.run_layers with `sel`)."""
    from specviz.fastpath import cache as fc

    if weights == "rows":
        _need_rows_kernel()
        monkeypatch.setenv("SPECVIZ_LAYOUT", "rows")

    model = loaded["target"].model
    compact = CompactLlama(model)
    if weights == "rows":
        assert compact._c_layers[1] is not None            # the 7 real tokens take the C layers
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(3, V, (6,), generator=g).tolist() for _ in range(3)]
    blk = torch.randint(3, V, (3, 5), generator=g)
    valid = torch.arange(5)[None, :] <= torch.tensor([4, 0, 1])[:, None]
    assert fc.StaticCache._packable(valid).tolist() == [0, 1, 2, 3, 4, 5, 10, 11]
    outs = []
    for holes in (fc.PACK_HOLES, 1.01):                  # packed, then the whole block (never packs)
        fc_holes, fc.PACK_HOLES = fc.PACK_HOLES, holes
        try:
            cache = StaticCache(compact, 3)
            with torch.inference_mode():
                cache.forward(model, torch.tensor(rows), torch.ones(3, 6, dtype=torch.bool), 1)
                outs.append(cache.forward(model, blk, valid))
        finally:
            fc.PACK_HOLES = fc_holes
    packed, whole = outs
    with torch.inference_mode():
        for i, n in enumerate((5, 1, 2)):
            ref = _clean_logits(model, rows[i] + blk[i, :n].tolist())[-n:]
            assert (packed[i, :n] - ref).abs().max() < 1e-4
            assert (packed[i, :n] - whole[i, :n]).abs().max() < 1e-5
            assert (packed[i, n:] == 0).all()                # holes: nothing computed, nothing read


def test_compact_forward_matches_transformers_llama(loaded):
    _check_against_transformers(loaded["target"].model)


def _qwen2_with_biases():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      max_position_embeddings=512)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():      # random biases: transformers initialises them to zero
        for block in model.model.layers:
            for lin in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj):
                lin.bias.normal_(0, 0.1)
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    return model


def test_compact_forward_matches_transformers_qwen2_untied_with_biases():
    _check_against_transformers(_qwen2_with_biases())


def _need_rows_kernel():
    from specviz.fastpath import rows

    if rows.library() is None:
        # no compiler (or SPECVIZ_KERNEL=off) is a machine without the kernel; one that builds and then
        # disagrees with F.linear is a broken kernel, and must fail here rather than skip
        assert "self-check" not in rows.why(), rows.why()
        pytest.skip(f"rows kernel not built here: {rows.why()}")


def test_c_layers_match_transformers(loaded, monkeypatch):
    """With every matrix in our packed layout a whole layer is one C call (rows.c, specviz_layer):
    padding, holes, GQA, biases and an untied head give transformers' logits."""
    _need_rows_kernel()
    monkeypatch.setenv("SPECVIZ_LAYOUT", "rows")
    for model in (loaded["target"].model, _qwen2_with_biases()):
        assert all(c is not None for c in CompactLlama(model)._c_layers)
        _check_against_transformers(model)


def test_c_layers_serve_two_threads_at_once(loaded, monkeypatch):
    """The C layers keep no state between calls (weights read-only, scratch per call): two threads
    decoding through one shared CompactLlama at once get what each gets alone."""
    import threading

    _need_rows_kernel()
    monkeypatch.setenv("SPECVIZ_LAYOUT", "rows")
    model = loaded["target"].model
    compact = CompactLlama(model)
    V = model.config.vocab_size

    def decode(seed: int, out: dict) -> None:
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(3, V, (3, 12), generator=g)
        with torch.inference_mode():
            cache = StaticCache(compact, 3)
            logits = [cache.forward(model, prompt, torch.ones(3, 12, dtype=torch.bool), 1)]
            for _ in range(20):
                nxt = logits[-1][:, -1].argmax(-1, keepdim=True)
                logits.append(cache.forward(model, nxt, torch.ones(3, 1, dtype=torch.bool)))
        out[seed] = torch.cat(logits, dim=1)
    alone: dict = {}
    for seed in (1, 2):
        decode(seed, alone)
    together: dict = {}
    threads = [threading.Thread(target=decode, args=(seed, together)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(alone[s], together[s]) for s in (1, 2))


def test_c_layers_give_a_verified_token_the_bits_decode_gives_it(loaded, monkeypatch):
    """Lossless to the bit, not just to the token: a 5-token verify block's logits equal, bit for bit,
    those of decoding the same 5 tokens one pass at a time (each row's sums are its own, in C)."""
    from specviz.fastpath import rows

    _need_rows_kernel()
    monkeypatch.setenv("SPECVIZ_LAYOUT", "rows")
    ran = []
    real = rows.run_layers
    def counted(*a):
        out = real(*a)
        ran.append(out is not None)
        return out
    monkeypatch.setattr(rows, "run_layers", counted)
    model = loaded["target"].model
    compact = CompactLlama(model)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(4)
    prompt, block = torch.randint(3, V, (2, 20), generator=g), torch.randint(3, V, (2, 5), generator=g)
    with torch.inference_mode():
        verify, decode = StaticCache(compact, 2), StaticCache(compact, 2)
        for cache in (verify, decode):
            cache.forward(model, prompt, torch.ones(2, 20, dtype=torch.bool), 1)
        together = verify.forward(model, block, torch.ones(2, 5, dtype=torch.bool))
        one_by_one = torch.cat([decode.forward(model, block[:, i:i + 1], torch.ones(2, 1, dtype=torch.bool))
                                for i in range(5)], dim=1)
    assert torch.equal(together, one_by_one), [(together[:, i] - one_by_one[:, i]).abs().max().item() for i in range(5)]
    assert ran == [True] * 8                    # 2 prefills, 1 verify, 5 decodes: all through C


def test_unsupported_architecture_falls_back():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(Unsupported, match="gpt2"):
        CompactLlama(model)
    factory, fast = cache_factory(model, FastPath("compiled"))
    assert factory is None and fast.mode == "off" and "running eager" in fast.note


def test_buckets_and_buffers_are_static(make_pair, prompts):
    assert [bucket(n) for n in (0, 1, 2, 3, 5, 9, 16)] == [1, 1, 2, 4, 8, 16, 16]
    eng = make_pair("draft", "static").engine()
    shapes = set()
    for _ in eng.generate(prompts[:3], Knobs(depth=3, batch_size=3), 20):
        shapes.add(eng.target_kv.capacity)
    # 3 rows padded to 4, one chunk of slots all run long; on a CPU the rows are kept as rows finish
    # (a pass reads only the live rows; a smaller buffer would be faulted in again by the next batch)
    assert shapes == {(4, 256)}


def _prefilled(compact, model, rows: list[list[int]]) -> StaticCache:
    cache = StaticCache(compact, len(rows))
    T = max(map(len, rows))
    toks, valid = torch.zeros(len(rows), T, dtype=torch.long), torch.zeros(len(rows), T, dtype=torch.bool)
    for i, r in enumerate(rows):
        toks[i, T - len(r):], valid[i, T - len(r):] = torch.tensor(r), True
    cache.forward(model, toks, valid, 1)
    return cache


def test_a_row_leaving_moves_one_row_and_the_rest_keep_their_slots(loaded, monkeypatch):
    """Rows 1 and 3 of 6 finish: the rows from the end fill their places (`fill_order`), the cache copies
    only those two rows, and every remaining row's slots and next logits equal those of the same rows
    gathered in the old way."""
    from specviz.engine.loop import fill_order
    from specviz.fastpath.llama import CompactLlama

    model = loaded["target"].model
    compact = CompactLlama(model)
    rows = [[5 + i, 7, 9 + i, 11, 13 + 2 * i][: 3 + i % 3] for i in range(6)]
    keep = fill_order([0, 2, 4, 5])
    assert keep == [0, 4, 2, 5]
    moved, old = _prefilled(compact, model, rows), _prefilled(compact, model, rows)
    writes = []
    real = torch.Tensor.__setitem__
    monkeypatch.setattr(torch.Tensor, "__setitem__",
                        lambda t, i, v: writes.append(v.shape[0] if isinstance(v, torch.Tensor) and v.dim() == 4 else 0)
                        or real(t, i, v))
    moved.select(torch.tensor(keep))
    monkeypatch.undo()
    assert max(writes) == 2                     # two rows copied per buffer, not four
    L = old.length
    for buf_new, buf_old in zip(moved.kbufs + moved.vbufs, old.kbufs + old.vbufs):
        assert torch.equal(buf_new[:4, :, :L], buf_old[keep, :, :L])
    nxt = torch.tensor([[3]] * 4)
    with torch.inference_mode():
        a = moved.forward(model, nxt, torch.ones(4, 1, dtype=torch.bool))
        old.select(torch.arange(6)[keep])
        b = old.forward(model, nxt, torch.ones(4, 1, dtype=torch.bool))
    assert torch.equal(a, b)


@pytest.mark.parametrize("longer", [False, True])
def test_a_join_merges_into_the_buffers_held_and_gives_the_same_logits(loaded, longer):
    """A user joining (merge) writes into the rows our buffers already hold — the same storage, no new
    pages — whether the newcomer's prompt is shorter than the batch's cache or longer (our rows move
    right); the next pass's logits equal, bit for bit, those of a merge into fresh buffers."""
    model = loaded["target"].model
    compact = CompactLlama(model)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(5)
    ours = [torch.randint(3, V, (n,), generator=g).tolist() for n in (9, 6)]
    theirs = [torch.randint(3, V, (n,), generator=g).tolist() for n in ((14, 12) if longer else (4, 3))]
    block = torch.randint(3, V, (4, 3), generator=g)
    with torch.inference_mode():
        held = _prefilled(compact, model, ours + ours)                         # room for 4 rows…
        held.select(torch.arange(2))                                           # … 2 of them in use
        before = held.kbufs[0].data_ptr()
        held.merge(_prefilled(compact, model, theirs))
        assert held.kbufs[0].data_ptr() == before and held.batch == 4
        fresh = _prefilled(compact, model, ours)                                # 2 rows: the merge reallocates
        fresh.merge(_prefilled(compact, model, theirs))
        assert fresh.kbufs[0].data_ptr() != before
        ok = torch.ones(4, 3, dtype=torch.bool)
        assert torch.equal(held.forward(model, block, ok), fresh.forward(model, block, ok))


def test_an_engine_serves_the_next_batch_on_the_buffers_it_holds(make_pair, prompts, reference):
    """A batch that ends leaves its buffers to the next one (prefilled into them, zeroed first): the
    same storage, and the next batch's tokens are still the target's own."""
    eng = make_pair("ngram", "static").engine()
    list(eng.generate(prompts[:3], Knobs(depth=3, batch_size=3), MAX_NEW))
    made, factory = [], eng.cache_factory
    eng.cache_factory = lambda batch: made.append(batch) or factory(batch)
    held = eng.target_kv
    list(eng.generate(prompts[1:4], Knobs(depth=2, batch_size=3), MAX_NEW))
    assert made == [] and eng.target_kv is held          # no new cache: the prefill wrote into ours
    outs = eng.outputs()
    assert len(outs) == 3 and all(out == reference(row + 1, MAX_NEW) for row, out in outs.items())


@pytest.mark.parametrize("draft", ["draft", "layerskip:1-2", "ngram"])
def test_static_path_mixed_acceptance_eos_and_bounded_cache(make_pair, prompts, reference, draft):
    pair = make_pair(draft, "static")
    eng, events = run(pair, prompts, Knobs(depth=4, batch_size=4), max_new=40)
    assert_exact(eng, reference, 40)
    eng = pair.engine()
    ref0 = reference(0, MAX_NEW)
    eng.eos = {ref0[5]}
    list(eng.generate(prompts[:3], Knobs(depth=4, batch_size=3), MAX_NEW))
    for row, out in eng.outputs().items():
        assert out == reference(row, MAX_NEW, eos=ref0[5])
    eng = pair.engine()
    for _ in eng.generate(prompts, Knobs(depth=8, batch_size=4), 120):
        longest = max(len(r.seq) for r in eng.rows)
        assert eng.target_kv.length <= longest + 8 + 64
    assert_exact(eng, reference, 120)


def test_static_path_rows_join_and_leave(make_pair, prompts, reference):
    """Admission (merge) and retirement (select, trim) mid-stream, with refill."""
    def turn(ev, knobs):
        if ev.step == 2:
            knobs.set(batch_size=6, depth=6)
        if ev.step == 5:
            knobs.set(batch_size=2, depth=2)
    eng, _ = run(make_pair("layerskip:1-2", "static"), prompts, Knobs(depth=4, batch_size=2), max_new=30,
                 on_step=turn)
    for row, out in eng.outputs().items():
        assert out == reference(row, 30)[: len(out)]
    knobs = Knobs(depth=2, batch_size=3)

    def stop_late(ev, k):
        if ev.step == 20:
            k.stop.set()
    eng, _ = run(make_pair("draft", "static"), prompts, knobs, max_new=6, on_step=stop_late, refill=True)
    assert len(eng.outputs()) > 3
    for row, out in eng.outputs().items():
        assert out == reference(row, 6)[: len(out)]


def test_sampling_with_static_path_is_seeded_and_matches_eager(make_pair, prompts):
    static, eager = make_pair("layerskip:1-2", "static"), make_pair("layerskip:1-2")
    a, _ = run(static, prompts, Knobs(depth=3, batch_size=2), temperature=0.8, seed=7)
    b, _ = run(static, prompts, Knobs(depth=3, batch_size=2), temperature=0.8, seed=7)
    c, _ = run(eager, prompts, Knobs(depth=3, batch_size=2), temperature=0.8, seed=7)
    assert a.outputs() == b.outputs()
    # same random streams, same distributions up to float noise: the same samples
    assert a.outputs() == c.outputs()


def test_compiled_path_is_lossless(make_pair, prompts, reference, tmp_path, monkeypatch):
    """The one compiled case: a model draft and a layer-skip draft, batch 3, depth 4."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    for draft in ("draft", "layerskip:1-2"):
        pair = make_pair(draft, "on")
        assert pair.fast.mode == "compiled"
        eng, _ = run(pair, prompts, Knobs(depth=4, batch_size=3))
        assert_exact(eng, reference)


def test_compile_choices(tmp_path, monkeypatch):
    assert check_compile(" ON ") == "on"
    with pytest.raises(ValueError, match="auto, on, off, static"):
        check_compile("fast")
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    # on a CPU auto is what the app serves: the static path, falling back to eager where that measured faster
    auto = resolve("auto", "cpu")
    assert auto.mode == "static" and auto.auto
    import specviz.fastpath as fp

    monkeypatch.setattr(fp, "_on_cpu", lambda device: False)     # on CUDA: the graph path, auto where it measures faster
    assert resolve("auto").mode == "graphs" and resolve("auto").auto      # timed at warm-up: tests/test_graph_path.py
    assert resolve("on").mode == "graphs" and not resolve("on").auto
    assert resolve("static").mode == "static" and resolve("off").mode == "off"


def _cli(*args, cache):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "SPECVIZ_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "specviz", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)


def test_cli_compile_flag(tiny_paths, tmp_path):
    import json

    base = ["generate", "--target", tiny_paths["target"], "--draft", "ngram", "--prompt", "the quick",
            "--raw", "--max-new-tokens", "6", "--json"]
    bad = _cli(*base, "--compile", "fast", cache=tmp_path)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "--compile" in bad.stderr
    outs = {}
    for choice in ("off", "auto", "static"):
        r = _cli(*base, "--compile", choice, cache=tmp_path)
        assert r.returncode == 0, r.stderr
        lines = [json.loads(x) for x in r.stdout.strip().splitlines()]
        final = lines[-1]
        outs[choice] = (final["outputs"], final["path"])
        assert all(step["path"] == final["path"] for step in lines[:-1])
    assert outs["off"][0] == outs["auto"][0] == outs["static"][0]
    assert outs["static"][1].startswith("static (eager); weights ")
    assert outs["auto"][1] == "eager (transformers)" or outs["auto"][1].startswith("static (eager); weights ")
    r = _cli("bench-hf", "--help", cache=tmp_path)
    assert "--compile" in r.stdout
    # bench-hf says which path and which weight layouts ran, in its text and its JSON
    r = _cli("bench-hf", "--target", tiny_paths["target"], "--draft", "ngram", "--depth", "2", "--max-new-tokens",
             "4", "--repeats", "1", "--raw", "--prompt", "the quick", "--compile", "static", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["path"] == "static (eager)" and res["fast_path"] is True and res["layout"].startswith("weights ")
    assert f"path: static (eager) (fast); {res['layout']}" in r.stdout and res["identical"] is True


def test_app_compile_flag(monkeypatch):
    import app

    monkeypatch.delenv("SPECVIZ_COMPILE", raising=False)
    assert app.parse_args([]).compile == "auto"
    assert app.parse_args(["--compile", "off"]).compile == "off"
    monkeypatch.setenv("SPECVIZ_COMPILE", "on")
    assert app.parse_args([]).compile == "on"
    with pytest.raises(SystemExit):
        app.parse_args(["--compile", "sometimes"])


# --- the app: served eagerly while the fast path warms up, then switched between two steps ----------------

def _pair_cache(tiny_paths, compile, **kw):
    from specviz.serve.catalog import PairCache, PairChoice

    return PairCache("cpu", compile=compile, **kw), PairChoice("tiny", tiny_paths["target"], tiny_paths["draft"])


def _wait_warm(cache, choice, timeout=120):
    import time

    deadline = time.time() + timeout
    while cache.fast_status(choice).state == "warming":
        assert time.time() < deadline, "the warm-up did not finish"
        time.sleep(0.05)
    return cache.fast_status(choice)


def test_warm_up_swaps_a_running_request_onto_the_fast_path_losslessly(tiny_paths, prompts, reference):
    import threading

    from specviz.engine.request import Request
    from specviz.limits import Limits
    from specviz.serve.runner import Schedulers
    from specviz.serve.gate import DeviceGate

    gate = DeviceGate()
    cache, choice = _pair_cache(tiny_paths, "static", exclusive=gate.exclusive)
    sched = Schedulers(cache, Limits(), gate).get(choice)
    assert cache.fast_status(choice).state == "warming"
    # the scheduler runs a few steps eagerly, then waits (between steps, outside the device gate) until
    # the warm-up has handed over the fast pair: the swap lands mid-request whatever the machine's speed
    posted, loops = threading.Event(), []
    take, swap = sched._take_swap, sched.swap
    sched.swap = lambda make: (swap(make), posted.set())

    def paced():
        loops.append(1)
        if len(loops) > 4:
            posted.wait(120)
        take()
    sched._take_swap = paced
    reqs = [Request([prompts[i]], Knobs(depth=d, batch_size=1), 48, 0.0, 0) for i, d in ((0, 3), (1, 0))]
    tickets = [sched.submit(r) for r in reqs]
    paths = {0: [], 1: []}

    def consume(i):
        for upd in tickets[i].updates():
            paths[i] += [ev.path for ev in upd.events]
    threads = [threading.Thread(target=consume, args=(i,)) for i in (0, 1)]
    for th in threads:
        th.start()
    status = _wait_warm(cache, choice)
    for th in threads:
        th.join(120)
    assert posted.is_set() and status.state == "ready" and "one-token pass" in status.note
    assert cache.get(choice).fast.mode == "static"
    for i, req in enumerate(reqs):
        assert req.outputs()[0] == reference(i, 48)                 # identical across the swap
        assert paths[i][0] == "eager (transformers)" and paths[i][-1].startswith("static (eager); weights"), paths[i]


def test_warm_up_stays_eager_when_the_fast_path_is_slower_or_differs(tiny_paths, monkeypatch):
    from specviz.serve import warmup

    cache, choice = _pair_cache(tiny_paths, "auto")
    monkeypatch.setattr(warmup, "_one_token_ms", lambda eager, fast, ids: (1.0, 2.0))
    eager = cache.get(choice)
    status = _wait_warm(cache, choice)
    assert status.state == "eager" and "measured slower" in status.note and cache.get(choice) is eager
    # a fast path that changes a token is never served
    cache2, _ = _pair_cache(tiny_paths, "static")
    real = warmup._greedy
    monkeypatch.setattr(warmup, "_greedy", lambda pair, ids, rows, depth: (
        [out[:-1] + [out[-1] + 1] for out in real(pair, ids, rows, depth)] if pair.fast.on else real(pair, ids, rows, depth)))
    cache2.get(choice)
    status = _wait_warm(cache2, choice)
    assert status.state == "eager" and "other tokens" in status.note
    # off: nothing warms
    cache3, _ = _pair_cache(tiny_paths, "off")
    cache3.get(choice)
    assert cache3.fast_status(choice) is None
    assert warmup.target_mode("auto", "cpu") == "static" and warmup.target_mode("auto", "cuda") == "graphs"
    assert warmup.target_mode("on", "cpu") == "compiled" and warmup.target_mode("on", "cuda") == "graphs"


def test_warm_up_serves_a_fast_path_whose_only_differences_are_near_ties(tiny_paths, monkeypatch):
    """bf16 on a GPU: the graph path's kernels may split a near-tie the other way. The warm-up judges a
    difference by the one near-tie rule (the target's own pass there), as every lossless check does."""
    from specviz.engine import divergence
    from specviz.serve import warmup

    monkeypatch.setattr(warmup, "_one_token_ms", lambda eager, fast, ids: (2.0, 1.0))
    real = warmup._greedy
    monkeypatch.setattr(warmup, "_greedy", lambda pair, ids, rows, depth: (
        [out[:-1] + [out[-1] + 1] for out in real(pair, ids, rows, depth)] if pair.fast.on else real(pair, ids, rows, depth)))
    asked = []

    def tied(model, device, prefix, ours, reference):       # the target's two best tokens 0.01 logits apart
        asked.append((len(prefix), ours, reference))
        return divergence.Margins(0.01, 0.01, 0.0)
    monkeypatch.setattr(divergence, "target_margins", tied)
    cache, choice = _pair_cache(tiny_paths, "static")
    cache.get(choice)
    status = _wait_warm(cache, choice)
    assert status.state == "ready" and "near-ties split the other way" in status.note, status.note
    assert "6 near-ties" in status.note and "0.01 logits" in status.note     # 1 + 2 + 1 + 2 rows over SHAPES
    assert all(ours == reference + 1 for _, ours, reference in asked) and len(asked) == 6


def test_warm_up_judges_a_row_on_past_its_first_near_tie(tiny_paths, monkeypatch):
    """After a near-tie the row goes on from its own token: the eager path decodes on from there, and a
    later difference outside the rule still keeps the app eager."""
    from specviz.engine import divergence
    from specviz.serve import warmup

    monkeypatch.setattr(warmup, "_one_token_ms", lambda eager, fast, ids: (2.0, 1.0))
    real = warmup._greedy

    def fast_rows(pair, ids, rows, depth):            # a split at token 2, the rest the old continuation
        outs = real(pair, ids, rows, depth)
        return [out[:1] + [out[1] + 1] + out[2:] for out in outs] if pair.fast.on else outs
    monkeypatch.setattr(warmup, "_greedy", fast_rows)
    asked = []

    def margins(model, device, prefix, ours, reference):    # the split at token 2 is a near-tie, nothing else
        asked.append(len(prefix))
        tie = None not in (ours, reference) and ours == reference + 1
        return divergence.Margins(0.01 if tie else 3.0, 0.01 if tie else 3.0, 0.0)
    monkeypatch.setattr(divergence, "target_margins", margins)
    cache, choice = _pair_cache(tiny_paths, "static")
    cache.get(choice)
    status = _wait_warm(cache, choice)
    assert status.state == "eager" and "other tokens" in status.note, status.note
    assert len(asked) == 2 and asked[1] > asked[0]          # judged on, past the near-tie, to a later token


def test_weight_layouts_compute_the_same_and_are_shared():
    from specviz.fastpath import layout

    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    cpu = layout.available(torch.float32)
    routed = layout.Routed(tuple(layout.stored(w, name) for name in (cpu[-1], "colmajor", "stock")))
    for store in [lambda t, n=name: layout.stored(t, n) for name in cpu] + [lambda t: routed]:
        for shape in ((1, 24), (1, 5, 24), (16, 5, 24)):       # every row class
            x = torch.randn(*shape, generator=g)
            assert torch.allclose(layout.linear(x, store(w), b), torch.nn.functional.linear(x, w, b), atol=1e-5)
        assert store(w) is store(w)                       # one copy per weight, however many users
    assert layout.stored(w, "stock") is w                 # the model's own matrix: no copy
    assert [layout.row_class(n) for n in (1, 2, 16, 17, 80)] == [0, 1, 1, 2, 2]
    assert layout.plan_for([w.to("meta")]) is layout.IDENTITY            # off the CPU: in place


def test_rows_kernel_gives_a_row_the_same_bits_among_any_number_of_rows():
    """Our kernel sums each output in one order whatever the rows and threads: a verify's row (or a
    batch's) gets exactly the bits that row gets alone, so speculation reproduces decode's logits."""
    from specviz.fastpath import layout, rows

    _need_rows_kernel()
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(200, 72, generator=g), torch.randn(200, generator=g)   # 200: a padded last block
    p = layout.stored(w, "rows")
    assert isinstance(p, rows.Packed) and p.shape == (200, 72) and torch.equal(rows.unpack(p), w)
    x = torch.randn(80, 72, generator=g)
    threads = torch.get_num_threads()
    try:
        many = layout.linear(x, p, b)
        torch.set_num_threads(1)
        for n in (1, 5, 9, 10, 11, 13, 40):     # one group; one of 9-10 (rows.c WIDE_ROWS); 8 + 3; two blocks
            assert torch.equal(layout.linear(x[:n], p, b), many[:n])
        assert torch.equal(layout.linear(x[7:8], p, b), many[7:8])
    finally:
        torch.set_num_threads(threads)
    assert torch.allclose(many, torch.nn.functional.linear(x, w, b), atol=1e-4)
    assert layout.linear(x[:0], p).shape == (0, 200)
    assert layout.linear(x.reshape(16, 5, 72)[:, 1:4], p).shape == (16, 3, 200)     # strided input


def test_rows_kernel_missing_compiler_is_a_sentence_not_a_fault(monkeypatch, tmp_path):
    from specviz.fastpath import rows

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(rows.shutil, "which", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    assert rows._load() == (None, "no C compiler (cc) on this machine")
    monkeypatch.setenv("CC", "/bin/false")
    lib, why = rows._load()
    assert lib is None and "could not build" in why
    monkeypatch.setenv("SPECVIZ_KERNEL", "off")
    assert rows._load() == (None, "SPECVIZ_KERNEL=off")


def test_fused_norm_and_stacked_matrices_give_the_same_bits():
    """The fast path's cuts that are not the layout change no value: F.rms_norm equals transformers'
    written-out RMSNorm, and one stacked q/k/v (gate/up) matmul equals the separate ones, in every layout."""
    from specviz.fastpath import layout
    from specviz.fastpath.llama import rms_norm

    g = torch.Generator().manual_seed(2)
    for shape in ((1, 1, 576), (1, 5, 576), (16, 5, 576)):
        x, w = torch.randn(*shape, generator=g), torch.randn(576, generator=g)
        assert torch.equal(rms_norm(x, w, 1e-5), w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)))
        ws = tuple(torch.randn(n, 576, generator=g) for n in (576, 192, 192))
        st = layout.stacked(ws)
        assert st is layout.stacked(ws) and st.shape == (960, 576)
        for name in layout.available(torch.float32):
            sep = torch.cat([layout.linear(x, layout.stored(m, name)) for m in ws], -1)
            assert torch.equal(layout.linear(x, layout.stored(st, name)), sep), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_norm_is_transformers_own(dtype):
    """In bf16 / fp16 our RMSNorm gives transformers' LlamaRMSNorm bit for bit: normalised in fp32, cast
    back, then scaled (scaling in fp32 before the cast would round once instead of twice, and differ)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from specviz.fastpath.llama import rms_norm

    g = torch.Generator().manual_seed(3)
    ref = LlamaRMSNorm(576, eps=1e-5).to(dtype)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(576, generator=g) * 0.3 + 1)
    for shape in ((1, 1, 576), (4, 9, 576)):
        x = (torch.randn(*shape, generator=g) * 3).to(dtype)
        with torch.no_grad():
            assert torch.equal(rms_norm(x, ref.weight, 1e-5), ref(x))


def _t(*rows):
    """times[class][layout] from rows of (stock, colmajor, onednn) seconds."""
    return [dict(zip(("stock", "colmajor", "onednn"), r)) for r in rows]


def test_layout_choice_follows_the_timings():
    """Which layout serves each row class follows the numbers (injected: no timing in tests)."""
    from specviz.fastpath.layout import choose

    # oneDNN fastest everywhere (the development CPU) → oneDNN everywhere; reverse the numbers → stock
    assert choose(_t((3, 2, 1), (3, 2, 1), (3, 2, 1))) == ("onednn",) * 3
    assert choose(_t((1, 2, 3), (1, 2, 3), (1, 2, 3))) == ("stock",) * 3
    # the Xeon of issue 18 (GB/s, two threads; time = 1 / rate): column-major best at one row (28.2 vs
    # 23.8 stock, 23.6 oneDNN), oneDNN at five (22.0 vs 15.6 / 18.0) → a copy of each, stock unused
    xeon = [(1 / 23.8, 1 / 28.2, 1 / 23.6), (1 / 15.6, 1 / 18.0, 1 / 22.0), (1 / 15.6, 1 / 18.0, 1 / 22.0)]
    assert choose(_t(*xeon)) == ("colmajor", "onednn", "onednn")
    # a gain under MIN_GAIN (5 %) buys no copy: stock serves
    assert choose(_t((1.0, 0.95, 0.96), (1.0, 0.97, 0.99), (1.0, 1.0, 1.0))) == ("stock",) * 3
    # each class its own winner, and stock kept where it is fastest (it costs no memory)
    assert choose(_t((1, 0.5, 0.8), (1, 0.9, 0.5), (1, 1.2, 1.1))) == ("colmajor", "onednn", "stock")
    # no oneDNN on this CPU (ARM, bf16): only what is there
    assert choose([{"stock": 2, "colmajor": 1}] * 3) == ("colmajor",) * 3
    # our rows kernel is one more candidate at its measured time: no credit for it
    amd = [{"stock": 64.8, "colmajor": 50.0, "onednn": 60.0, "rows": 30.9}, {"stock": 84.3, "colmajor": 80.0,
           "onednn": 76.7, "rows": 38.0}, {"stock": 310.0, "colmajor": 330.0, "onednn": 250.0, "rows": 223.5}]
    assert choose(amd) == ("rows",) * 3
    near = [{"stock": 1.0, "onednn": 0.85, "rows": 1.05}] * 3    # once credited to win; now oneDNN's faster product
    assert choose(near) == ("onednn",) * 3
    # the Xeon of issue 27 (ms, one row, 576×1536): MKL 0.118, ours 0.166 → the library's product
    xeon27 = [{"stock": 0.118, "colmajor": 0.127, "onednn": 0.186, "rows": 0.166}] * 3
    assert choose(xeon27) == ("stock",) * 3
    # what a C layer can call: onednn left out, the fastest of the rest
    assert choose(near, allowed=("rows", "stock", "colmajor")) == ("stock",) * 3


def _plan_times(*per_class):
    """times[shape][class][layout] for two shapes from per-class dicts (the head is (96, 64))."""
    return {(96, 64): list(per_class), (128, 64): list(per_class)}


def test_whole_pass_candidates_and_the_kept_pass_follow_the_timings():
    """The C candidate's matrices are all ones the C layer can call (no oneDNN) while the head keeps
    its fastest layout; each row class keeps the candidate whose pass measured fastest; eager faster
    than every fast pass at one row is reported (what --compile auto reads)."""
    from specviz.fastpath import passes, rows
    from specviz.fastpath.layout import Plan

    if rows.library() is None:
        pytest.skip(f"rows kernel not built here: {rows.why()}")
    t = {"stock": 1.0, "colmajor": 0.95, "onednn": 0.5, "rows": 0.8}
    base = Plan({}, "measured", _plan_times(t, t, t), {(96, 64): 1, (128, 64): 1})
    cands = passes.candidates(base, (96, 64))
    assert cands[passes.TORCH].choice[(128, 64)] == ("onednn",) * 3 and cands[passes.TORCH].c_layers == (False,) * 3
    assert cands[passes.C].choice[(128, 64)] == ("rows",) * 3 and cands[passes.C].c_layers == (True,) * 3
    assert cands[passes.C].choice[(96, 64)] == ("onednn",) * 3          # the head is a torch product
    ms = {passes.TORCH: [10.0, 20.0, 50.0], passes.C: [8.0, 22.0, 60.0], passes.EAGER: [9.0, None, None]}
    final = passes._merge(cands, [passes.C, passes.TORCH, passes.TORCH], {"ms": ms}, "measured")
    assert final.c_layers == (True, False, False)
    assert final.choice[(128, 64)] == ("rows", "onednn", "onednn")
    assert passes.eager_faster(final) is None
    slow = passes._merge(cands, [passes.TORCH] * 3, {"ms": {**ms, passes.EAGER: [5.0, None, None]}}, "measured")
    assert passes.eager_faster(slow) == (10.0, 5.0)
    assert "1 row: torch layers" in passes.describe(slow)


def test_a_measurement_on_a_busy_or_old_machine_is_taken_again():
    from specviz.hardware.device import BUSY_LOAD_PER_CPU, MAX_AGE_S, is_busy, remeasure_reason

    now = 1e9
    quiet = {"load": 0.1, "cpus": 2, "at": now - 60}
    assert not is_busy(quiet) and remeasure_reason(quiet, now) == ""
    busy = {**quiet, "load": 2 * BUSY_LOAD_PER_CPU}
    assert is_busy(busy) and "busy" in remeasure_reason(busy, now)
    assert "days old" in remeasure_reason({**quiet, "at": now - 2 * MAX_AGE_S}, now)
    assert remeasure_reason(None, now) != ""                 # an older version's entry, without a load
    import os

    assert remeasure_reason({**busy, "pid": os.getpid()}, now) == ""    # this process's own: kept till restart
    assert remeasure_reason({**busy, "pid": -1}, now) != ""


def test_calibrated_peaks_measured_on_a_busy_machine_are_not_kept(tmp_path, monkeypatch):
    from specviz.hardware import device

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    calls, loads = [], iter([3.0, 0.1, 0.1])
    monkeypatch.setattr(device, "calibrate", lambda d, t, **kw: calls.append(1) or device.Peaks("cpu", 1e10, 1e11, "float32"))
    monkeypatch.setattr(device.os, "getloadavg", lambda: (next(loads), 0, 0))
    monkeypatch.setattr(device.os, "cpu_count", lambda: 2)
    pid = {"now": 1}
    monkeypatch.setattr(device, "_this_process", lambda: pid["now"])
    device.cached_peaks(torch.device("cpu"), torch.float32)    # busy: stored, but not for good
    device.cached_peaks(torch.device("cpu"), torch.float32)    # the same process keeps it until it ends
    assert len(calls) == 1
    pid["now"] = 2                                             # the next start
    device.cached_peaks(torch.device("cpu"), torch.float32)    # so measured again (quiet now)
    pid["now"] = 3
    device.cached_peaks(torch.device("cpu"), torch.float32)    # and this quiet one is kept
    assert len(calls) == 2


def test_calibrated_peaks_a_pass_beat_are_measured_again_at_the_next_start(tmp_path, monkeypatch):
    """A cached calibration taken beside other work read 12 GB/s and 24 GFLOP/s on a machine that does 33
    and 180, was kept for its week, and the hardware chart drew MFU at 250 %: a pass past the peak proves
    it low, so the entry is marked and the next start (not this process) measures again."""
    from specviz.engine.request import StepEvent
    from specviz.hardware import device
    from specviz.serve.live import LiveRun

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(device, "_distrusted", set())
    calls = []
    monkeypatch.setattr(device, "calibrate", lambda d, t, **kw: calls.append(1) or device.Peaks("cpu", 1e10, 1e9, "float32"))
    monkeypatch.setattr(device.os, "getloadavg", lambda: (0.1, 0, 0))
    pid = {"now": 1}
    monkeypatch.setattr(device, "_this_process", lambda: pid["now"])
    peaks = device.cached_peaks(torch.device("cpu"), torch.float32)
    live = LiveRun(control=None, pair_label="", peaks=peaks, sampler=None)
    # 1e9 FLOPs in 0.5 s: 2 GFLOP/s, 200 % of the calibrated 1 GFLOP/s
    live.record(StepEvent(step=0, batch_size=1, depth=0, policy="fixed", rows=[], draft_s=0.0, verify_s=0.5,
                          overhead_s=0.0, wall_s=0.5, prefill_s=0.0, tokens_per_pass=1, context=10, draft_flops=0.0,
                          draft_bytes=0.0, target_flops=1e9, target_bytes=1e6, plain_flops=1e9))
    assert live.mfu.y[-1] == pytest.approx(200)
    entry = json.loads((tmp_path / "peaks.json").read_text())
    assert [e["measured"].get("beaten") for e in entry.values()] == ["200%"]
    device.cached_peaks(torch.device("cpu"), torch.float32)     # this process keeps what it measured
    assert len(calls) == 1
    pid["now"] = 2
    device.cached_peaks(torch.device("cpu"), torch.float32)     # the next start measures again
    assert len(calls) == 2
    assert device.distrust(peaks, "300%")                       # the new entry is marked in turn when beaten
    assert not device.distrust(peaks, "300%")                   # once an entry


def test_two_pages_beating_the_peak_at_once_mark_it_once(tmp_path, monkeypatch):
    """Two watching pages' steps may both beat the peak in the same instant: one marks the cache."""
    import threading

    from specviz.hardware import device

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(device, "_distrusted", set())
    monkeypatch.setattr(device, "calibrate", lambda d, t, **kw: device.Peaks("cpu", 1e10, 1e9, "float32"))
    monkeypatch.setattr(device.os, "getloadavg", lambda: (0.1, 0, 0))
    peaks = device.cached_peaks(torch.device("cpu"), torch.float32)
    start, marked = threading.Barrier(8), []

    def page():
        start.wait()
        marked.append(device.distrust(peaks, "150%"))
    threads = [threading.Thread(target=page) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(marked) == [False] * 7 + [True]


@pytest.mark.parametrize("kinds", [("stock",) * 3, ("colmajor",) * 3, ("stock", "colmajor", "rows")])
def test_c_layers_can_call_the_library_product(loaded, monkeypatch, kinds):
    """A C layer multiplies through the BLAS product torch links (stock or column-major matrix) where
    that measured faster, per row class, and still gives transformers' logits."""
    from specviz.fastpath import llama, rows
    from specviz.fastpath.layout import Plan

    _need_rows_kernel()
    if not rows.has_gemm():
        pytest.skip("torch links no BLAS sgemm here: the C layer multiplies with our kernel only")
    real = llama.plan_for

    def forced(weights, compiled=False):
        shapes = {tuple(w.shape) for w in weights}
        return Plan({s: kinds for s in shapes}, "test", {}, {}, (True,) * 3)
    monkeypatch.setattr(llama, "plan_for", forced)
    for model in (loaded["target"].model, _qwen2_with_biases()):
        compact = CompactLlama(model)
        assert all(c is not None for c in compact._c_layers)
        _check_against_transformers(model)
    monkeypatch.setattr(llama, "plan_for", real)


def test_layout_plan_is_measured_once_kept_in_the_cache_and_reported(tmp_path, monkeypatch):
    from specviz.fastpath import layout

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECVIZ_LAYOUT", raising=False)
    calls = []

    def fake(shape, count, names, dtype=torch.float32, **kw):
        calls.append((shape, count))
        fast = "colmajor" if shape == (8, 4) else "stock"       # oneDNN slowest at one row, fastest beyond
        return [{n: (1.0 if n == fast else 3.0) for n in names}] + [{n: (1.0 if n == names[-1] else 2.0)
                                                                        for n in names}] * 2
    monkeypatch.setattr(layout, "time_layouts", fake)
    load = {"load": 0.1, "cpus": 2, "at": __import__("time").time()}   # a quiet machine (the test's own may be busy)
    monkeypatch.setattr(layout, "load_now", lambda: dict(load))
    ws = [torch.randn(8, 4), torch.randn(8, 4), torch.randn(4, 8)]
    plan = layout.plan_for(ws)
    last = layout.available(torch.float32)[-1]
    assert sorted(calls) == [((4, 8), 1), ((8, 4), 2)] and plan.source == "measured"
    assert plan.choice[(8, 4)] == ("colmajor", last, last) and plan.choice[(4, 8)] == ("stock", last, last)
    routed = plan.store(ws[0])
    assert isinstance(routed, layout.Routed) and routed.by_class[1] is layout.stored(ws[0], last)
    assert "(1 row)" in plan.summary() and plan.summary().startswith("weights colmajor")
    again = layout.plan_for(ws)                                # a restart: from the cache, not re-timed
    assert len(calls) == 2 and again.source == "cached" and again.choice == plan.choice
    assert (tmp_path / "layouts.json").exists()
    monkeypatch.setenv("SPECVIZ_LAYOUT", "colmajor")            # forced (measurements, tests)
    assert layout.plan_for(ws).choice[(4, 8)] == ("colmajor",) * 3
    monkeypatch.delenv("SPECVIZ_LAYOUT")
    layout.forget()                                            # `calibrate` re-times with the peaks
    layout.plan_for(ws)
    assert len(calls) == 4
    import json
    import os

    load.update(load=4.0, pid=os.getpid())                     # timed on a busy machine: kept until the next start
    layout.forget()
    layout.plan_for(ws)
    layout.plan_for(ws)
    assert len(calls) == 6                                     # this process keeps it
    load["pid"] = -1                                           # as if a later start read it
    layout.forget()
    layout.plan_for(ws)
    table = json.loads((tmp_path / "layouts.json").read_text())
    layout.plan_for(ws)
    assert len(calls) == 10 and table                          # another process's busy timing: taken again
    assert layout.plan_for(ws, compiled=True).choice[(8, 4)] == ("colmajor",) * 3   # what the compiler traces


@pytest.mark.parametrize("forced", ["stock", "colmajor", "onednn", "rows", "mixed", "C+stock", "C+colmajor"])
def test_every_layout_gives_the_target_s_greedy_tokens(make_pair, prompts, reference, monkeypatch, forced):
    from specviz.fastpath import layout, passes, rows

    if forced in ("onednn", "rows") and forced not in layout.available(torch.float32):
        pytest.skip(f"no {forced} layout on this CPU")
    if forced.startswith("C+"):      # whole C layers calling the library's product (no bit-exact verify)
        if rows.library() is None or not rows.has_gemm():
            pytest.skip("no C layer with the library product on this CPU")
        name = forced[2:]
        monkeypatch.setattr(passes, "plan_for", lambda ws, compiled=False: layout.Plan(
            {tuple(w.shape): (name,) * 3 for w in ws}, f"test {forced}", {}, {}, (True,) * 3))
        forced, want_c = "stock", True       # the env var below is then unused (plan_for is replaced)
    else:
        want_c = forced == "rows"
    if forced == "mixed":           # a different layout per row class (Routed weights)
        monkeypatch.delenv("SPECVIZ_LAYOUT", raising=False)
        names = layout.available(torch.float32)
        monkeypatch.setattr(layout, "_cached_times", lambda counts, dtype, refresh: (
            {s: [{n: (0.5 if n == names[(i + c) % len(names)] else 1.0) for n in names} for c in range(3)]
             for i, s in enumerate(counts)}, False))
    else:
        monkeypatch.setenv("SPECVIZ_LAYOUT", forced)
    for draft in ("ngram", "draft"):
        pair = make_pair(draft, "static")
        assert pair.fast.layout and pair.fast.layout in pair.fast.shown
        if want_c:
            assert "layers in C" in pair.fast.layout
        eng, _ = run(pair, prompts, Knobs(depth=4, batch_size=4 if draft == "ngram" else 1))
        assert_exact(eng, reference)
        eng, _ = run(pair, prompts[:1], Knobs(depth=0, batch_size=1))
        assert_exact(eng, reference)


def test_knee_is_measured_through_the_pairs_forward_path(make_pair):
    from specviz.hardware.device import measure_latency

    pair = make_pair("ngram", "static")
    t, made = pair.target, []

    def counting(batch):
        made.append(batch)
        return pair.target_cache(batch)
    secs = measure_latency(t.model, [1, 4], 16, t.device, t.dtype, 2, counting)
    assert len(secs) == 2 and all(s > 0 for s in secs) and len(made) == 2 * 3      # a fresh cache per pass
    final = list(knee.run_knee(pair, None, context=16, repeats=1, cap=4))[-1]
    assert final["done"] and [r["tokens_per_pass"] for r in final["table"]] == [1, 2, 4]


def test_counters_say_which_path_ran():
    from specviz.serve.catalog import FastStatus
    from specviz.ui import counters

    assert counters.path_md("en", "", None) == ""                  # an old recording: nothing to say
    en = counters.path_md("en", "eager (transformers)", FastStatus("warming"))
    assert "eager (transformers)" in en and "warming up" in en
    assert "warming" not in counters.path_md("en", "static (eager)", FastStatus("ready"))
    assert "static (eager)" in counters.path_md("fa", "static (eager)", None)


def test_served_app_serves_two_clients_on_the_fast_path(tiny_paths, tmp_path, greedy):
    """`python app.py` with the fast path on: it warms up in the background, two clients at once get the
    target's own greedy tokens, and the counters say which path ran."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from apphelp import start_app, stop_app
    from gradio_client import Client

    log = tmp_path / "app.log"
    proc, url = start_app(tiny_paths["target"], tiny_paths["draft"], log, {"SPECVIZ_COMPILE": "static"})
    label = f"{tiny_paths['draft']} → {tiny_paths['target']}"
    try:
        def run(prompt):
            job = Client(url, verbose=False).submit(prompt, label, 2, 3, "fixed", 8, 0, 96, api_name="/generate")
            last = job.result()
            return last[-1], last[2]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(run, ["the quick brown", "memory"]))
        deadline = time.time() + 60
        while "fast path for" not in log.read_text():
            assert time.time() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        assert "ready after" in log.read_text()
        results.append(run("speculative decoding spends"))
        for final, counters in results:
            assert final["done"] and "forward path:" in counters
            for ids, out in zip(final["prompt_ids"], final["outputs"]):
                assert out == greedy(ids, 96)
        assert "forward path: **static (eager); weights " in results[-1][1]
    finally:
        stop_app(proc)


def test_ngram_lookup_is_the_earliest_longest_match():
    """The n-gram drafter's lookup (sped up: list.index finds the places of the last token) finds what a
    plain scan finds: the longest n that occurs earlier, its earliest occurrence (vLLM's rule;
    tests/test_vllm.py checks against vLLM's own proposer)."""
    import random

    from specviz.engine.drafters import NgramDrafter

    def plain(seq, k):
        for n in range(min(3, len(seq) - 1), 0, -1):
            hits = [s for s in range(len(seq) - n) if seq[s:s + n] == seq[-n:]]
            if hits:
                return seq[hits[0] + n:hits[0] + n + k]
        return []
    d, rnd = NgramDrafter("cpu"), random.Random(0)
    assert d.lookup([], 4) == [] and d.lookup([5], 4) == [] and d.lookup([1, 2, 3, 1, 2], 4) == [3, 1, 2]
    assert d.lookup([7, 1, 8, 1, 9, 1], 2) == [8, 1]          # "1" occurs twice before: the earliest
    for _ in range(2000):
        seq = [rnd.randrange(rnd.choice([2, 5, 50])) for _ in range(rnd.randrange(40))]
        assert d.lookup(seq, 4) == plain(seq, 4), seq


def test_auto_falls_back_to_eager_where_eager_measured_faster(loaded, monkeypatch):
    """--compile auto on a CPU: the static path, unless its whole-pass timing found eager faster at one
    row; then eager, with a sentence giving both figures."""
    from specviz.fastpath import passes

    model = loaded["target"].model
    monkeypatch.delenv("SPECVIZ_LAYOUT", raising=False)
    monkeypatch.setattr(passes, "eager_faster", lambda plan: None)
    factory, fast = cache_factory(model, resolve("auto", "cpu"))
    assert factory is not None and fast.mode == "static"
    monkeypatch.setattr(passes, "eager_faster", lambda plan: (12.5, 10.0))
    factory, fast = cache_factory(model, resolve("auto", "cpu"))
    assert factory is None and fast.mode == "off" and "12.5 vs 10.0 ms" in fast.note


def test_the_avx512_kernel_variant_gives_the_default_kernel_s_bits(tmp_path, monkeypatch):
    """The 512-bit product (the default where the CPU has AVX-512; SPECVIZ_KERNEL_WIDE=0 builds the 256-bit
    one) must give the 256-bit kernel's results bit for bit, at every row count and thread count."""
    from specviz.fastpath import rows

    _need_rows_kernel()
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setenv("SPECVIZ_KERNEL_WIDE", "1")
    wide, why = rows._load()
    assert wide is not None, why
    if not wide.specviz_isa().decode().startswith("avx512 (512"):
        pytest.skip(f"no AVX-512 here: the variant is not built ({wide.specviz_isa().decode()})")
    assert rows.wide_wanted()
    monkeypatch.setenv("SPECVIZ_KERNEL_WIDE", "0")
    narrow, why = rows._load()
    assert narrow is not None, why
    assert narrow.specviz_isa().decode().startswith("avx512 (256")
    monkeypatch.delenv("SPECVIZ_KERNEL_WIDE")
    assert rows.wide_wanted() == rows._has_avx512()          # unset: the CPU decides
    g = torch.Generator().manual_seed(0)
    for n, k in ((37, 40), (200, 72), (33, 7)):
        p = rows.pack(torch.randn(n, k, generator=g))
        for m in (*range(1, 18), 24, 25, 40):          # 12 rows on: two blocks at a time (rows.c, PAIR_ROWS)
            x = torch.randn(m, k, generator=g)
            for threads in (1, 2):
                ys = []
                for lib in (narrow, wide):
                    y = torch.empty(m, p.blocks.shape[0] * rows.BLOCK)
                    lib.specviz_rows(x.data_ptr(), m, k, p.blocks.data_ptr(), y.shape[1], y.data_ptr(), threads)
                    ys.append(y)
                assert torch.equal(*ys), (n, k, m, threads)


def test_truncate_forgets_the_passes_after_a_length(loaded):
    """A timing loop cuts the static cache back after each pass: the next pass then computes what it
    computes on the bare context (the breadth-vs-depth chapter times the fast path this way)."""
    model = loaded["target"].model
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    ctx, blk = torch.randint(3, V, (2, 9), generator=g), torch.randint(3, V, (2, 4), generator=g)
    ones = lambda t: torch.ones_like(t, dtype=torch.bool)          # noqa: E731
    with torch.inference_mode():
        fresh = StaticCache(CompactLlama(model), 2)
        fresh.forward(model, ctx, ones(ctx))
        want = fresh.forward(model, blk, ones(blk))
        cut = StaticCache(CompactLlama(model), 2)
        cut.forward(model, ctx, ones(ctx))
        for _ in range(3):
            got = cut.forward(model, blk, ones(blk))
            assert cut.length == 13
            cut.truncate(9)
            assert cut.length == 9 and cut.n_valid.tolist() == [9, 9]
            assert (got - want).abs().max() < 1e-5
