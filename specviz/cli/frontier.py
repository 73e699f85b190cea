"""`python -m specviz frontier`: throughput against per-user speed as the class grows, one line per arm.

The class workload: `users` requests, one prompt each (the row pool, or the input-grounded examples),
every user a separate request in one shared batch, EOS ignored so every arm emits the same number of
tokens. The batch is stepped in this thread through the engine's own `step()` (the loop the app's
scheduler runs, without its thread hand-offs, so the cells are reproducible). Arms: no speculation,
each fixed depth, `adaptive-verification` with the largest depth as its k (and, with --with-adaptive,
the older `adaptive` goodput policy). `--repeats` runs every cell that many times, the arms interleaved
inside each round; medians are reported with the spread (max − min) ÷ median as the noise band.

Last stdout line: {"rows": [...], "identical": bool, "device": ..., "workload": ...}; `--out DIR` also
writes frontier.csv, frontier.json and frontier.html.
"""
from __future__ import annotations

import csv
import json
import statistics
import time
from pathlib import Path

from specviz.cli.common import add_compile_arg, add_pair_args
from specviz.limits import MAX_DEPTH, LimitError

MAX_USERS = 64
PROMPT_SETS = ("pool", "grounded")


def add_parser(sub) -> None:
    p = sub.add_parser("frontier", help="throughput vs per-user tokens/s by class size: fixed depths vs "
                                        "adaptive verification")
    add_pair_args(p)
    add_compile_arg(p)
    p.add_argument("--users", default="1,4,16,64", help=f"class sizes, comma-separated (1-{MAX_USERS})")
    p.add_argument("--depths", default="0,2,4,8", help=f"fixed depths, comma-separated (0-{MAX_DEPTH}; "
                                                       "0 = no speculation)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompts", default="pool", help="pool (the row pool) or grounded (input-grounded "
                                                     "examples, like the first Run's)")
    p.add_argument("--repeats", type=int, default=1, help="runs per cell, arms interleaved (1-9)")
    p.add_argument("--with-adaptive", action="store_true", help="also run the older `adaptive` policy")
    p.add_argument("--json", action="store_true", help="print only the final JSON line")
    p.add_argument("--out", default=None, help="folder for frontier.csv, frontier.json and frontier.html")
    p.set_defaults(func=run)


def parse_list(text: str, what: str, lo: int, hi: int) -> list[int]:
    """"1,4,16" → [1, 4, 16]; anything else is refused with one sentence."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise LimitError(f"--{what} must be whole numbers separated by commas, like 1,4,16; got '{text}'") from None
    if not values or any(not lo <= v <= hi for v in values):
        raise LimitError(f"--{what} must list whole numbers from {lo} to {hi}; got '{text}'")
    return sorted(set(values))


def check_args(args) -> tuple[list[int], list[int]]:
    users = parse_list(args.users, "users", 1, MAX_USERS)
    depths = parse_list(args.depths, "depths", 0, MAX_DEPTH)
    if max(depths) == 0:
        raise LimitError("--depths needs at least one depth above 0 (the adaptive arm drafts up to the largest)")
    if not 1 <= args.max_new_tokens <= 512:
        raise LimitError(f"--max-new-tokens must be 1-512; got {args.max_new_tokens}")
    if not 1 <= args.repeats <= 9:
        raise LimitError(f"--repeats must be 1-9; got {args.repeats}")
    if args.prompts not in PROMPT_SETS:
        raise LimitError(f"--prompts must be pool or grounded; got '{args.prompts}'")
    return users, depths


def prompt_texts(kind: str) -> list[str]:
    from specviz.serve.prompts import EXAMPLES, ROW_POOL

    # the input-grounded examples: the answer copies the input, so an n-gram draft finds it
    return list(EXAMPLES[:5]) if kind == "grounded" else list(ROW_POOL)


def arms(depths: list[int], with_adaptive: bool = False) -> list[tuple[str, int]]:
    out = [("none", 0)] + [("fixed", d) for d in depths if d > 0] + [("adaptive-verification", max(depths))]
    return out + ([("adaptive", max(depths))] if with_adaptive else [])


def _policy(arm: str, depth: int):
    from specviz.engine.policies import make_policy

    if arm == "adaptive":
        return make_policy("adaptive", max_depth=depth)
    return make_policy("adaptive-verification" if arm == "adaptive-verification" else "fixed")


def run_cell(pair, prompts: list[list[int]], arm: str, depth: int, users: int, max_new: int,
             profile: tuple | None = None) -> dict:
    """One class: `users` requests of one prompt each in one shared batch, stepped to the end."""
    from specviz.engine.budget import Budget
    from specviz.engine.request import Knobs, Request

    eng = pair.engine()
    eng.eos = set()                    # EOS ignored: every arm emits max_new tokens per user
    verify, draft = profile or (None, None)
    eng.budget = Budget(verify, padded=eng.budget.padded, draft_seed=draft)
    reqs = [Request([prompts[i % len(prompts)]], Knobs(depth, 1, _policy(arm, depth)), max_new)
            for i in range(users)]
    for r in reqs:
        eng.add(r)
    finished: dict[int, float] = {}
    steps = drafted = verified = 0
    t0 = time.perf_counter()
    while len(finished) < len(reqs):
        out = eng.step()
        if out:
            ev = out[0][1]              # the shared figures are the same in every request's event
            steps += 1
            drafted += ev.slots_drafted
            verified += ev.slots_verified
        now = time.perf_counter()
        for r in reqs:
            if r.done and r.id not in finished:
                finished[r.id] = now - t0
        if not out and not eng.requests:
            break
    wall = time.perf_counter() - t0
    outs = [r.outputs().get(0, []) for r in reqs]
    tokens = sum(len(o) for o in outs)
    acc = sum(r.totals.accepted for r in reqs)
    ver = sum(r.totals.drafted for r in reqs)
    per_user = [len(o) / finished.get(r.id, wall) for o, r in zip(outs, reqs) if finished.get(r.id, wall) > 0]
    return {"arm": arm, "depth": depth, "users": users, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "per_user_tokens_per_s": statistics.median(per_user) if per_user else 0.0,
            "acceptance_rate": acc / ver if ver else None,
            "accepted_length": tokens / max(1, sum(r.totals.row_steps for r in reqs)),
            "drafted_per_step": drafted / steps if steps else 0.0,
            "verified_per_step": verified / steps if steps else 0.0,
            "steps": steps, "outputs": outs}


def median_row(cells: list[dict]) -> dict:
    """The median of repeated cells, with their spread as the noise band."""
    tps = [c["tokens_per_s"] for c in cells]
    mid = statistics.median(tps)
    row = dict(min(cells, key=lambda c: abs(c["tokens_per_s"] - mid)))
    row["tokens_per_s"] = mid
    row["per_user_tokens_per_s"] = statistics.median(c["per_user_tokens_per_s"] for c in cells)
    row["noise"] = (max(tps) - min(tps)) / mid if mid and len(cells) > 1 else None
    row["repeats"] = len(cells)
    return row


def measure(pair, prompts, users: list[int], depths: list[int], max_new: int, repeats: int = 1,
            with_adaptive: bool = False, profile=None, on_cell=None) -> tuple[list[dict], bool]:
    """Every arm at every class size, `repeats` rounds with the arms interleaved. Returns the median
    rows (outputs dropped) and whether every arm's outputs equal the no-speculation arm's, row for row."""
    rows, identical = [], True
    for n in users:
        cells: dict[tuple[str, int], list[dict]] = {}
        for _ in range(repeats):
            for arm, d in arms(depths, with_adaptive):
                c = run_cell(pair, prompts, arm, d, n, max_new, profile)
                cells.setdefault((arm, d), []).append(c)
                if on_cell:
                    on_cell(c)
        ref = cells[("none", 0)][0]["outputs"]
        for group in cells.values():
            identical &= all(c["outputs"] == ref for c in group)
            row = median_row(group)
            row.pop("outputs")
            rows.append(row)
    return rows, identical


FIELDS = ["arm", "depth", "users", "tokens_per_s", "per_user_tokens_per_s", "acceptance_rate", "accepted_length",
          "drafted_per_step", "verified_per_step", "noise", "repeats", "tokens", "wall_s", "steps"]


def write_out(folder: Path, result: dict) -> None:
    from specviz import charts

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "frontier.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(result["rows"])
    (folder / "frontier.json").write_text(json.dumps(result, indent=1))
    charts.frontier_figure(result["rows"]).write_html(folder / "frontier.html", include_plotlyjs=True)


def run(args) -> int:
    from specviz.engine.budget import pair_profiles
    from specviz.hardware.device import device_name
    from specviz.pairs.pipeline import encode_prompt, load_pair

    users, depths = check_args(args)
    pair = load_pair(args.target, args.draft, args.device, compile=args.compile)
    texts = prompt_texts(args.prompts)
    prompts = [encode_prompt(pair.tokenizer, t) for t in texts]
    t = pair.target
    run_cell(pair, prompts, "fixed", max(depths), 2, 4)          # warm-up (allocator, kernels)
    profile = pair_profiles(pair)

    def show(c):
        if not args.json:
            print(json.dumps({k: v for k, v in c.items() if k != "outputs"}), flush=True)
    rows, identical = measure(pair, prompts, users, depths, args.max_new_tokens, args.repeats,
                              args.with_adaptive, profile, show)
    result = {"rows": rows, "identical": identical, "device": device_name(t.device),
              "workload": {"target": args.target, "draft": args.draft, "prompts": args.prompts,
                           "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                           "path": pair.fast.shown},
              "verify_profile_s": profile[0], "draft_profile_s": profile[1]}
    if args.out:
        write_out(Path(args.out), result)
    print(json.dumps(result), flush=True)
    return 0
