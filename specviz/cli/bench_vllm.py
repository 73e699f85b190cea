"""`python -m specviz bench-vllm`: our shared engine and a vLLM server, side by side, same work.

Same prompts (the classroom pool, one per user, through our tokenizer and chat template), the same
number of new tokens per row (EOS ignored on both sides: our engine gets no EOS ids, vLLM `ignore_eos`),
the same k and the same n-gram settings (last 3, 2, then 1 tokens looked up). Ours runs first through
one `Scheduler` as the classroom uses it (N requests of one row each, all submitted at once); then vLLM
gets the same N prompts as N concurrent streamed requests — one after the other on this machine, each
after a short warm-up of every user (8 tokens), `--repeats` times each (the median run is reported).
Without --vllm-url a local server is launched from `.venv-vllm` after our run (so it does not share the
CPU with ours) and stopped at the end.

Compared: greedy token ids row by row (`identical_rows`); for a row that differs, the first differing
position and our target's logit margin there (top-1 minus top-2, and ours minus vLLM's token), judged by
SpecViz's one near-tie rule (specviz.engine.divergence): a near-tie (float noise between two engines'
kernels) or a real disagreement, which ends the command with exit status 1 after its JSON.
Last line: {"specviz": {...}, "vllm": {...}, "ratio", "rows", "identical_rows", ...}.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from specviz.cli.args import int_in, model_ref
from specviz.cli.classroom import POOL, _pct
from specviz.cli.common import add_compile_arg, n_users
from specviz.engine.divergence import first_difference, is_near_tie, target_margins
from specviz.engine.request import Knobs, Request
from specviz.hardware.device import cpu_name
from specviz.limits import Limits
from specviz.serve.door import check_count, check_run
from specviz.vllm import launcher
from specviz.vllm.client import VllmClient, VllmError
from specviz.vllm.launcher import LaunchSpec, VllmServer, free_port
from specviz.vllm.metrics import engine_time
from specviz.vllm.run import run_all

WARMUP_TOKENS = 8
MAX_REPEATS = 9          # each round is a timed run on both engines


@dataclass(frozen=True)
class Sizes:
    """The run's sizes, as the door returned them."""

    users: int
    depth: int
    max_new: int
    repeats: int


def check_sizes(args) -> Sizes:
    """At the door, before any model loads: every user is one row of our shared batch."""
    one = check_run(1, args.depth, 0.0, args.max_new_tokens)
    return Sizes(check_count(args.users, "errors.what_users", Limits().max_shared_rows), one.depth, one.max_new,
                 check_count(args.repeats, "errors.what_repeats", MAX_REPEATS))


def add_parser(sub) -> None:
    p = sub.add_parser("bench-vllm", help="our engine vs a vLLM server: same prompts, tokens and k")
    p.add_argument("--target", default="smollm2-135m-offline", type=model_ref(), help="the model both engines serve")
    p.add_argument("--users", type=int, default=16, help="concurrent users, one row each (1-64)")
    p.add_argument("--depth", type=int, default=4, help="draft tokens per step (n-gram draft; 0 = plain)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--vllm-url", default=None, help="an already running vLLM server (default: launch one)")
    p.add_argument("--vllm-model", default=None, help="its served model name (default: the only one)")
    p.add_argument("--port", type=int_in(0, 65535), default=0,
                   help="port for a launched server (0, the default: a free one)")
    p.add_argument("--vllm-eager", action="store_true",
                   help="launch the server with --enforce-eager (starts in minutes less on a busy CPU; slower)")
    p.add_argument("--threads", type=int_in(0, os.cpu_count() or 1), default=0,
                   help="our engine's CPU threads, at most this machine's CPUs (0, the default: all cores but "
                        "one, as vLLM's CPU build uses)")
    add_compile_arg(p)
    p.add_argument("--repeats", type=int, default=5,
                   help="timed runs per engine, the two engines in turns, the median run reported (1-9; a "
                        "1-user run lasts seconds)")
    p.add_argument("--json", action="store_true", help="only the JSON lines")
    p.set_defaults(func=run)


def _note(args, text: str) -> None:
    print(("" if args.json else "") + f"bench-vllm: {text}", file=sys.stderr, flush=True)


def _ours(sched, engines: list, prompts: list[list[int]], depth: int, max_new: int) -> dict:
    """N one-row requests into the shared Scheduler at once (as the classroom does), EOS ignored. One
    scheduler serves every run, as the class's does (and vLLM's one server): its caches stay between runs."""
    # on first use: transformers is slow to import
    from specviz.serve.workload import users_at_once

    before = _counters(engines[-1]) if engines else None
    wall, runs = users_at_once(sched, [Request([p], Knobs(depth, 1), max_new) for p in prompts])
    errors = [r.error for r in runs if r.error]
    if errors:
        raise RuntimeError(f"our engine failed: {errors[0]}")
    drafted = sum(r.totals.drafted for r in runs)
    after = _counters(engines[-1])
    if before is None or after["steps"] < before["steps"]:     # a new engine (the first run, or a fault)
        before = dict.fromkeys(after, 0) | {"spent": dict.fromkeys(after["spent"], 0.0)}
    return {"outputs": [r.outputs for r in runs], "wall_s": wall, "latencies": [r.done_s for r in runs],
            "acceptance_rate": sum(r.totals.accepted for r in runs) / drafted if drafted else None,
            "time": _our_time(before, after, wall, sum(len(r.outputs) for r in runs))}


def _counters(eng) -> dict:
    return {"steps": eng.steps_run, "pass_tokens": eng.pass_tokens, "verified": eng.slots_verified,
            "spent": dict(eng.spent)}


def _our_time(before: dict, after: dict, wall: float, tokens: int) -> dict:
    """Where our engine's time went in one run (the engine's counters after it, less before): steps,
    tokens per verify pass and emitted per step, the mean step, and seconds in prefill, draft passes,
    verify passes, the rest of the steps, and outside any step (the scheduler, the streams). Prompts are
    prefilled in passes of their own (vLLM's steps mix them in)."""
    spent = {k: round(v - before["spent"][k], 4) for k, v in after["spent"].items()}
    steps = after["steps"] - before["steps"]
    per_step = (lambda x: x / steps) if steps else (lambda x: None)
    return {"steps": steps, "tokens_per_step": per_step(after["pass_tokens"] - before["pass_tokens"]),
            "emitted_per_step": per_step(tokens), "drafts_per_step": per_step(after["verified"] - before["verified"]),
            "step_ms": per_step(1e3 * (sum(spent.values()) - spent["prefill"])),
            **{f"{k}_s": v for k, v in spent.items()}, "outside_steps_s": round(wall - sum(spent.values()), 4)}


@contextmanager
def _our_side(pair, prompts: list[list[int]], depth: int):
    """Our engine ready to serve: one shared scheduler (one engine) for the warm-up and every run, as the
    class's does (and vLLM's one server), after a short warm-up of every user (the batch's memory is
    faulted in then, as vLLM's KV cache is at its start). Yields run(max_new) → one run's record."""
    # on first use: transformers is slow to import
    from specviz.serve.workload import shared_scheduler

    engines: list = []
    # every row decodes exactly max_new tokens, as vLLM's; the engine is built in the scheduler's thread
    sched = shared_scheduler(pair, ignore_eos=True, built=engines.append)
    try:
        _ours(sched, engines, prompts, depth, WARMUP_TOKENS)
        yield lambda max_new: _ours(sched, engines, prompts, depth, max_new)
    finally:
        sched.close()


def _alternate(ours, theirs, repeats: int) -> tuple[list[dict], list[dict]]:
    """The two engines' timed runs in turns, ours first in even rounds and theirs first in odd ones.
    Why: a 2-core machine's speed drifts by ±10-20 % over seconds, so with all of one side's runs first
    the ratio measures the drift; in turns, the drift falls on both sides."""
    mine: list[dict] = []
    other: list[dict] = []
    for r in range(repeats):
        for side in ((ours, theirs) if r % 2 == 0 else (theirs, ours)):
            (mine if side is ours else other).append(side())
    return mine, other


def paired_ratio(mine: list[dict], other: list[dict]) -> float | None:
    """The median over rounds of vLLM's wall ÷ ours (both decode the same tokens in a round)."""
    ratios = sorted(b["wall_s"] / a["wall_s"] for a, b in zip(mine, other) if a["wall_s"] > 0)
    return statistics.median(ratios) if ratios else None


def _vllm(client, model: str, prompts: list[list[int]], max_new: int) -> dict:
    before = _metrics(client)
    r = run_all(client, model, prompts, max_new, ignore_eos=True)
    if r.error:
        raise VllmError(r.error)
    after = _metrics(client)
    drafted = r.totals.drafted
    time_ = engine_time(before, after, model) if before is not None and after is not None else {}
    if time_.get("steps"):
        time_["step_ms"] = 1e3 * r.wall_s / time_["steps"]      # its engine core steps back to back
    return {"outputs": [r.outputs[i] for i in sorted(r.outputs)], "wall_s": r.wall_s,
            "latencies": [r.latencies[i] for i in sorted(r.latencies)],
            "acceptance_rate": r.totals.accepted / drafted if drafted else None, "time": time_}


def _metrics(client) -> str | None:
    try:
        return client.metrics_text()
    except VllmError:
        return None


def _median_run(runs: list[dict]) -> dict:
    """The run with the median wall time (greedy: every run's tokens are the same), with every run's wall."""
    ranked = sorted(runs, key=lambda r: r["wall_s"])
    return {**ranked[len(ranked) // 2], "walls": [r["wall_s"] for r in runs]}


def _summary(side: dict) -> dict:
    tokens = sum(map(len, side["outputs"]))
    lat = side["latencies"]
    return {"tokens_per_s": tokens / side["wall_s"] if side["wall_s"] else None, "tokens": tokens,
            "p50_s": _pct(lat, 0.5), "p95_s": _pct(lat, 0.95), "acceptance_rate": side["acceptance_rate"],
            "wall_s": side["wall_s"], "runs_tokens_per_s": [round(tokens / w, 2) for w in side.get("walls", [])],
            "time": side.get("time", {})}


def _time_line(t: dict) -> str:
    def f(x, unit="", fmt=".1f"):
        return "n/a" if x is None else f"{x:{fmt}}{unit}"
    line = (f"{f(t.get('steps'), fmt='.0f')} steps, {f(t.get('step_ms'), ' ms')} each, verifying "
            f"{f(t.get('drafts_per_step'))} drafts a step")
    if "verify_s" in t:           # ours: the engine's own clock
        return line + (f" (passes of {f(t.get('tokens_per_step'))} tokens) and emitting {f(t.get('emitted_per_step'))}"
                       f"; prefill {t['prefill_s']:.2f} s, draft {t['draft_s']:.2f} s, verify {t['verify_s']:.2f} s, "
                       f"rest of the steps {t['other_s']:.2f} s, outside steps {t['outside_steps_s']:.2f} s")
    if t:                         # vLLM's /metrics
        line += (f", {f(t.get('prompt_and_generated_per_step'))} prompt and generated tokens a step"
                 f"; per request: queued {f(t.get('queue_s_per_request'), ' s', '.2f')}, prefill "
                 f"{f(t.get('prefill_s_per_request'), ' s', '.2f')}, decode {f(t.get('decode_s_per_request'), ' s', '.2f')}"
                 f"; prompt tokens from its prefix cache {f(t.get('prefix_cache_hit_rate'), '', '.0%')}")
    return line


def _margin(pair, prompt: list[int], ours: list[int], pos: int, theirs: int | None) -> dict:
    """Our target's own pass at the first differing position (engine.divergence): top-1 − top-2, ours −
    vLLM's token, and whether the difference is a near-tie under SpecViz's one rule."""
    mine = ours[pos] if pos < len(ours) else None
    m = target_margins(pair.target.model, pair.target.device, prompt + ours[:pos], mine, theirs)
    out = {"position": pos, "ours": mine, "vllm": theirs, "top1_minus_top2": m.top1_minus_top2,
           "near_tie": is_near_tie(m.top1_minus_top2, m.ours_gap, m.reference_gap)}
    if m.ours_minus_reference is not None:
        out["ours_minus_vllm"] = m.ours_minus_reference
    return out


def torch_threads() -> int:
    return torch.get_num_threads()


def _threads(n: int) -> int:
    """Like for like on a CPU: vLLM's CPU build serves on all cores but one (it logs "Reducing Torch
    threads from 2 to 1" on 2 cores, keeping one for its API server); ours gets the same by default."""


    n = n if n > 0 else max(1, (os.cpu_count() or 2) - 1)
    torch.set_num_threads(n)
    return n


def _both(args, sizes: Sizes, client, served, prompts: list[list[int]], once):
    """vLLM launched (or the given server), warmed up, then both engines' timed runs in turns."""
    N, k = sizes.max_new, sizes.depth
    server = None
    try:
        if client is None:
            port = args.port or free_port()
            server = VllmServer(LaunchSpec(args.target, "ngram", k, port, eager=args.vllm_eager))
            server.start(progress=lambda line: _note(args, line))
            client = VllmClient(server.url, timeout_s=600)
            served = client.model()
        if served.max_len and max(map(len, prompts)) + N > served.max_len:
            raise VllmError(f"prompt + {N} tokens exceed the server's max-model-len {served.max_len}")
        _note(args, f"vLLM ({served.name}): {n_users(sizes.users)} × {N} tokens")
        _vllm(client, served.name, prompts, WARMUP_TOKENS)
        mine, other = _alternate(lambda: once(N), lambda: _vllm(client, served.name, prompts, N), sizes.repeats)
    finally:
        if server is not None:
            server.stop()
    return mine, other, served, client


def run(args) -> int:
    # on first use: transformers is slow to import
    from specviz.hardware.threads import own_thread
    from specviz.pairs.pipeline import encode_prompt, load_pair

    sizes = check_sizes(args)
    client = served = None
    if args.vllm_url:                          # fail fast, before any model loads
        client = VllmClient(args.vllm_url, timeout_s=600)
        served = client.model(args.vllm_model)
    else:
        launcher.require_installed()           # read through the module: a test stands in for the venv
    _threads(args.threads)
    # loaded in a thread that ends: ours steps in the scheduler's thread (hardware/threads.py)
    pair = own_thread(load_pair, args.target, "ngram", "cpu", compile=args.compile)
    prompts = [encode_prompt(pair.tokenizer, POOL[i % len(POOL)]) for i in range(sizes.users)]
    N, k = sizes.max_new, sizes.depth
    _note(args, f"our engine: {n_users(sizes.users)} × {N} tokens, n-gram k={k}")
    with _our_side(pair, prompts, k) as once:
        mine, other, served, client = _both(args, sizes, client, served, prompts, once)
    ours, theirs = _median_run(mine), _median_run(other)
    differ = []
    for i, (a, b) in enumerate(zip(ours["outputs"], theirs["outputs"])):
        pos = first_difference(a, b)
        if pos is not None:
            differ.append({"row": i, **_margin(pair, prompts[i], a, pos, b[pos] if pos < len(b) else None)})
    s, v = _summary(ours), _summary(theirs)
    result = {"specviz": s, "vllm": v,
              "ratio": s["tokens_per_s"] / v["tokens_per_s"] if v["tokens_per_s"] else None,
              "paired_ratio": paired_ratio(mine, other),
              "rows": sizes.users, "identical_rows": sizes.users - len(differ), "differing": differ,
              "users": sizes.users, "depth": k, "max_new_tokens": N, "target": args.target,
              "vllm_model": served.name, "vllm_url": client.url, "launched": args.vllm_url is None,
              "threads": torch_threads(), "cpu": cpu_name()}
    if not args.json:
        for name, side in (("specviz", s), ("vllm", v)):
            print(f"{name:>8}: {side['tokens_per_s']:.1f} tok/s, p50 {side['p50_s']:.2f} s, p95 {side['p95_s']:.2f} s",
                  file=sys.stderr)
            print(f"{'':>8}  where the time went: {_time_line(side['time'])}", file=sys.stderr)
        if result["ratio"]:
            paired = result["paired_ratio"]
            print(f"   ours ÷ vLLM: {result['ratio']:.2f}× by medians"
                  + (f", {paired:.2f}× paired by round" if paired else ""), file=sys.stderr)
    print(json.dumps(result), flush=True)
    real = [d for d in differ if not d["near_tie"]]
    for d in real:
        print(f"specviz: error: row {d['row'] + 1} differs from vLLM at token {d['position'] + 1} by more than a "
              f"near-tie (top-1 − top-2 {d['top1_minus_top2']:.3g} logits)", file=sys.stderr)
    return 1 if real else 0
