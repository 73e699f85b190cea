#!/usr/bin/env python3
"""Where a verify pass's time goes on the graph path: the kernels one pass runs (its input copies, the
captured forward, the LM head over its tokens and the argmax), their device time by kind (matrix
multiplies, attention, inductor's fused kernels, copies, the rest), the gaps between them, and the
bandwidth the matrix multiplies and the whole pass reach. What `roofline` says in one figure (its MBU),
this says kernel by kernel: whether a slow pass is slow matrix multiplies, many small kernels, or a
device waiting for the host.

    python scripts/pass-kernels.py --target shape:SmolLM2-1.7B --device cuda     # random weights, a shape
    python scripts/pass-kernels.py --target DIR --tokens 1,16 --context 256 --passes 20

Each width is one pass of one row over a `--context`-token cache, run `--passes` times on the same
cache (its length put back after each, so every pass replays the same graph). `wall_us` is a pass's
time back to back (the device's pace: the host launches ahead), `synced_us` a pass waited for alone (as
`roofline` times it); `gaps_us` is `wall_us` less the kernels' busy time, which the profiler measures
on passes of its own (it slows the host, not the device). `matmul_GBps`: the weights' bytes over the
matrix multiplies' device time. On a CPU the graph path's rehearsal runs (no CUDA graphs, stock weight layout) and
its "kernels" are the top-level torch ops: the figures check the script, they say nothing of a GPU.
Prints one JSON line; a bad option gets one sentence and exit 2.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# a kernel's kind, by the first of these its lower-cased name contains (cuBLAS, CUTLASS and inductor's names;
# the CPU rehearsal's torch ops)
KINDS = (("attention", ("flash", "fmha", "attention", "sdpa", "softmax")),
         ("matmul", ("gemm", "gemv", "nvjet", "wgmma", "cutlass", "xmma", "cublas", "splitk", "matmul", "aten::linear",
                     "aten::mm",
                     "aten::addmm", "aten::bmm", "specviz")),
         ("fused", ("triton",)),
         ("copy", ("memcpy", "memset", "copy", "fill", "zero")))
NO_LAUNCH = {"view", "slice", "unsqueeze", "alias", "reshape", "squeeze", "select", "expand", "transpose",
             "as_strided", "empty", "t", "split", "narrow", "unbind", "permute", "detach", "lift_fresh"}
TOP = 8


def parse(argv):
    p = argparse.ArgumentParser(prog="scripts/pass-kernels.py", description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="a model folder or reference (shape:NAME: random weights)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    p.add_argument("--tokens", default="1,16", help="tokens a pass, comma-separated (1-1024)")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--passes", type=int, default=20)
    a = p.parse_args(argv)
    try:
        a.widths = sorted({int(x) for x in a.tokens.split(",") if x.strip()})
    except ValueError:
        a.widths = []
    if not a.widths or not all(1 <= n <= 1024 for n in a.widths) or not 1 <= a.context <= 8192 \
            or not 1 <= a.passes <= 1000:
        p.error("--tokens takes whole numbers 1-1024, --context 1-8192 and --passes 1-1000")
    return a


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, words in KINDS if any(w in low for w in words)), "other")


def busy_us(spans: list[tuple[float, float]]) -> float:
    """µs covered by at least one span (kernels on several streams may overlap)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def device_events(events, cuda: bool) -> list:
    """What ran on the device: kernels, copies and memsets on a GPU; on a CPU the top-level torch ops
    that would launch one."""
    from torch.autograd import DeviceType

    if cuda:
        # a record_function range is mirrored onto the GPU's timeline as an annotation: not a kernel
        return [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
                and "annotation" not in str(getattr(e, "activity_type", "") or "")]
    return [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")
            and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")) and e.name[6:] not in NO_LAUNCH]


def summarise(evs: list, passes: int) -> dict:
    """Per pass: kernels, device µs by kind, busy µs, and the kernels that took longest."""
    by_kind, by_name = collections.defaultdict(lambda: [0, 0.0]), collections.defaultdict(lambda: [0, 0.0])
    for e in evs:
        us = e.time_range.end - e.time_range.start
        for table, key in ((by_kind, kind_of(e.name)), (by_name, e.name)):
            table[key][0] += 1
            table[key][1] += us
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP]
    return {"kernels": len(evs) / passes,
            "busy_us": busy_us([(e.time_range.start, e.time_range.end) for e in evs]) / passes,
            "by_kind": {k: {"n": n / passes, "us": us / passes} for k, (n, us) in sorted(by_kind.items())},
            "top": [{"name": name[:120], "n": n / passes, "us": us / passes} for name, (n, us) in top]}


def timed_us(torch, fn, device, passes: int, synced: bool) -> float:
    """µs a pass: the median of passes each waited for (`synced`), else the mean of back-to-back passes."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    if synced:
        out = []
        for _ in range(passes):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            out.append(1e6 * (time.perf_counter() - t0))
        return statistics.median(out)
    sync()
    t0 = time.perf_counter()
    for _ in range(passes):
        fn()
    sync()
    return 1e6 * (time.perf_counter() - t0) / passes


def one_width(torch, model, new_cache, n: int, a, device, nbytes: float, weight_bytes: float,
              bandwidth: float) -> dict:
    from torch.profiler import ProfilerActivity, profile

    vocab = model.get_input_embeddings().weight.shape[0]
    cache = new_cache(1)
    ctx = torch.randint(0, vocab, (1, a.context), device=device)
    ids = torch.randint(0, vocab, (1, n), device=device)
    ones = torch.ones_like(ids, dtype=torch.bool)
    cache.forward(model, ctx, torch.ones_like(ctx, dtype=torch.bool), 1)        # the context (a prefill)
    valid, counts, host = cache.valid, list(cache.n_valid_list()), [[True] * n]

    def one():
        # a verify pass as a greedy step runs it (the block's validity known on the host, so its positions
        # are built there); the cache's length put back on the host, so the next pass is the same
        cache.forward(model, ids, ones, host_valid=host).argmax(dim=-1)
        cache.valid = valid
        cache._count_on_host(list(counts))
    for _ in range(3):
        one()                                              # warm-up: the shape's first passes
    synced, wall = timed_us(torch, one, device, a.passes, True), timed_us(torch, one, device, a.passes, False)
    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(a.passes):
            one()
        if cuda:
            torch.cuda.synchronize(device)
    evs = device_events(prof.events(), cuda)
    got = summarise(evs, a.passes)
    note = trace_note(got, model.config.num_hidden_layers)
    if note:
        got["note"] = note
    matmul_us = got["by_kind"].get("matmul", {}).get("us", 0.0)
    graphed = getattr(cache, "runner", None) is not None and cache.runner.pick(1, n, a.context) is not None
    return {"tokens": n, "graphed": graphed, "wall_us": wall, "synced_us": synced,
            "gaps_us": max(0.0, wall - got["busy_us"]), **got, "bytes": nbytes,
            "pass_GBps": nbytes / wall / 1e3, "mbu": nbytes / (wall / 1e6) / bandwidth if bandwidth else None,
            "matmul_GBps": weight_bytes / matmul_us / 1e3 if matmul_us and not got.get("note") else None}


def trace_note(got: dict, n_layers: int) -> str | None:
    """Why the kernel figures cannot be read as a pass's: the profiler saw nothing run on the device (no
    CUPTI), or fewer matrix multiplies a pass than the model runs (four a layer at the least: q/k/v, o,
    gate/up, down), so part of a replayed graph went untraced. The times stand either way."""
    if not got["kernels"]:
        return "the profiler saw nothing run on the device: the kernel figures are missing, the times stand"
    seen = got["by_kind"].get("matmul", {}).get("n", 0.0)
    if seen < 4 * n_layers:
        return (f"the profiler saw {seen:.0f} matrix multiplies a pass where the model runs at least {4 * n_layers}: "
                "part of the pass went untraced, so the kernel figures are partial; the times stand")
    return None


def line(r: dict, what: str) -> str:
    if r.get("note"):
        return (f"{r['tokens']} tokens: {r['wall_us'] / 1e3:.3f} ms a pass ({r['synced_us'] / 1e3:.3f} synced); "
                f"{r['note']}")
    kinds = ", ".join(f"{k} {v['us']:.0f}" for k, v in r["by_kind"].items())
    mbu = f", MBU {r['mbu']:.2f}" if r.get("mbu") else ""
    return (f"{r['tokens']} token{'s' if r['tokens'] > 1 else ''}: {r['wall_us'] / 1e3:.3f} ms a pass "
            f"({r['synced_us'] / 1e3:.3f} synced){mbu}, {r['kernels']:.0f} {what}, busy {r['busy_us']:.0f} µs "
            f"({kinds}), gaps {r['gaps_us']:.0f} µs")


def main(argv) -> int:
    a = parse(argv)
    if (a.device or "").startswith("cpu") or a.device is None and not _has_cuda():
        os.environ.setdefault("SPECVIZ_BUCKETS_ON_CPU", "1")     # the rehearsal: buckets, arena, no CUDA graphs
        os.environ.setdefault("SPECVIZ_LAYOUT", "stock")          # a CPU's C layers run where the profiler sees nothing
    import torch

    from specviz.fastpath import cache_factory, resolve
    from specviz.fastpath.buckets import for_roofline
    from specviz.hardware.device import cached_peaks
    from specviz.hardware.roofline import pass_cost, spec_from_config
    from specviz.pairs.models import load_model
    from specviz.serve.heap import freeze_long_lived

    loaded = load_model(a.target, a.device)
    new_cache, fast = cache_factory(loaded.model, resolve("on", loaded.device), for_roofline(a.widths, a.context, 1024))
    if not fast.runners:
        print(f"pass-kernels: {a.target} did not load on the graph path ({fast.shown}); nothing to profile",
              file=sys.stderr)
        return 2
    spec = spec_from_config(loaded.config_dict, a.target, torch.finfo(loaded.dtype).bits / 8)
    peaks = cached_peaks(loaded.device, loaded.dtype)
    freeze_long_lived()     # loaded and captured: a full collection walking the model would land in a timed pass
    stats, what = fast.graph_stats(), "kernels" if loaded.device.type == "cuda" else "torch ops"
    rows = []
    with torch.inference_mode():
        for n in a.widths:
            rows.append(one_width(torch, loaded.model, new_cache, n, a, loaded.device,
                                  pass_cost(spec, 1, n, a.context).bytes, spec.streamed_params * spec.bytes_per_param,
                                  peaks.bandwidth))
            print(line(rows[-1], what), file=sys.stderr, flush=True)
    print(json.dumps({"target": a.target, "device": str(loaded.device), "path": fast.label,
                      "forward": stats.forward if stats else None, "context": a.context, "passes": a.passes,
                      "bandwidth_GBps": peaks.bandwidth / 1e9, "counted": what, "rows": rows,
                      "summary": "; ".join(line(r, what) for r in rows)}))
    return 0


def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
