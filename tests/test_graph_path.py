"""The graph path's machinery on a CPU (specviz.fastpath.graphs, graphcache, buckets): the same buckets,
padding, KV arena, static buffers and lock that CUDA graphs replay on a GPU, with the captured body simply
run ("bucketed static shapes", never called CUDA graphs). What a CPU can prove: the bucket choice, greedy
exactness of padded passes against the target's own generate(), that nothing is reallocated or captured
after warm-up, that threads take turns through the lock, and that the counters count."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from specviz.engine.request import Knobs, Request
from specviz.engine.synthetic import reference_run
from specviz.fastpath import FastPath, cache_factory, resolve
from specviz.fastpath.buckets import Buckets, Shape, for_roofline, parse
from specviz.fastpath.graphcache import GraphCache

pytestmark = pytest.mark.usefixtures("one_model_thread")

ROOT = Path(__file__).resolve().parents[1]
MAX_NEW = 24
SMALL = "rows=1,2,4,8;tokens=1,2,3,4,5,6,8,10;slots=64,128;wide=16"


@pytest.fixture
def bucketed(make_pair, monkeypatch):
    """`make_pair(draft)` on the CPU's graph path: small buckets, the stock layout (no timing)."""
    monkeypatch.setenv("SPECVIZ_BUCKETS_ON_CPU", "1")
    monkeypatch.setenv("SPECVIZ_GRAPH_BUCKETS", SMALL)
    monkeypatch.setenv("SPECVIZ_LAYOUT", "stock")
    return lambda draft: make_pair(draft, "on")


def _target_runner(pair):
    return pair.fast.runners[0]


# --- buckets -------------------------------------------------------------------------------------------
def test_a_pass_takes_the_smallest_bucket_that_holds_it():
    b = Buckets()
    assert b.pick(1, 1, 0) == Shape(1, 1, 256)
    assert b.pick(3, 5, 100) == Shape(4, 5, 256)
    # the arithmetic: k + 1 = 9 at 64 rows computes 640 tokens, not 1,024 (a bucket of 16)
    sh = b.pick(64, 9, 300)
    assert sh == Shape(64, 10, 512) and sh.rows * sh.tokens == 640
    assert b.pick(1, 16, 240) == Shape(1, 16, 256) and b.pick(1, 16, 241) == Shape(1, 16, 512)
    assert b.pick(1, 20, 0) == Shape(1, 32, 256)            # wide blocks at one row only
    assert b.pick(2, 20, 0) is None and b.pick(65, 1, 0) is None and b.pick(1, 1, 2048) is None
    shapes = b.shapes()
    assert len(shapes) == len(set(shapes)) == 7 * 10 * 4 + sum(1 for t in b.wide for s in b.slots if t <= s)
    size = [r * t * s for r, t, s in shapes]
    assert size[0] == max(size) and size[1:] == sorted(size[1:])   # the pool's sizer, then decode shapes first
    assert shapes[1] == Shape(1, 1, 256)
    grid = set(shapes)
    for rows in (1, 2, 3, 5, 17, 40, 64):
        for tokens in (1, 2, 7, 9, 11, 13, 16, 17):
            for length in (0, 100, 250, 600, 2040):
                got = b.pick(rows, tokens, length)
                fits = [s for s in grid if s.rows >= rows and s.tokens >= tokens and s.slots >= length + s.tokens]
                if not fits:
                    assert got is None, (rows, tokens, length)
                    continue
                # fewest rows, then fewest tokens, then fewest slots
                best = min(fits, key=lambda f: (f.rows, f.tokens, f.slots))
                assert got == best, (rows, tokens, length, got, best)


def test_buckets_parse_shrink_and_say_what_is_wrong():
    assert parse("rows=2,1;tokens=3,1;slots=64") == Buckets(rows=(1, 2), tokens=(1, 3), slots=(64,))
    assert parse("") == Buckets()
    for bad, why in (("cols=1", "unknown part"), ("rows=a", "whole numbers"), ("rows=0", "at least 1"),
                     ("slots=", "at least 1")):
        with pytest.raises(ValueError, match=why):
            parse(bad)
    b = Buckets(rows=(1, 2, 4), slots=(64, 128))
    assert b.within(4 * 128 * 10, 10) == b
    assert b.within(2 * 128 * 10, 10).rows == (1, 2)
    assert b.within(64 * 10, 10) == Buckets(rows=(1,), slots=(64,))
    roof = for_roofline([1, 2, 4, 8, 1024, 2048], 256, 1024)
    assert roof.rows == (1,) and roof.tokens == (1, 2, 4, 8, 1024) and roof.wide == ()
    assert roof.pick(1, 1024, 256 + 1024) == Shape(1, 1024, 4096) and roof.pick(1, 2048, 256) is None


# --- exactness: padded passes give the target's own greedy tokens -------------------------------------
# (draft, batch, depth, new tokens): every draft kind, rows and depths that pad (3 → 4 rows, k + 1 = 7 → 8,
# 9 → 10), a batch over the largest rows bucket (its passes run eagerly), and a run that outgrows the arena
CASES = [
    ("ngram", 1, 0, MAX_NEW),
    ("ngram", 3, 4, MAX_NEW),
    ("draft", 3, 2, MAX_NEW),
    ("draft", 6, 6, MAX_NEW),
    ("layerskip:1-2", 5, 9, MAX_NEW),
    ("target", 2, 7, MAX_NEW),
    ("ngram", 9, 3, MAX_NEW),
    ("layerskip:1-2", 2, 4, 120),
]


@pytest.mark.parametrize("draft,batch,depth,max_new", CASES)
def test_padded_passes_are_greedy_exact(bucketed, prompts, reference, draft, batch, depth, max_new):
    pair = bucketed(draft)
    runner = _target_runner(pair)
    before = runner.stats()
    eng = pair.engine()
    events = list(eng.generate(prompts, Knobs(depth=depth, batch_size=batch), max_new))
    outs = eng.outputs()
    assert len(outs) == batch
    for row, out in outs.items():
        assert out == reference(row, max_new), f"row {row} differs from target.generate ({draft}, k={depth})"
    after = runner.stats()
    assert after.captures == before.captures and after.captures_after_warmup == 0
    if batch <= 8:
        assert after.replays - before.replays >= len(events) // 2
        assert after.padded_tokens - before.padded_tokens >= after.block_tokens - before.block_tokens > 0
    else:                                    # more rows than any bucket: those steps ran outside the buckets
        wide = sum(ev.batch_size > 8 for ev in events)
        assert wide and after.eager_passes - before.eager_passes >= wide
    if max_new > 100:                        # past the largest slots bucket the cache left the arena
        assert after.spills > before.spills and after.eager_passes > before.eager_passes


def test_padded_passes_through_our_c_layers_are_greedy_exact(make_pair, monkeypatch, prompts, reference):
    """The rehearsal's body as the CPU serves it where our kernel wins: whole layers in C, padded."""
    from specviz.fastpath import layout

    if "rows" not in layout.available(torch.float32):
        pytest.skip("no C kernel on this machine")
    monkeypatch.setenv("SPECVIZ_BUCKETS_ON_CPU", "1")
    monkeypatch.setenv("SPECVIZ_GRAPH_BUCKETS", "rows=1,2,4;tokens=1,2,3,4,6;slots=64,128;wide=")
    monkeypatch.setenv("SPECVIZ_LAYOUT", "rows")
    pair = make_pair("layerskip:1-2", "on")
    assert "layers in C" in pair.fast.layout
    before = _target_runner(pair).stats()
    eng = pair.engine()
    list(eng.generate(prompts, Knobs(depth=4, batch_size=3), MAX_NEW))
    for row, out in eng.outputs().items():
        assert out == reference(row, MAX_NEW), f"row {row}"
    assert _target_runner(pair).stats().replays > before.replays


def test_rows_joining_and_leaving_reuse_the_arena_and_nothing_is_reallocated(bucketed, prompts, reference):
    """Rows join mid-run (a merge into the arena) and finish at different steps (rows move within it):
    the arena and the static buffers keep their addresses, nothing is captured after warm-up, every pass
    that replays runs on the arena itself, and the output stays exact."""
    pair = bucketed("ngram")
    runner = _target_runner(pair)
    tensors = runner.keys + runner.values + [runner.tok, runner.pos, runner.vis, runner.slots, runner.out]
    addresses = [t.data_ptr() for t in tensors]
    before = runner.stats()
    eng = pair.engine()
    knobs = Knobs(depth=3, batch_size=1)
    on_arena = []
    gen = eng.generate(prompts, knobs, MAX_NEW)
    for i, ev in enumerate(gen):
        if i == 1:
            knobs.set(batch_size=3)
        if i == 3:
            knobs.set(batch_size=6)
        kv = eng.target_kv
        on_arena.append(kv.attached and kv.kbufs[0].data_ptr() == runner.keys[0].data_ptr())
    assert any(on_arena)
    assert [t.data_ptr() for t in tensors] == addresses
    after = runner.stats()
    assert after.captures == before.captures and after.captures_after_warmup == after.compiles_after_warmup == 0
    assert after.replays > before.replays
    for row, out in eng.outputs().items():
        assert out == reference(row, MAX_NEW), f"row {row}"


# --- the thread rule -------------------------------------------------------------------------------------
def test_two_threads_take_turns_through_the_lock(bucketed, prompts, reference):
    """Two engines of one pair stepped from two threads at once (a lesson's engine beside the class's):
    the replays never overlap, each engine's rows leave the arena for the other's and come back (spills),
    and both stay exact."""
    pair = bucketed("layerskip:1-2")
    runner = _target_runner(pair)
    runner.max_inside = 0
    spills = runner.stats().spills
    turn = threading.Barrier(2, timeout=120)
    results, errors = {}, []

    def run(name: str, batch: int, depth: int) -> None:
        try:
            eng = pair.engine()
            for _ in eng.generate(prompts, Knobs(depth=depth, batch_size=batch), MAX_NEW):
                if not turn.broken:
                    try:
                        turn.wait()              # both engines step in every round
                    except threading.BrokenBarrierError:
                        pass
            results[name] = eng.outputs()
        except Exception as exc:                 # reported below, in the test's thread
            errors.append(exc)
        finally:
            turn.abort()                         # the other thread goes on alone
    threads = [threading.Thread(target=run, args=("a", 3, 4)), threading.Thread(target=run, args=("b", 2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    assert runner.max_inside == 1
    assert runner.stats().spills > spills
    for name in ("a", "b"):
        for row, out in results[name].items():
            assert out == reference(row, MAX_NEW), f"engine {name}, row {row}"


def test_the_class_runs_on_the_graph_path_from_the_scheduler_s_threads(bucketed, prompts, greedy, monkeypatch):
    """The shared scheduler steps the graph path from its own thread; when it has been idle its thread
    ends and a new one serves the next class (graphs captured on the test's thread replay there); a
    lesson's engine runs beside it meanwhile. Every request is done and greedy-exact."""
    from specviz.serve import scheduler as sched_mod
    from specviz.serve.workload import shared_scheduler, users_at_once

    monkeypatch.setattr(sched_mod, "IDLE_S", 0.2)
    pair = bucketed("ngram")
    sched = shared_scheduler(pair)
    served = []
    try:
        for wave in range(2):
            if served:                        # the idle scheduler's thread ends before the next class
                served[-1].join(30)
                assert not served[-1].is_alive()
            reqs = [Request([prompts[(i + wave) % 4]], Knobs(depth=1 + i % 4, batch_size=1 + i % 2), MAX_NEW)
                    for i in range(4)]
            lesson = threading.Thread(target=lambda: list(pair.engine().generate(
                prompts[:2], Knobs(depth=2, batch_size=2), 8)))
            lesson.start()
            _, runs = users_at_once(sched, reqs)
            served.append(sched._thread)
            lesson.join(120)
            for req, run in zip(reqs, runs):
                assert run.error is None, run.error
                assert run.outputs == greedy(req.prompt_of(0), MAX_NEW)
        assert served[0] is not served[1]
    finally:
        sched.close()
    assert _target_runner(pair).stats().captures_after_warmup == 0


# --- counts and labels --------------------------------------------------------------------------------
def test_counts_and_labels_say_what_ran(bucketed, prompts, monkeypatch):
    pair = bucketed("layerskip:1-2")
    shapes = len(parse(SMALL).shapes())
    assert pair.fast.mode == "buckets" and pair.fast.graphs == 2 * shapes      # the target's and the draft's
    assert pair.fast.shown.startswith(f"bucketed static shapes (CPU, no CUDA graphs), {2 * shapes} shapes; weights ")
    assert "CUDA graphs," not in pair.fast.shown
    stats = pair.fast.graph_stats()
    assert stats.kind == "cpu" and stats.graphs == stats.captures == 2 * shapes and stats.compiles == 0
    calls = []
    real = GraphCache.forward

    def counted(self, *a, **kw):
        calls.append(1)
        return real(self, *a, **kw)
    monkeypatch.setattr(GraphCache, "forward", counted)
    eng = pair.engine()
    events = list(eng.generate(prompts[:2], Knobs(depth=3, batch_size=2), 12))
    after = pair.fast.graph_stats()
    assert (after.replays - stats.replays) + (after.eager_passes - stats.eager_passes) == len(calls) > 0
    assert all(ev.path == pair.fast.shown for ev in events)
    assert after.captures_after_warmup == after.compiles_after_warmup == 0
    line = after.line()
    assert f"{2 * shapes} bucketed shapes on a CPU (no CUDA graphs)" in line and "0 and 0 after warm-up" in line


def test_a_pass_reports_the_tokens_its_bucket_computed(bucketed, prompts):
    """`last_padded`: what the engine's step event can report beside tokens_per_pass."""
    pair = bucketed("ngram")
    cache = pair.target_cache(0)
    assert cache.emptied(3) and cache.attached
    tokens = torch.tensor([p[:4] + [5] for p in prompts[:3]])
    ones = torch.ones_like(tokens, dtype=torch.bool)
    with torch.inference_mode():
        cache.forward(None, tokens, ones, 1)              # 3 rows × 5 tokens in the (4, 5, 64) bucket
        assert cache.last_padded == 4 * 5
        cache.forward(None, tokens[:, :1], ones[:, :1])   # (4, 1, 64)
        assert cache.last_padded == 4
        wide = torch.tensor([prompts[1] * 3])[:, :40]     # one row of 40 tokens: no bucket, run as it is
        solo = pair.target_cache(1)
        solo.forward(None, wide[:, :2], torch.ones(1, 2, dtype=torch.bool))
        solo.forward(None, wide, torch.ones_like(wide, dtype=torch.bool))
        assert solo.last_padded == 40


def test_a_failed_warm_up_leaves_the_pair_eager_with_a_sentence(loaded, monkeypatch):
    from specviz.fastpath import graphs

    def refuse(self):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(graphs.GraphRunner, "_capture_all", refuse)
    monkeypatch.setenv("SPECVIZ_GRAPH_BUCKETS", "rows=1;tokens=1;slots=32;wide=")
    factory, fast = cache_factory(loaded["draft"].model, FastPath("buckets"))
    assert factory is None and fast.mode == "off"
    assert fast.note.startswith("the graph path could not warm up (RuntimeError: operation not permitted")


def test_auto_takes_the_graph_path_only_where_it_measured_faster(loaded, monkeypatch):
    import specviz.fastpath as fp

    monkeypatch.setenv("SPECVIZ_GRAPH_BUCKETS", "rows=1,2;tokens=1,2;slots=64")
    monkeypatch.setenv("SPECVIZ_LAYOUT", "stock")
    assert resolve("auto", "cpu").mode == "static"              # a CPU's auto is unchanged
    assert resolve("on", "cuda").mode == "graphs" and resolve("static", "cuda").mode == "static"
    monkeypatch.setattr(fp, "_on_cpu", lambda device: False)
    auto = resolve("auto")
    assert auto.mode == "graphs" and auto.auto
    model = loaded["draft"].model
    monkeypatch.setattr(fp, "one_token_ms", lambda m, new_cache: (1.0, 2.0))
    factory, fast = cache_factory(model, auto)
    assert factory is not None and fast.mode == "buckets" and "measured faster" in fast.note and fast.graphs == 6
    monkeypatch.setattr(fp, "one_token_ms", lambda m, new_cache: (3.0, 2.0))
    factory, fast = cache_factory(model, auto)
    assert factory is None and fast.mode == "off" and "3.00 vs 2.00 ms" in fast.note
    monkeypatch.undo()
    ours, eager = fp.one_token_ms(model, factory or cache_factory(model, FastPath("buckets"))[0])
    assert ours > 0 and eager > 0


def test_a_compiled_forward_compiles_at_warm_up_only(loaded, prompts, reference, monkeypatch):
    """SPECVIZ_GRAPH_FORWARD=compiled: the decoder layer is compiled while the shapes are captured, and
    never afterwards. Dynamo's "aot_eager" backend stands in for inductor, whose C++ builds take minutes
    on a busy CPU: what is tested is when compilations happen and that they are counted."""
    from dataclasses import replace

    from specviz.fastpath import graphs
    from specviz.fastpath.graphs import runner_for
    from specviz.fastpath.passes import compact_for
    from specviz.pairs.pipeline import load_pair

    monkeypatch.setattr(graphs, "COMPILE_BACKEND", "aot_eager")
    monkeypatch.setenv("SPECVIZ_LAYOUT", "stock")
    target = loaded["target"]
    small = Buckets(rows=(2,), tokens=(3,), slots=(64,), wide=())
    runner = runner_for(target.model, lambda: compact_for(target.model), small, "compiled")
    st = runner.stats()
    assert st.forward == "compiled" and st.compiles >= 1 and st.graphs == len(small.shapes())
    pair = load_pair(target.ref, "ngram", target=target, compile="off")
    pair = replace(pair, target_cache=runner.new_cache, fast=FastPath("buckets", graphs=runner.graphs,
                                                                      runners=(runner,)))
    eng = pair.engine()
    list(eng.generate(prompts[:2], Knobs(depth=2, batch_size=2), 12))
    for row, out in eng.outputs().items():
        assert out == reference(row, 12)
    after = runner.stats()
    assert after.compiles == st.compiles and after.compiles_after_warmup == 0 and after.replays > st.replays


# --- the roofline says where the graph path ends --------------------------------------------------------
def test_no_shape_sees_the_whole_arena_so_all_views_are_strided_alike(bucketed):
    """The arena has one slot more than any bucket: a view of the whole arena would be contiguous where
    every other is strided, and the compiled layer would compile a variant for it."""
    runner = _target_runner(bucketed("ngram"))
    assert runner.keys[0].shape[1] > 1                               # a strided view is told apart
    for sh in runner.buckets.shapes():
        for buf in (runner.keys[0], runner.values[-1]):
            assert not buf[:sh.rows, :, :sh.slots].is_contiguous(), sh
    assert runner.stats().arena_bytes == sum(t.numel() * t.element_size() for t in runner.keys + runner.values)


def test_each_runner_compiles_its_own_layer_and_lets_its_arena_go(loaded, monkeypatch):
    """Dynamo keeps compiled entries, up to a limit, on the function's code object: runners sharing one
    would crowd each other out (the later ones silently eager), and its cache would keep every runner's
    arena alive. Each runner's layer is its own copy, and the cache holds the runner only weakly."""
    import gc
    import weakref

    from specviz.fastpath import graphs
    from specviz.fastpath.passes import compact_for

    monkeypatch.setattr(graphs, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(graphs, "RECOMPILE_LIMIT", 8)           # Dynamo's own default, for 3 runners to pass
    monkeypatch.setenv("SPECVIZ_LAYOUT", "stock")
    compact = compact_for(loaded["target"].model)
    counts = []
    with torch._dynamo.config.patch(recompile_limit=8):       # (pytest's monkeypatch deletes it on undo)
        for slots in (64, 128, 256):                # 3 runners x 4 compilations: past Dynamo's default 8
            runner = graphs.GraphRunner(compact, Buckets(rows=(1, 2), tokens=(1, 3), slots=(slots,), wide=()),
                                        "compiled")
            counts.append(runner.stats().compiles)
    assert counts[0] >= 3 and counts == [counts[0]] * 3, counts
    gone = weakref.ref(runner)
    del runner
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("faster", ["compiled", "eager", "neither: compiling fails"])
def test_auto_keeps_the_forward_whose_replay_timed_faster(loaded, prompts, reference, monkeypatch, faster,
                                                          tmp_path):
    """SPECVIZ_GRAPH_FORWARD=auto (the default): where the backend probes (CUDA), the one-token shape is
    captured with both forwards and the faster replay's forward serves every shape; where compiling fails
    the eager one does, with a sentence. The timer is a stand-in (which forward a replay ran decides its
    milliseconds): what is tested is the choice, not a CPU's speed."""
    from dataclasses import replace

    from specviz.fastpath import graphs
    from specviz.fastpath.passes import compact_for
    from specviz.pairs.pipeline import load_pair

    monkeypatch.setattr(graphs, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(graphs.CpuRehearsal, "probes", True)
    monkeypatch.setenv("SPECVIZ_LAYOUT", "stock")
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))  # no verdict kept from another case
    ran = []                                             # which forward each pass ran
    ms = {"eager": 1.0, "compiled": 2.0} if faster == "eager" else {"eager": 2.0, "compiled": 1.0}

    def timed(self, replay, n):
        ran.clear()
        replay()
        return ms[ran[-1]]
    monkeypatch.setattr(graphs.CpuRehearsal, "time_ms", timed)
    real_compiled = graphs.GraphRunner._compiled_forward

    def compiled(self):
        fwd = real_compiled(self)
        if faster.startswith("neither"):              # compiling is lazy: it fails at the first call
            def fails(*a, **kw):
                raise RuntimeError("inductor could not lower this")
            return fails

        def run(*a, **kw):
            ran.append("compiled")
            n = len(ran)
            out = fwd(*a, **kw)
            del ran[n:]                       # it calls the compact forward with the layer compiled
            return out
        return run
    monkeypatch.setattr(graphs.GraphRunner, "_compiled_forward", compiled)
    target = loaded["target"]
    compact = compact_for(target.model)
    eager = compact.hidden
    compact.hidden = lambda *a, **kw: (ran.append("eager"), eager(*a, **kw))[1]
    small = Buckets(rows=(2,), tokens=(1, 3), slots=(64,), wide=())
    runner = graphs.GraphRunner(compact, small, "auto")
    st = runner.stats()
    want = "eager" if faster != "compiled" else "compiled"
    assert st.forward == want and st.graphs == len(small.shapes()) and st.compiles_after_warmup == 0, st
    if faster.startswith("neither"):
        assert st.choice == "auto: the compiled forward failed (RuntimeError)" and st.compiles == 0
    else:
        assert st.choice == ("auto, one-token replay: eager 2.000 ms, compiled 1.000 ms" if want == "compiled"
                             else "auto, one-token replay: eager 1.000 ms, compiled 2.000 ms")
        assert f"{want} forward ({st.choice})" in st.line()
    pair = load_pair(target.ref, "ngram", target=target, compile="off")
    pair = replace(pair, target_cache=runner.new_cache, fast=FastPath("buckets", graphs=runner.graphs,
                                                                      runners=(runner,)))
    ran.clear()
    before = runner.stats().replays
    eng = pair.engine()
    list(eng.generate(prompts[:2], Knobs(depth=2, batch_size=2), 12))
    replays = runner.stats().replays - before            # each ran the kept forward (prefills run eagerly)
    assert replays > 0 and ran.count("compiled") == (replays if want == "compiled" else 0)
    for row, out in eng.outputs().items():
        assert out == reference(row, 12)
    assert runner.stats().compiles_after_warmup == 0


@pytest.mark.parametrize("faster", ["eager", "compiled"])
def test_auto_keeps_an_eager_verdict_so_the_next_load_compiles_nothing(loaded, monkeypatch, tmp_path, faster):
    """Where eager timed faster, the next runner of that device and model shape keeps eager without
    compiling (`<cache>/graph-forward.json`), and says so; a compiled verdict is timed again (its compile
    is needed to serve anyway); `specviz calibrate`'s forget, or another model shape, times again."""
    import itertools

    from specviz.fastpath import forwardchoice, graphs
    from specviz.fastpath.passes import compact_for

    monkeypatch.setattr(graphs, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(graphs.CpuRehearsal, "probes", True)
    monkeypatch.setenv("SPECVIZ_LAYOUT", "stock")
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    times = itertools.cycle([1.0, 2.0] if faster == "eager" else [2.0, 1.0])     # each round: eager, compiled
    monkeypatch.setattr(graphs.CpuRehearsal, "time_ms", lambda self, replay, n: next(times))
    real, built = graphs.GraphRunner._compiled_forward, []
    monkeypatch.setattr(graphs.GraphRunner, "_compiled_forward", lambda self: (built.append(1), real(self))[1])
    small = Buckets(rows=(1,), tokens=(1, 2), slots=(32,), wide=())

    def load(model):
        built.clear()
        st = graphs.GraphRunner(compact_for(model), small, "auto").stats()
        return st.forward, st.choice, len(built)
    first = load(loaded["target"].model)
    assert first == (faster, f"auto, one-token replay: eager {1.0 if faster == 'eager' else 2.0:.3f} ms, compiled "
                             f"{2.0 if faster == 'eager' else 1.0:.3f} ms", 1)
    again = load(loaded["target"].model)
    if faster == "eager":
        assert again[0] == "eager" and again[2] == 0, again
        assert again[1].startswith("auto, kept from its timing on ") and "eager 1.000 ms, compiled 2.000 ms" in again[1]
        assert load(loaded["draft"].model)[2] == 1                 # another shape: its own timing
        forwardchoice.forget(loaded["target"].device)
        assert load(loaded["target"].model)[2] == 1                # forgotten: timed again
        path = tmp_path / forwardchoice.FILE                       # a week old: timed again
        table = json.loads(path.read_text())
        for entry in table.values():
            entry["at"] -= 8 * 24 * 3600
        path.write_text(json.dumps(table))
        assert load(loaded["target"].model)[2] == 1 and load(loaded["target"].model)[2] == 0
    else:
        assert again == first


def test_auto_on_a_cpu_rehearsal_times_nothing_and_keeps_eager(loaded, monkeypatch):
    from specviz.fastpath import graphs
    from specviz.fastpath.passes import compact_for

    monkeypatch.setattr(graphs.GraphRunner, "_compiled_forward", lambda self: pytest.fail("compiled on a CPU"))
    runner = graphs.GraphRunner(compact_for(loaded["draft"].model), Buckets(rows=(1,), tokens=(1,), slots=(32,),
                                                                             wide=()), "auto")
    assert runner.stats().forward == "eager" and runner.stats().choice == "" and runner.stats().compiles == 0
    with pytest.raises(ValueError, match="SPECVIZ_GRAPH_FORWARD must be one of auto, eager, compiled"):
        graphs.GraphRunner(runner.compact, runner.buckets, "fused")


def test_roofline_measures_the_graph_path_and_says_where_it_ends(tiny_paths, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "SPECVIZ_CACHE": str(tmp_path / "c"),
           "SPECVIZ_BUCKETS_ON_CPU": "1", "SPECVIZ_GRAPH_BUCKETS": "rows=1;tokens=1,2,4;slots=32,64;wide=",
           "SPECVIZ_LAYOUT": "stock"}
    r = subprocess.run([sys.executable, "-m", "specviz", "roofline", "--target", tiny_paths["target"],
                        "--compile", "on", "--max-tokens", "8", "--context", "16", "--repeats", "1",
                        "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "r" / "roofline.json").read_text())
    assert res["tokens_per_pass"] == [1, 2, 4, 8] and res["in_graph"] == [True, True, True, False]
    assert res["graph_max_tokens"] == 4 and res["path"] == "bucketed static shapes (CPU, no CUDA graphs)"
    assert res["graphs"]["captures_after_warmup"] == 0 and res["graphs"]["replays"] > 0
    lines = r.stdout.splitlines()
    assert "beyond the graph path's largest bucket" in next(x for x in lines if x.strip().startswith("8 tokens"))
    assert not any("beyond" in x for x in lines if x.strip().startswith(("1 ", "2 ", "4 ")))
    assert any(x.startswith("graphs: ") and "no CUDA graphs" in x for x in lines)


def test_a_cache_that_outgrew_the_arena_takes_it_again_for_the_next_batch(loaded, prompts, reference, monkeypatch):
    """A long-lived engine (the scheduler's) whose cache outgrew the arena's slots, emptied, then given a new
    batch: it moves back into the arena with no rows to copy, and stays exact (the frontier on the graph
    path once failed here: its old length was copied as if it held rows)."""
    from dataclasses import replace

    from specviz.fastpath import graphs
    from specviz.fastpath.passes import compact_for
    from specviz.pairs.pipeline import load_pair

    monkeypatch.setenv("SPECVIZ_LAYOUT", "stock")
    target = loaded["target"]
    fits = max(len(p) for p in prompts[:2]) + 10          # room for the prompts and some, not for 20 tokens
    runner = graphs.GraphRunner(compact_for(target.model), Buckets(rows=(1, 2), tokens=(1, 2, 3), slots=(fits,),
                                                                   wide=()), "eager")
    pair = load_pair(target.ref, "ngram", target=target, compile="off")
    pair = replace(pair, target_cache=runner.new_cache, fast=FastPath("buckets", graphs=runner.graphs,
                                                                      runners=(runner,)))
    eng = pair.engine()
    for max_new in (20, 6):                 # 20 tokens outgrow the slots; the next batch starts emptied
        list(eng.generate(prompts[:2], Knobs(depth=2, batch_size=2), max_new))
        for row, out in eng.outputs().items():
            assert out == reference(row, max_new)
    assert runner.stats().spills >= 1 and runner.stats().replays > 0


@pytest.mark.parametrize("command", ["generate", "frontier"])
def test_the_class_commands_report_the_graph_counters(tiny_paths, tmp_path, command):
    """Every output says how many graphs exist and that nothing was captured or compiled after warm-up
    (scripts/gpu-check's counters read these)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "SPECVIZ_CACHE": str(tmp_path / "c"),
           "SPECVIZ_BUCKETS_ON_CPU": "1", "SPECVIZ_GRAPH_BUCKETS": "rows=1,2;tokens=1,2,3,4;slots=64;wide=",
           "SPECVIZ_LAYOUT": "stock"}
    own = (["--prompt", "the quick brown", "--batch-size", "2", "--depth", "2", "--max-new-tokens", "6", "--check"]
           if command == "generate" else ["--users", "2", "--depths", "0,2", "--max-new-tokens", "6",
                                          "--cell-tokens", "0"])
    r = subprocess.run([sys.executable, "-m", "specviz", command, "--target", tiny_paths["target"], "--draft",
                        "ngram", "--compile", "on", "--json", *own], capture_output=True, text=True, timeout=300,
                       env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])["graphs"]
    assert got["graphs"] == len(parse(env["SPECVIZ_GRAPH_BUCKETS"]).shapes()) and got["replays"] > 0
    assert got["captures_after_warmup"] == 0 and got["compiles_after_warmup"] == 0


# --- what a step waits for -------------------------------------------------------------------------------
STEP_CODE = ("specviz/engine/", "specviz/fastpath/graphcache.py", "specviz/fastpath/cache.py",
             "specviz/fastpath/graphs.py")


@pytest.mark.parametrize("draft, depth", [("synthetic:0.7", 4), ("ngram", 3), ("synthetic:0.7", 0)])
def test_a_step_waits_for_the_device_for_its_verdict_only(bucketed, prompts, monkeypatch, draft, depth):
    """On a GPU the host waits for the device at every read of a device tensor (`.tolist()`, `nonzero`, …)
    and at every plain copy onto it (`torch.tensor(…, device=…)`; `kvcache.to_device` copies from pinned
    memory and waits for nothing). A greedy step with a free draft waits once, for the target's argmax: the
    cache keeps its rows' counts on the host, so positions and the compaction check read nothing back.
    (The forward is left out: on a GPU it is one graph. So are the steps that admit or retire rows, and the
    first step after them, which reads the counts once.) Counted on the host's tensors, which stand in for
    the device's here."""
    pair = bucketed(draft)
    eng = pair.engine()
    refs = reference_run(eng, prompts[:3], 3, 2 * MAX_NEW)[0] if draft.startswith("synthetic") else None
    eng = pair.engine()
    me, waits = threading.get_ident(), []

    def count(name, real):
        def counted(*a, **k):
            caller = sys._getframe(1)
            if name != "tensor" or k.get("device") is not None:
                if threading.get_ident() == me and any(p in caller.f_code.co_filename.replace("\\", "/")
                                                       for p in STEP_CODE):
                    waits.append(f"{name} {caller.f_code.co_filename}:{caller.f_lineno}")
            return real(*a, **k)
        return counted
    for name in ("tolist", "item", "__int__", "__bool__", "__float__", "__index__", "nonzero", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, count(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch, "tensor", count("tensor", torch.tensor))
    per_step, before, changed = [], 0, True
    for ev in eng.generate(prompts[:3], Knobs(depth, 3), 2 * MAX_NEW, references=refs):
        if not changed:
            per_step.append(waits[before:])
        before, changed = len(waits), any(r.done for r in ev.rows)
    assert len(per_step) >= 6
    assert all(len(w) == 1 for w in per_step[1:]), per_step


def test_the_step_audit_script_counts_what_a_step_launches_and_reads(tiny_paths, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECVIZ_CACHE": str(tmp_path / "c"), "SPECVIZ_GRAPH_BUCKETS": SMALL,
           "SPECVIZ_LAYOUT": "stock"}
    script = str(ROOT / "scripts" / "step-audit.py")
    r = subprocess.run([sys.executable, script, "--target", tiny_paths["target"], "--batch", "2", "--depth", "3",
                        "--max-new-tokens", "24", "--runs", "1"], capture_output=True, text=True, timeout=300,
                       env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["steps"] >= 4 and got["tokens_a_step"] > 1 and got["host_us_a_step"] > 0
    assert got["launches"].get("linear") and got["reads"].get("tolist")       # the LM head; the verdict
    # the verdict, and a few rows' ends; the block, its validity and positions go over pinned memory
    assert 1 <= got["waits_a_step"] <= 2 and 3 <= got["copies_a_step"]["pinned"] <= 5, got["copies_a_step"]
    assert got["launches_a_step"] < 20                  # 7715d99 launched 42 here
    bad = subprocess.run([sys.executable, script, "--target", tiny_paths["target"], "--batch", "0"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert bad.returncode == 2 and "--batch takes 1-64" in bad.stderr
