"""The graph path on a CUDA device: what the CPU rehearsal (tests/test_graph_path.py) cannot prove.

Skipped without CUDA. On a GPU box without pytest, run it as a script (about a minute on an H200):

    python tests/test_graph_path_cuda.py

GRAPH_CHECK_DEVICE=cpu runs the same checks on the CPU rehearsal (no timing), to check the checks.

It checks, in fp32 with TF32 off (so greedy exactness is a meaningful test): that a pair built with
`--compile on` captures real CUDA graphs at warm-up and nothing afterwards; that padded, replayed passes
give the target's own greedy tokens (n-gram and layer-skip drafts, padded rows and depths); that two
threads and the shared scheduler's thread (recreated after idling, the failure of inductor's cudagraph
trees) replay the same graphs, taking turns; that the arena keeps its addresses; that the compiled
forward compiles at warm-up only, and that auto times both forwards and keeps one; in bf16, that padding
rows put no NaN in the arena (and which attention kernels ran), and how many kernels one decoder layer
launches; that a decode step waits for the device twice besides its timing syncs (sync debug mode). Then, in bf16 on the 1.7B shape, it prints (never asserts) a one-token pass on the graph path
against the stock modules, and the counters.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

MAX_NEW = 24
SMALL = "rows=1,2,4,8;tokens=1,2,3,4,5,6,8,10;slots=64,128;wide=16"
DEVICE = os.environ.get("GRAPH_CHECK_DEVICE", "cuda")
CUDA = DEVICE == "cuda"
MODE = "graphs" if CUDA else "buckets"
if not CUDA:
    os.environ["SPECVIZ_BUCKETS_ON_CPU"] = "1"


class Ctx:
    """A tiny pair on the GPU in fp32, its prompts and the target's own greedy outputs."""

    def __init__(self):
        from tiny import build_pair

        from specviz.pairs.models import load_model
        from specviz.pairs.pipeline import encode_prompt

        os.environ["SPECVIZ_GRAPH_FORWARD"] = "eager"      # compile-free pairs; auto has a check of its own
        os.environ["SPECVIZ_CACHE"] = tempfile.mkdtemp(prefix="graph-cuda-cache-")   # auto times, keeps nothing old
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.paths = build_pair(Path(tempfile.mkdtemp(prefix="graph-cuda-")))
        loaded = load_model(self.paths["target"], DEVICE)
        loaded.model.float()
        self.target = replace(loaded, dtype=torch.float32)
        self.prompts = [encode_prompt(self.target.tokenizer, t, raw=True) for t in
                        ("the quick brown", "a small draft model guesses and the", "memory",
                         "speculative decoding spends")]
        self._refs: dict = {}

    def pair(self, draft: str, compile: str = "on"):
        from specviz.pairs.pipeline import load_pair

        os.environ["SPECVIZ_GRAPH_BUCKETS"] = SMALL
        return load_pair(self.paths["target"], draft, DEVICE, target=self.target, compile=compile)

    def reference(self, prompt: list[int], max_new: int = MAX_NEW) -> list[int]:
        key = (tuple(prompt), max_new)
        if key not in self._refs:
            out = self.target.model.generate(torch.tensor([prompt], device=DEVICE), do_sample=False,
                                             max_new_tokens=max_new, pad_token_id=0, temperature=None,
                                             top_p=None, top_k=None)
            self._refs[key] = out[0, len(prompt):].tolist()
        return self._refs[key]

    def exact_on(self, runner) -> None:
        """Two n-gram rows, depth 2, served by `runner`'s graphs: greedy-exact."""
        from specviz.engine.request import Knobs
        from specviz.fastpath import FastPath

        pair = replace(self.pair("ngram", "off"), target_cache=runner.new_cache,
                       fast=FastPath(MODE, graphs=runner.graphs, runners=(runner,)))
        eng = pair.engine()
        list(eng.generate(self.prompts[:2], Knobs(depth=2, batch_size=2), 12))
        self.exact(eng, 12)

    def exact(self, eng, max_new: int = MAX_NEW) -> None:
        for row, out in eng.outputs().items():
            assert out == self.reference(self.prompts[row % 4], max_new), f"row {row} differs from generate()"


def check_captures_and_exactness(ctx: Ctx) -> None:
    from specviz.engine.request import Knobs

    for draft, batch, depth in (("ngram", 1, 0), ("ngram", 3, 4), ("layerskip:1-2", 5, 9), ("ngram", 9, 3),
                                ("layerskip:1-2", 2, 7)):
        pair = ctx.pair(draft)
        runner = pair.fast.runners[0]
        assert pair.fast.mode == MODE and runner.backend.kind == DEVICE, pair.fast
        arena = [t.data_ptr() for t in runner.keys + [runner.tok, runner.out]]
        before = runner.stats()
        eng = pair.engine()
        events = list(eng.generate(ctx.prompts, Knobs(depth=depth, batch_size=batch), MAX_NEW))
        ctx.exact(eng)
        after = runner.stats()
        assert after.captures == before.captures == after.graphs and after.captures_after_warmup == 0
        assert after.replays > before.replays or batch > 8
        assert [t.data_ptr() for t in runner.keys + [runner.tok, runner.out]] == arena
        assert all(ev.path == pair.fast.shown and ("CUDA graphs," in ev.path) == CUDA for ev in events)
        print(f"  exact: {draft} B={batch} k={depth}; {after.line()}")


def check_threads_and_scheduler(ctx: Ctx) -> None:
    from specviz.engine.request import Knobs, Request
    from specviz.serve import scheduler as sched_mod
    from specviz.serve.workload import shared_scheduler, users_at_once

    pair = ctx.pair("layerskip:1-2")
    runner = pair.fast.runners[0]
    runner.max_inside = 0
    results, errors = {}, []

    def run(name: str, batch: int, depth: int) -> None:
        try:
            eng = pair.engine()
            list(eng.generate(ctx.prompts, Knobs(depth=depth, batch_size=batch), MAX_NEW))
            results[name] = eng
        except Exception as exc:
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(n, b, k)) for n, b, k in (("a", 3, 4), ("b", 2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for eng in results.values():
        ctx.exact(eng)
    assert runner.max_inside == 1
    sched_mod.IDLE_S = 0.2                     # the scheduler's thread ends between the two classes
    sched = shared_scheduler(ctx.pair("ngram"))
    try:
        served = []
        for wave in range(2):
            if served:
                served[-1].join(30)
            reqs = [Request([ctx.prompts[(i + wave) % 4]], Knobs(depth=1 + i % 4, batch_size=1), MAX_NEW)
                    for i in range(8)]
            _, runs = users_at_once(sched, reqs)
            served.append(sched._thread)
            for req, r in zip(reqs, runs):
                assert r.error is None, r.error
                assert r.outputs == ctx.reference(req.prompt_of(0)), "a scheduled request differs"
        assert served[0] is not served[1]
    finally:
        sched.close()
    print(f"  threads: two engines and two scheduler threads exact; max replays at once {runner.max_inside}")


def check_compiled_forward(ctx: Ctx) -> None:
    from specviz.fastpath.buckets import Buckets
    from specviz.fastpath.graphs import runner_for
    from specviz.fastpath.passes import compact_for

    model = ctx.target.model
    t0 = time.perf_counter()
    runner = runner_for(model, lambda: compact_for(model), Buckets(rows=(1, 2), tokens=(1, 3), slots=(64,), wide=()),
                        "compiled")
    st = runner.stats()
    assert st.compiles >= 1 and st.kind == DEVICE
    ctx.exact_on(runner)
    after = runner.stats()
    assert after.compiles == st.compiles and after.compiles_after_warmup == 0 and after.replays > st.replays
    print(f"  compiled forward: {st.compiles} compilations at warm-up, none after ({time.perf_counter() - t0:.1f} s)")


def check_auto_times_both_forwards(ctx: Ctx) -> None:
    """SPECVIZ_GRAPH_FORWARD=auto: the one-token shape captured with both forwards on a probe pool, timed
    by CUDA events, the faster kept for every shape, greedy-exact (on the CPU rehearsal, made to probe)."""
    from specviz.fastpath import graphs
    from specviz.fastpath.buckets import Buckets
    from specviz.fastpath.passes import compact_for

    model, probes = ctx.target.model, graphs.CpuRehearsal.probes
    graphs.CpuRehearsal.probes = True                 # what CUDA does; the rehearsal is made to
    try:
        runner = graphs.runner_for(model, lambda: compact_for(model),
                                   Buckets(rows=(1, 2), tokens=(1, 3), slots=(128,), wide=()), "auto")
    finally:
        graphs.CpuRehearsal.probes = probes
    st = runner.stats()
    assert st.forward in ("eager", "compiled") and "eager " in st.choice and "compiled " in st.choice, st.choice
    ctx.exact_on(runner)
    assert runner.stats().compiles_after_warmup == 0 and runner.stats().captures_after_warmup == 0
    print(f"  auto: kept the {st.forward} forward ({st.choice}); {st.compiles} compilations, "
          f"warm-up {st.warmup_s:.1f} s")


def check_bf16_padding_stays_finite(ctx: Ctx) -> None:
    """In bf16, where the GPU's own attention kernel serves: 3 rows in a 4-row bucket (a padding row that
    has no slot of its own to see but its own), twice on one pair so the second batch reuses the arena's
    rows. No NaN may reach the arena or the logits."""
    from specviz.engine.request import Knobs
    from specviz.pairs.models import load_model
    from specviz.pairs.pipeline import load_pair

    half = load_model(ctx.paths["target"], DEVICE)
    half = replace(half, model=half.model.to(torch.bfloat16), dtype=torch.bfloat16)
    os.environ["SPECVIZ_GRAPH_BUCKETS"] = SMALL
    pair = load_pair(ctx.paths["target"], "ngram", DEVICE, target=half, compile="on")
    runner = pair.fast.runners[0]
    for batch in (3, 2):
        eng = pair.engine()
        list(eng.generate(ctx.prompts, Knobs(depth=4, batch_size=batch), MAX_NEW))
        assert all(len(out) == MAX_NEW for out in eng.outputs().values())
        assert all(torch.isfinite(t).all() for t in runner.keys + runner.values), "NaN in the arena"
    assert runner.stats().replays > 0
    print(f"  bf16 padding: arena finite after batches of 3 and 2; attention: {_attention_kernels()}")


def check_a_step_waits_once(ctx: Ctx) -> None:
    """A greedy decode step with a free draft waits for the device once (the argmax read back; the cache
    keeps its rows' counts on the host) besides its timing syncs: torch's sync debug mode warns at every operation that
    waits (reads back, plain copies onto the device). Steps that admit or retire rows are left out. The
    CPU rehearsal has no device to wait for (tests/test_graph_path.py counts the reads there)."""
    import warnings

    from specviz.engine.request import Knobs

    if not CUDA:
        print("  (sync debug mode needs CUDA)")
        return
    eng = ctx.pair("ngram").engine()
    per_step, seen, changed = [], [], True
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for ev in eng.generate(ctx.prompts[:3], Knobs(depth=3, batch_size=3), MAX_NEW):
                if not changed:
                    per_step.append(len(caught) - len(seen))
                seen, changed = list(caught), any(r.done for r in ev.rows)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    kinds = sorted({str(w.message).split("\n")[0][:60] for w in caught})
    print(f"  waits a decode step: {per_step} ({'; '.join(kinds[:4])})")
    assert per_step and max(per_step) <= 6, per_step        # 7715d99 waited ~15 times a step


def check_kernels_a_layer(ctx: Ctx) -> None:
    """Counts (prints) the kernels one decoder layer of the eager forward launches for a one-token bf16
    block (memsets included): inside a CUDA graph each still costs a few µs, against about 35 µs for a 1.7B
    layer's weights; auto's choice, in the counters, says whether compiling them away paid. On the CPU
    rehearsal it counts the aten calls the layer makes, less views, instead."""
    from torch.profiler import ProfilerActivity, profile

    from specviz.engine.kvcache import attention_bias
    from specviz.fastpath.llama import CompactLlama, decoder_layer
    from specviz.pairs.models import load_model

    half = load_model(ctx.paths["target"], DEVICE).model.to(torch.bfloat16)
    m, S, dev = CompactLlama(half), 64, DEVICE
    d, width = m.dims, m.embed.shape[1]
    slots, kv = torch.tensor([10], device=dev), (1, d.n_kv, S, d.head_dim)
    cos, sin = m.rope(slots[None])
    bias = m.grouped_bias(attention_bias(torch.ones(1, S, dtype=torch.bool, device=dev), slots, torch.bfloat16))
    args = (torch.randn(1, 1, width, device=dev, dtype=torch.bfloat16), cos, sin, bias, slots,
            torch.zeros(kv, device=dev, dtype=torch.bfloat16), torch.zeros(kv, device=dev, dtype=torch.bfloat16),
            m._tuples[0], d)
    with torch.inference_mode():
        decoder_layer(*args)                                           # first-call setup out of the count
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])) as prof:
            decoder_layer(*args)
    if CUDA:
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    else:                       # the calls the layer makes itself, less those that only make a view
        names = [e.name for e in prof.events() if e.name.startswith("aten::") and e.name[6:] not in _VIEWS
                 and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    assert names, "the profiler saw no kernel"
    kinds = sorted({n.split("(")[0][:40] for n in names})
    print(f"  one decoder layer, one bf16 token: {len(names)} {'kernels' if CUDA else 'aten calls'} "
          f"({len(kinds)} kinds: {', '.join(kinds[:8])}{' …' if len(kinds) > 8 else ''})")


_VIEWS = {"slice", "transpose", "view", "expand", "select", "unsqueeze", "t", "as_strided", "alias", "detach"}


def _attention_kernels() -> str:
    """Which kernels SDPA runs here for a bf16 block with an additive mask (names from the profiler)."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    q = torch.randn(4, 8, 5, 64, device=DEVICE, dtype=torch.bfloat16)
    kv = torch.randn(4, 8, 256, 64, device=DEVICE, dtype=torch.bfloat16)
    mask = torch.zeros(4, 1, 5, 256, device=DEVICE, dtype=torch.bfloat16)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    with profile(activities=acts) as prof:
        F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)
    names = {e.name for e in prof.events() if any(w in e.name.lower() for w in ("attention", "fmha", "cudnn", "flash"))}
    return ", ".join(sorted(names)[:4]) or "?"


def report_timing() -> None:
    """Printed, not asserted: a one-token pass (context 256) replayed vs the stock modules, 1.7B shape."""
    from specviz.fastpath import FastPath, cache_factory, one_token_ms
    from specviz.fastpath.buckets import Buckets
    from specviz.hardware.roofline import pass_cost, spec_from_config
    from specviz.pairs.models import load_model

    os.environ.pop("SPECVIZ_GRAPH_BUCKETS", None)
    os.environ.pop("SPECVIZ_GRAPH_FORWARD", None)          # auto: it prints both forwards' one-token replays
    big = load_model("shape:SmolLM2-1.7B", "cuda")
    small = Buckets(rows=(1, 4, 16, 64), tokens=(1, 5, 9, 16), slots=(512,), wide=(64, 256))
    factory, fast = cache_factory(big.model, FastPath("graphs"), small)
    assert factory is not None, fast.note
    graph_ms, eager_ms = one_token_ms(big.model, factory, context=256)
    spec = spec_from_config(big.config_dict, "shape:SmolLM2-1.7B", 2.0)
    nbytes = pass_cost(spec, 1, 1, 256).bytes
    print(f"  1.7B shape, one token at context 256: graph {graph_ms:.2f} ms, eager {eager_ms:.2f} ms; "
          f"{nbytes / 1e9:.2f} GB a pass = {nbytes / graph_ms / 1e6:.0f} GB/s on the graph path")
    print(f"  {fast.graph_stats().line()}")


CHECKS = (check_captures_and_exactness, check_threads_and_scheduler, check_bf16_padding_stays_finite,
          check_a_step_waits_once, check_kernels_a_layer, check_compiled_forward, check_auto_times_both_forwards)


# --- pytest ------------------------------------------------------------------------------------------------
try:
    import pytest
except ImportError:            # the bare GPU box: run as a script
    pytest = None

if pytest is not None:
    pytestmark = pytest.mark.skipif(not (CUDA and torch.cuda.is_available()), reason="no CUDA device here")

    @pytest.fixture(scope="module")
    def ctx():
        return Ctx()

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
    def test_on_cuda(ctx, check):
        check(ctx)


if __name__ == "__main__":
    if CUDA and not torch.cuda.is_available():
        sys.exit("no CUDA device here (GRAPH_CHECK_DEVICE=cpu runs the checks on the CPU rehearsal)")
    start, failed = time.perf_counter(), 0
    context = Ctx()
    for check in CHECKS + ((lambda _: report_timing(),) if CUDA else ()):
        name = getattr(check, "__name__", "report_timing")
        t0 = time.perf_counter()
        try:
            check(context)
            print(f"ok   {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
        except Exception as exc:                      # report and go on to the next check
            failed += 1
            import traceback

            traceback.print_exc()
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
    print(f"{failed} failed, {time.perf_counter() - start:.0f} s")
    sys.exit(1 if failed else 0)
