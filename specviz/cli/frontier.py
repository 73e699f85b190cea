"""`python -m specviz frontier`: throughput against per-user speed as the class grows, one line per arm.

The class workload: `users` requests, one prompt each (the row pool, or prompts.GROUNDED, whose answers
copy their input), every user a separate request to the shared scheduler (as the app serves a class; `serve/workload.py`),
the class handed over in one call so it is admitted in one wave, each user reading its tokens in its own
thread, EOS ignored so every arm emits the same number of tokens. The lesson's frontier chapter steps the
same cells in its own thread (`chapters/frontier.py`, which holds the arms, the medians and the conclusion
rules both use). A cell of a small class runs the class again, on the next prompts, until it has emitted
CELL_TOKENS tokens, at least MIN_CLASSES times (the JSON's workload names the classes per size). Arms:
no speculation, each fixed depth, `adaptive-verification` with the largest depth as its k (and, with
--with-adaptive, the older `adaptive` goodput policy). `--repeats` runs every cell that many times;
inside each round the arms share one scheduler and take turns class by class (`scheduled_round`);
medians are reported with the spread (max − min) ÷ median as the noise band.

Last stdout line: {"rows": [...], "identical": bool, "lossless": bool, "divergence": {...}, "device": ...,
"workload": ...}; `--out DIR` also writes frontier.csv, frontier.json and frontier.html. Every arm's
tokens are held against no speculation's: where they differ, each row's first divergence is judged by the
one near-tie rule (engine.divergence, the target's own margins there), reported in `divergence` and on
stderr, and one above the rule is a bug: exit status 1.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specviz.chapters.frontier_cells import (WARM_TOKENS, cell_result, divergence_of, measure, policy_for, warm_budget,
                                             williams_row)
from specviz.chapters.frontier_verdict import class_lines
from specviz.cli.args import int_in, int_list, out_folder
from specviz.cli.common import add_compile_arg, add_pair_args, graphs_of, n_users, refuse_vllm_only
from specviz.cli.dial import Dial, synthetic_note
from specviz.cli.frontier_common import prompt_texts, write_out
from specviz.cli.frontier_vllm import add_vllm_args, run_vllm
from specviz.engine.divergence import rule_said
from specviz.engine.request import Knobs, Request
from specviz.limits import MAX_DEPTH, LimitError, Limits

MAX_USERS = 64
# A cell runs its class again until it has emitted this many tokens, and at least MIN_CLASSES times: one
# user's 32 tokens are ~0.3 s, where a 2-core machine's own drift moves a one-user cell by ±20 %; with
# fewer tokens, cells of identical work spread ±5–9 %, wider than the gaps the verdict judges (the best of
# four arms' medians, which noise lifts). Every arm runs the same classes: the same tokens on every arm.
CELL_TOKENS = 1024
MIN_CLASSES = 2
PROMPT_SETS = ("pool", "grounded")


def add_parser(sub) -> None:
    p = sub.add_parser("frontier", help="throughput vs per-user tokens/s by class size: fixed depths vs "
                                        "adaptive verification")
    add_pair_args(p)
    add_compile_arg(p)
    p.add_argument("--users", default="1,4,16,64", type=int_list(1, MAX_USERS),
                   help=f"class sizes, comma-separated (1-{MAX_USERS})")
    p.add_argument("--depths", default="0,2,4,8", type=int_list(0, MAX_DEPTH),
                   help=f"fixed depths, comma-separated (0-{MAX_DEPTH}; 0 = no speculation)")
    p.add_argument("--max-new-tokens", type=int_in(1, 512), default=32, help="tokens each user decodes (1-512)")
    p.add_argument("--prompts", default="pool", choices=PROMPT_SETS,
                   help="pool (the row pool) or grounded (input-grounded prompts, like the first Run's)")
    p.add_argument("--repeats", type=int_in(1, 9), default=1, help="runs per cell, arms interleaved (1-9)")
    p.add_argument("--cell-tokens", type=int_in(0, 100_000), default=CELL_TOKENS,
                   help=f"a cell runs classes until its users emitted this many tokens, at least {MIN_CLASSES} "
                        f"classes (default {CELL_TOKENS}; 0: just {MIN_CLASSES} classes a cell)")
    p.add_argument("--with-adaptive", action="store_true", help="also run the older `adaptive` policy")
    p.add_argument("--json", action="store_true", help="print only the final JSON line")
    p.add_argument("--out", default=None, type=out_folder, help="folder for frontier.csv, frontier.json and frontier.html")
    add_vllm_args(p)              # --engine vllm: the same workload through launched vLLM servers
    p.set_defaults(func=run)


def check_args(args) -> tuple[list[int], list[int]]:
    users, depths = args.users, args.depths
    if max(depths) == 0:
        raise LimitError("--depths needs at least one depth above 0 (the adaptive arm drafts up to the largest)")
    refuse_vllm_only(args, {"schedule": None, "vllm_eager": False})
    return users, depths


def classes_for(users: int, max_new: int, cell_tokens: int | None = None) -> int:
    """How many classes of `users` one cell runs back to back: enough for `cell_tokens` tokens (default
    CELL_TOKENS, read at the call), at least MIN_CLASSES."""
    tokens = CELL_TOKENS if cell_tokens is None else cell_tokens
    return max(MIN_CLASSES, -(-tokens // max(1, users * max_new)))


def scheduled_cell(pair, prompts: list[list[int]], arm: str, depth: int, users: int, max_new: int,
                   budget=None, classes: int = 1) -> dict:
    """One arm's cell: `classes` classes through a shared scheduler of its own (scheduled_round with one
    arm)."""
    return scheduled_round(pair, prompts, [(arm, depth)], users, max_new, budget, classes)[0]


def scheduled_round(pair, prompts: list[list[int]], order: list[tuple[str, int]], users: int, max_new: int,
                    budget=None, classes: int = 1, r: int = 0, dial=None, refs: dict | None = None) -> list[dict]:
    """One round: every arm in `order` runs `classes` classes through one shared scheduler, as the app
    serves them (each `users` one-row requests submitted together, each read in its own thread, EOS
    ignored), the arms interleaved class by class. Class j starts `users × j` places further along the
    prompt list, so a one-user cell covers the prompts as a class of several does. Timed: every class from
    its submit to its last token, summed per arm. Returns one cell per arm, in `order`.

    Why class by class: a 2-core machine's speed drifts by ±10–20 % over seconds (its memory bandwidth is
    shared), so arms run back to back spread 13–35 % over five rounds, and alternating every class brings
    that near 10 %. Each class's arm
    order is a row of a Williams design (`williams_row`, row r × classes + j), so no arm always follows
    the same one. `budget`: the adaptive-verification arm's, kept across cells as the app's long-lived
    engine keeps it (chapters.frontier.warm_budget); the other arms' rows never read it. `dial`
    (cli.dial.Dial) with a synthetic draft: each class's reference is decoded first through this scheduler
    at depth 0, untimed, and kept in `refs` (prompt → continuation) for later rounds; user i of class j
    is request seed users × j + i, so every arm draws the same coins."""
    from specviz.serve.workload import shared_scheduler, users_at_once

    limits = Limits(max_rows_per_user=1, max_shared_rows=max(users, 1), max_queue=max(users, 1))
    engines = []                    # built in the scheduler's thread; their step counters are read after
    sched = shared_scheduler(pair, limits, ignore_eos=True, name="frontier", budget=budget, built=engines.append)
    acc = [_Sums() for _ in order]
    try:
        if dial is not None and dial.on:      # every class's reference first (depth 0, untimed)
            for j in range(classes):
                mine = [prompts[(users * j + i) % len(prompts)] for i in range(users)]
                if any(tuple(p) not in refs for p in mine):
                    refs.update(dial.class_reference(sched, mine, max_new))
        # untimed: a class of this size at the deepest depth, so the scheduler's thread, its engine and
        # both caches' buffers for `users` rows exist before the first timed class, as in a long-lived app
        # server that has served a class. With one 1-row request here, the round's first class faulted its
        # buffers in: at 64 users (layer-skip draft) its prefill took 0.33-0.35 s against 0.20-0.21 s for
        # the class after it, the same prompts — 7 % of that class, charged to whichever arm went first.
        top = max(depth for _, depth in order)
        users_at_once(sched, [Request([prompts[i % len(prompts)]], Knobs(top, 1), WARM_TOKENS, seed=i,
                                      references=refs) for i in range(users)], together=True)
        for j in range(classes):
            mine = [prompts[(users * j + i) % len(prompts)] for i in range(users)]
            for idx in williams_row(len(order), r * classes + j):
                arm, depth = order[idx]
                eng = engines[-1]
                eng.steps_run = eng.slots_drafted = eng.slots_verified = 0
                knobs = lambda: Knobs(depth, 1, policy_for(arm, depth))      # noqa: E731 (a fresh policy each)
                reqs = [Request([p], knobs(), max_new, seed=users * j + i, references=refs)
                        for i, p in enumerate(mine)]
                took, got = users_at_once(sched, reqs, together=True)
                acc[idx].add(took, got, engines[-1])      # (an engine replaced mid-class is the one to read)
    finally:
        sched.close()
        if sched.alive():         # the next round hands `budget` to another thread: never two at once
            raise RuntimeError("the frontier's scheduler thread did not end within a minute of its last class")
        if dial is not None:
            for eng in engines:
                dial.count(eng.drafter)
        _give_back(engines)
    return [{**s.row(arm, depth, users), "classes": classes} for s, (arm, depth) in zip(acc, order)]


class _Sums:
    """One arm's classes of a round, summed."""

    def __init__(self):
        self.wall, self.runs, self.steps, self.drafted, self.verified = 0.0, [], 0, 0, 0
        self.class_walls: list[float] = []      # each class's seconds, in class order (chapters.frontier.paired)

    def add(self, took: float, runs: list, eng) -> None:
        errors = [r.error for r in runs if r.error]
        if errors:
            raise RuntimeError(f"the shared scheduler failed a request: {errors[0]}")
        self.wall, self.runs = self.wall + took, self.runs + runs
        self.class_walls.append(took)
        self.steps += eng.steps_run
        self.drafted += eng.slots_drafted
        self.verified += eng.slots_verified

    def row(self, arm: str, depth: int, users: int) -> dict:
        return {**cell_result(arm, depth, users, [r.outputs for r in self.runs], [r.totals for r in self.runs],
                              [r.done_s for r in self.runs], self.wall, self.steps, self.drafted, self.verified),
                "class_walls": list(self.class_walls)}


def _give_back(engines) -> None:
    """After a cell: its KV caches and the freed heap go back to the system before the next cell (a 64-user
    cell's caches are hundreds of MB; left to the allocator, the process grew to 10 GB over a run and the
    large cells' timings took its page faults)."""
    import gc

    from specviz.hardware.threads import own_thread
    from specviz.serve.heap import trim_heap

    def drop():                 # new empty caches are zero-filled by OpenMP: not in this long-lived thread
        for eng in engines:
            eng.drop_caches()
    own_thread(drop)
    gc.collect()
    trim_heap()


def _comparison(line: dict) -> dict:
    """One class size's verdict for the JSON: adaptive verification against the best other arm, by the
    medians and paired (chapters.frontier.class_lines)."""
    keys = ("users", "best_arm", "ratio", "by_medians", "paired", "band", "verdict", "same_work")
    return {k: line[k] for k in keys}


def run(args) -> int:
    from specviz.engine.profiling import pair_profiles
    from specviz.hardware.device import device_name
    from specviz.hardware.threads import own_thread
    from specviz.pairs.pipeline import encode_prompt, load_pair
    from specviz.serve.heap import freeze_long_lived

    users, depths = check_args(args)
    if args.engine == "vllm":
        return run_vllm(args, users, depths)
    def prepare():
        pair = load_pair(args.target, args.draft, args.device, compile=args.compile)
        prompts = [encode_prompt(pair.tokenizer, t) for t in prompt_texts(args.prompts)]
        profile = pair_profiles(pair)
        return pair, prompts, profile, warm_budget(pair, prompts, max(depths), profile)
    # in a thread that then exits: the cells run in the scheduler's thread, and a pool of OpenMP workers
    # left in this one would slow every cell (hardware/threads.py)
    pair, prompts, profile, budget = own_thread(prepare)
    t = pair.target
    dial, refs = Dial.of(pair), {}      # references by class size (the same batch), kept across rounds
    if dial.on:
        print(synthetic_note(dial.rate), file=sys.stderr)
    # warm-up (allocator, kernels, threads), drafting as the cells will
    scheduled_round(pair, prompts, [("fixed", max(depths))], 2, 4, None, 1, 0, dial, refs.setdefault(2, {}))
    freeze_long_lived()          # as the app does once its pair is warm: the collector skips the models

    def cell(arm, d, n):            # measure's warm-up at each size: every round already opens with one
        return {}

    def round_of(order, n, r):
        per = args.max_new_tokens
        return scheduled_round(pair, prompts, order, n, per, budget, classes_for(n, per, args.cell_tokens), r,
                               dial, refs.setdefault(n, {}))

    def show(c, _rows):
        if not args.json:
            print(json.dumps({k: v for k, v in c.items() if k != "outputs"}), flush=True)
    differing: list = []
    rows, identical = measure(cell, users, depths, args.repeats, args.with_adaptive, show, round_of, differing)
    report, where = own_thread(divergence_of, t.model, t.device, lambda m: prompts[m % len(prompts)], differing)
    result = {"rows": rows, "identical": identical, "lossless": report.lossless,
              "divergence": {**report.as_dict(), "cells": [list(w) for w in where]}, "device": device_name(t.device),
              "workload": {"target": args.target, "draft": args.draft, "prompts": args.prompts,
                           "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                           "classes": {str(n): classes_for(n, args.max_new_tokens, args.cell_tokens)
                                       for n in users},
                           "path": pair.fast.shown, "cell_tokens": args.cell_tokens},
              "synthetic": dial.as_dict(), "graphs": graphs_of(pair.fast),
              "verify_profile_s": profile[0], "draft_profile_s": profile[1],
              "comparisons": [_comparison(x) for x in class_lines(rows)]}
    if not args.json:
        if pair.fast.graph_stats() is not None:
            print(f"graphs: {pair.fast.graph_stats().line()}", file=sys.stderr)
        for x in result["comparisons"]:
            paired = f", {x['paired']:.3f}× paired by class" if x["paired"] else ""
            print(f"{n_users(x['users'])}: adaptive verification {x['by_medians']:.3f}× {x['best_arm']} (the best other arm) "
                  f"by medians{paired}; band ±{x['band']:.0%}: {x['verdict']}"
                  f"{' (it drafted nothing: the same work)' if x['same_work'] else ''}", file=sys.stderr)
    if args.out:
        write_out(Path(args.out), result)
    print(json.dumps(result), flush=True)
    return _said_lossless(report, where)


def _said_lossless(report, where) -> int:
    """Exit status: 1 when an arm's tokens left no speculation's above the near-tie rule. Each divergence,
    near-tie or bug, is said on stderr (and kept in the JSON's `divergence`)."""
    for d, (arm, depth, n) in zip(report.divergences, where):
        verdict = "a near-tie" if d.near_tie else "a bug"
        print(f"{n_users(n)}, {arm} k = {depth}, user {d.row + 1} of the class: first difference at token "
              f"{d.position + 1}, no speculation wrote {d.reference} and this arm {d.ours}; in the target's own "
              f"pass there its two best tokens are {d.margins.top1_minus_top2:.3g} logits apart: {verdict}",
              file=sys.stderr)
    if report.divergences:
        print(rule_said(), file=sys.stderr)
    return 0 if report.lossless else 1
