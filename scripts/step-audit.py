#!/usr/bin/env python3
"""What a decode step does besides its forward, on the graph path: the device ops it launches, the reads
back to the host and the plain copies onto the device (on a GPU each of both waits for the device), the
copies from pinned memory (`kvcache.to_device`, which wait for nothing), and its host time. The forward
itself (a CUDA graph on a GPU, its CPU rehearsal here) is marked and left out.

    python scripts/gpu_check_steps.py build --out /tmp/m --shape SmolLM2-1.7B --dry   # a tiny model
    python scripts/step-audit.py --target /tmp/m/big --draft synthetic:0.7 --batch 1 --depth 0

On a CPU it runs the graph path's rehearsal (SPECVIZ_BUCKETS_ON_CPU=1) and its ops stand in for a GPU's
launches; use a tiny model there, or the LM head and argmax over a real vocabulary dominate the host time.
A copy onto the device is seen where the code asks for one (`torch.tensor(…, device=…)`, `to_device`); a
`.to(device)` is counted as a launch only where it copies, which on a CPU a move to the CPU does not.
On CUDA (--device cuda) the launches are the step's own. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# views and no-op conversions launch nothing; what is left would be a kernel or a copy on a GPU
NO_LAUNCH = {"view", "slice", "unsqueeze", "alias", "reshape", "resolve_conj", "resolve_neg", "detach_", "detach",
             "lift_fresh", "squeeze", "select", "expand", "transpose", "as_strided", "empty", "_reshape_alias", "t",
             "split", "narrow", "unbind", "permute"}
READS = ("tolist", "item", "__int__", "__bool__", "__float__", "__index__")
BODY = "specviz.graph_body"


def parse(argv):
    p = argparse.ArgumentParser(prog="scripts/step-audit.py", description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="a model folder or reference (a tiny one on a CPU)")
    p.add_argument("--draft", default="synthetic:0.7", help="a draft reference (default synthetic:0.7)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--depth", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=7, help="timed runs; the host time is their median")
    a = p.parse_args(argv)
    if not (1 <= a.batch <= 64 and 0 <= a.depth <= 16 and a.max_new_tokens >= 2 and a.runs >= 1):
        p.error("--batch takes 1-64, --depth 0-16, --max-new-tokens at least 2 and --runs at least 1")
    return a


class Audit:
    """Marks the graph body and the admissions' prefills in the profiler, times the body, and counts host
    reads of tensors and copies onto the device."""

    def __init__(self, torch, graphs, loop):
        self.torch, self.body_s, self.reads, self.inside = torch, 0.0, collections.Counter(), False
        self.copies = collections.Counter()      # "pinned" (to_device) and "blocking" (torch.tensor(device=…))
        real_replay = graphs.GraphRunner.replay
        audit = self

        def replay(runner, sh, *a, **k):
            inner = runner._replays[sh]

            def marked():
                t0, audit.inside = time.perf_counter(), True
                try:
                    with torch.profiler.record_function(BODY):
                        inner()
                        if runner.device.type == "cuda":
                            torch.cuda.synchronize(runner.device)    # the graph's own time, not the host's
                finally:
                    audit.inside = False
                audit.body_s += time.perf_counter() - t0
            runner._replays[sh] = marked
            try:
                return real_replay(runner, sh, *a, **k)
            finally:
                runner._replays[sh] = inner
        graphs.GraphRunner.replay = replay
        real_prefill = loop.prefill

        def prefill(*a, **k):               # a new row's prompt: the admission's, not a step's (timed apart)
            audit.inside = True
            try:
                with torch.profiler.record_function(BODY):
                    return real_prefill(*a, **k)
            finally:
                audit.inside = False
        loop.prefill = prefill
        for name in READS:
            real = getattr(torch.Tensor, name)

            def counted(t, *a, _real=real, _name=name, **k):
                if not audit.inside:           # the forward's own (a CPU's C layers) are not the step's
                    audit.reads[_name] += 1
                return _real(t, *a, **k)
            setattr(torch.Tensor, name, counted)
        real_tensor = torch.tensor

        def tensor(*a, **k):
            if not audit.inside:
                caller = sys._getframe(1).f_code.co_name
                if caller == "to_device":
                    audit.copies["pinned"] += 1
                elif k.get("device") is not None:
                    audit.copies["blocking"] += 1
            return real_tensor(*a, **k)
        torch.tensor = tensor


def launches(events) -> collections.Counter:
    """Top-level aten ops outside the marked body that launch work, by name."""
    body = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == BODY)
    starts = [b[0] for b in body]

    def inside(e) -> bool:
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        return i >= 0 and e.time_range.end <= body[i][1]
    out = collections.Counter()
    for e in events:
        top = e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")
        if not (e.name.startswith("aten::") and top) or e.name[6:] in NO_LAUNCH or inside(e):
            continue
        if e.name == "aten::to" and not any(c.name == "aten::_to_copy" for c in e.cpu_children):
            continue                            # already where and what it was asked to be: no copy
        out[e.name[6:]] += 1
    return out


def main(argv) -> int:
    a = parse(argv)
    os.environ.setdefault("SPECVIZ_BUCKETS_ON_CPU", "1")
    import torch
    from torch.profiler import ProfilerActivity, profile

    from specviz.cli.hardware_cmds import Dial
    from specviz.engine import loop
    from specviz.engine.request import Knobs
    from specviz.fastpath import graphs
    from specviz.pairs.pipeline import encode_prompt, load_pair

    pair = load_pair(a.target, a.draft, a.device, compile="on")
    if not pair.fast.runners:
        print(f"step-audit: {a.target} did not load on the graph path ({pair.fast.shown}); nothing to audit",
              file=sys.stderr)
        return 2
    prompt = encode_prompt(pair.tokenizer, "write the numbers from 1 to 20")
    dial = Dial.of(pair)
    refs = dial.reference(pair.engine(), [prompt], a.batch, a.max_new_tokens) if dial.on else None
    audit = Audit(torch, graphs, loop)

    def run():
        eng = pair.engine()
        return list(eng.generate([prompt] * a.batch, Knobs(depth=a.depth, batch_size=a.batch), a.max_new_tokens,
                                 references=refs))
    run()                                                            # warm-up
    host_us = []           # the whole run, less the forwards and the prompt's prefill, a step
    for _ in range(a.runs):
        audit.body_s = 0.0
        t0 = time.perf_counter()
        evs = run()
        spent = time.perf_counter() - t0 - audit.body_s - sum(e.prefill_s for e in evs)
        host_us.append(1e6 * spent / len(evs))
    audit.reads.clear()
    audit.copies.clear()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        evs = run()
    steps, ops = len(evs), launches(prof.events())
    print(json.dumps({
        "target": a.target, "draft": a.draft, "device": a.device, "batch": a.batch, "depth": a.depth, "steps": steps,
        "tokens_a_step": sum(e.emitted for e in evs) / steps,
        "launches_a_step": sum(ops.values()) / steps,
        "reads_a_step": sum(audit.reads.values()) / steps,
        "waits_a_step": (sum(audit.reads.values()) + audit.copies["blocking"]) / steps,
        "copies_a_step": {k: round(v / steps, 2) for k, v in audit.copies.items()},
        "host_us_a_step": statistics.median(host_us), "host_us_runs": [round(x, 1) for x in host_us],
        "launches": {k: round(v / steps, 2) for k, v in ops.most_common()},
        "reads": {k: round(v / steps, 2) for k, v in audit.reads.most_common()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
