"""`python -m specviz frontier --engine vllm`: the frontier's class workload through launched vLLM servers.

The same workload as our `frontier` (cli/frontier.py): for each class size n, n concurrent streamed
requests, one pool prompt per user (our tokenizer and chat template, so both engines see the same token
ids), EOS ignored (`ignore_eos`), `--max-new-tokens` each. The arms are the ones production vLLM offers
on CPU: no speculation, each fixed depth (n-gram draft with bench-vllm's settings, or a draft model), and
vLLM's per-batch-size schedule (`num_speculative_tokens_per_batch_size`). Our adaptive arm has no vLLM
counterpart, so it is not run here; the chapter sets these rows beside ours.

One server per arm, launched in turn and stopped before the next (they would share the CPU otherwise).
On each: a warm-up class at each size (untimed), then `--repeats` runs of that class back to back; the
median is reported with its spread (max − min) ÷ median as "noise". The arms cannot be interleaved
inside a round as ours are (a restart per cell costs minutes), so the noise band covers run-to-run
spread on one server, not drift between servers.

Where each figure comes from:
- tokens_per_s: every user's new tokens ÷ wall time from the first request to the last token (ours too);
  per_user_tokens_per_s: the median over users of their tokens ÷ their finish time.
- acceptance_rate: accepted ÷ drafted between two `/metrics` reads around the cell (null with no
  speculation, or where the server exports no spec-decode counters).
- accepted_length: tokens per row per step, tokens ÷ (tokens − accepted), since a step emits its
  accepted drafts plus one token; from the same window (1.0 with no speculation; null without counters).
- drafted_per_step, verified_per_step: drafted slots ÷ engine steps, the steps being the window's count
  of `vllm:iteration_tokens_total` (one sample per engine step); vLLM verifies every slot it drafts, so
  the two are equal. Null where that histogram is absent.
"""
from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

from specviz.chapters.frontier_cells import median_row
from specviz.cli.common import n_users
from specviz.cli.frontier_common import prompt_texts, write_out
from specviz.cli.sweep_vllm import parse_schedule, schedule_text, vllm_version
from specviz.limits import LimitError
from specviz.vllm import launcher
from specviz.vllm.client import VllmClient, VllmError
from specviz.vllm.metrics import parse_prometheus, snapshot, total, window

WARMUP_TOKENS = 8
SETTLE_S = 0.3          # the API server records a step's stats just after streaming it: let the last one land
STEPS_METRIC = "vllm:iteration_tokens_total_count"


def add_vllm_args(p) -> None:
    p.add_argument("--engine", choices=("specviz", "vllm"), default="specviz",
                   help="vllm: the same workload through launched vLLM servers, one per arm in turn (no "
                        "speculation, each fixed depth, the per-batch-size schedule); needs scripts/vllm-setup")
    p.add_argument("--schedule", default=None,
                   help="vLLM only: the schedule arm's num_speculative_tokens_per_batch_size as LO-HI:K entries "
                        "(e.g. 1-4:8,5-16:4,17-64:2); 'none' skips it. Default: one range per class size, "
                        "ending at it, the largest --depths at the smallest class down to the smallest depth "
                        "at the largest class, spread evenly")
    p.add_argument("--vllm-eager", action="store_true",
                   help="vLLM only: launch servers with --enforce-eager (start minutes sooner, decode slower)")


def default_schedule(users: list[int], depths: list[int]) -> tuple[tuple[int, int, int], ...]:
    """Deep drafts while the class is small, shallow as it grows (the rule a production schedule encodes):
    class i of m gets the depths' (largest first) entry at i·(len − 1)/(m − 1), rounded; equal neighbours
    merge. Users 1,4,16 with depths 2,4 → 1-1:4,2-16:2."""
    ks, sizes = sorted({d for d in depths if d > 0}, reverse=True), sorted(set(users))
    rows, lo = [], 1
    for i, n in enumerate(sizes):
        k = ks[int(i * (len(ks) - 1) / max(1, len(sizes) - 1) + 0.5)]
        if rows and rows[-1][2] == k:
            rows[-1] = (rows[-1][0], n, k)
        else:
            rows.append((lo, n, k))
        lo = n + 1
    return tuple(rows)


def check_schedule(text: str | None, users: list[int], depths: list[int]) -> tuple[tuple[int, int, int], ...]:
    """The schedule arm's rows, or () for none. Beyond sweep's syntax, the rules vLLM itself enforces at
    start-up, refused here in one sentence before minutes are spent launching."""
    if text is None:
        return default_schedule(users, depths)
    rows = parse_schedule(text)
    if not rows:
        return ()
    ordered = sorted(rows)
    if ordered[0][0] != 1:
        raise LimitError(f"--schedule must start at batch size 1 (vLLM needs a depth for every batch size); "
                         f"got {text!r}")
    if any(b[0] <= a[1] for a, b in zip(ordered, ordered[1:])):
        raise LimitError(f"--schedule ranges must not overlap; got {text!r}")
    if max(k for _, _, k in rows) == 0:
        raise LimitError(f"--schedule needs a depth above 0 somewhere (vLLM's k is its largest); got {text!r}")
    return tuple(ordered)


def vllm_arms(depths: list[int], schedule) -> list[tuple[str, int, tuple]]:
    """(arm, depth, schedule rows) per server: no speculation, each fixed depth, then the schedule (its
    depth is its largest k, the server's num_speculative_tokens)."""
    out = [("none", 0, ())] + [("fixed", d, ()) for d in sorted({d for d in depths if d > 0})]
    return out + ([("schedule", max(k for _, _, k in schedule), tuple(schedule))] if schedule else [])


def _delta(old, new):
    return None if old is None or new is None else new - old


def cell_from_run(arm: str, depth: int, users: int, result, before: str, after: str) -> dict:
    """One cell from a finished `run_all` and the /metrics texts read around it (see the module's notes)."""
    if result.error:
        raise VllmError(result.error)
    rows = sorted(result.outputs)
    outs = [list(result.outputs[i]) for i in rows]
    tokens, wall = sum(map(len, outs)), result.wall_s
    per_user = [len(result.outputs[i]) / result.latencies[i] for i in rows if result.latencies.get(i, 0) > 0]
    a, b = snapshot(before), snapshot(after)
    w = window(a, b)
    accepted = _delta(a.accepted_tokens, b.accepted_tokens)
    drafted = _delta(a.draft_tokens, b.draft_tokens)
    if depth == 0:                 # no spec-decode counters exist without speculation: nothing was drafted
        accepted, drafted = accepted or 0.0, drafted or 0.0
    steps = _delta(total(parse_prometheus(before), STEPS_METRIC), total(parse_prometheus(after), STEPS_METRIC))
    per_step = drafted / steps if steps and drafted is not None else None
    return {"arm": arm, "depth": depth, "users": users, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "per_user_tokens_per_s": statistics.median(per_user) if per_user else 0.0,
            "acceptance_rate": w.acceptance_rate if depth else None,
            "accepted_length": tokens / (tokens - accepted) if accepted is not None and tokens > accepted else None,
            "drafted_per_step": per_step, "verified_per_step": per_step,
            "steps": steps, "engine": "vllm", "outputs": outs}


def class_cell(client, model: str, arm: str, depth: int, prompts: list[list[int]], users: int,
               max_new: int) -> dict:
    """`users` concurrent streamed requests, one pool prompt each, EOS ignored, /metrics read around."""
    # on first use: torch is slow to import
    from specviz.vllm.run import run_all

    before = client.metrics_text()
    r = run_all(client, model, [prompts[i % len(prompts)] for i in range(users)], max_new, ignore_eos=True)
    time.sleep(SETTLE_S)
    return cell_from_run(arm, depth, users, r, before, client.metrics_text())


def server_cells(spec, arm: str, prompts: list[list[int]], users: list[int], max_new: int, repeats: int,
                 note) -> tuple[dict[int, list[dict]], float]:
    """Launch one server, measure every class size on it (warm-up first at each), stop it. Returns the
    cells per class size and the seconds the server took to become healthy."""
    # on first use: torch is slow to import
    from specviz.vllm.run import run_all

    server = launcher.VllmServer(spec)
    try:
        t0 = time.monotonic()
        server.start(progress=note)
        start_s = time.monotonic() - t0
        client = VllmClient(server.url, timeout_s=600)
        served = client.model()
        if served.max_len and max(map(len, prompts)) + max_new > served.max_len:
            raise VllmError(f"prompt + {max_new} tokens exceed the server's max-model-len {served.max_len}")
        cells = {}
        for n in users:
            run_all(client, served.name, [prompts[i % len(prompts)] for i in range(n)], WARMUP_TOKENS)
            cells[n] = [class_cell(client, served.name, arm, spec.depth, prompts, n, max_new)
                        for _ in range(repeats)]
            note(f"{arm} k={spec.depth}, {n_users(n)}: "
                 + ", ".join(f"{c['tokens_per_s']:.1f}" for c in cells[n]) + " tok/s")
        return cells, start_s
    finally:
        server.stop()


def summarise(per_arm: dict[tuple[str, int], dict[int, list[dict]]]) -> tuple[list[dict], bool]:
    """Median rows (arm by arm, class size by class size) and whether every run of every arm gave the
    no-speculation arm's tokens, user for user."""
    rows, identical = [], True
    for cells in per_arm.values():
        for n, group in cells.items():
            rows.append(median_row(group))
            ref = per_arm[("none", 0)][n][0]["outputs"]
            identical &= all(c["outputs"] == ref for c in group)
    return rows, identical


def command_line(args, users, depths, schedule) -> str:
    """The command that reproduces this run, every choice spelled out (the schedule too)."""
    parts = [("target", args.target), ("draft", args.draft), ("prompts", args.prompts),
             ("users", ",".join(map(str, users))), ("depths", ",".join(map(str, depths))),
             ("schedule", schedule_text(schedule) or "none"), ("max-new-tokens", args.max_new_tokens),
             ("repeats", args.repeats)]
    cmd = "python -m specviz frontier --engine vllm " + " ".join(f"--{k} {shlex.quote(str(v))}" for k, v in parts)
    return cmd + (" --vllm-eager" if args.vllm_eager else "")


def run_vllm(args, users: list[int], depths: list[int]) -> int:
    # on first use: torch and transformers are slow to import
    from specviz.hardware.device import cpu_name
    from specviz.pairs.models import load_tokenizer
    from specviz.pairs.pipeline import encode_prompt

    schedule = check_schedule(args.schedule, users, depths)
    launcher.require_installed()
    launcher.speculative_config(args.draft, max(depths))     # an unsupported draft fails before any server starts
    tok = load_tokenizer(args.target)
    prompts = [encode_prompt(tok, t) for t in prompt_texts(args.prompts)]
    version, cpu = vllm_version(launcher.python_path()), cpu_name()

    def note(text: str) -> None:     # stderr even with --json: server starts take minutes, stdout stays one line
        print(f"frontier (vLLM): {text}", file=sys.stderr, flush=True)

    per_arm, starts = {}, {}
    for arm, k, sched in vllm_arms(depths, schedule):
        spec = launcher.LaunchSpec(args.target, args.draft, k, launcher.free_port(), schedule=sched,
                                   eager=args.vllm_eager)
        note(f"server for {arm} k={k}" + (f" ({schedule_text(sched)})" if sched else ""))
        per_arm[(arm, k)], start_s = server_cells(spec, arm, prompts, users, args.max_new_tokens, args.repeats, note)
        starts["none" if arm == "none" else f"{arm}:{k}"] = round(start_s, 1)
    rows, identical = summarise(per_arm)
    path = "vLLM " + version + (" (--enforce-eager)" if args.vllm_eager else " (compiled)")
    workload = {"target": args.target, "draft": args.draft, "prompts": args.prompts, "users": users,
                "depths": depths, "schedule": schedule_text(schedule) or None, "max_new_tokens": args.max_new_tokens,
                "repeats": args.repeats, "path": path, "prompt_tokens": [len(p) for p in prompts]}
    result = {"rows": rows, "identical": identical, "device": cpu, "engine": "vllm", "vllm_version": version,
              "workload": workload, "server_start_s": starts, "command": command_line(args, users, depths, schedule)}
    if args.out:
        out = Path(args.out)
        write_out(out, result)
        (out / "recorded.json").write_text(json.dumps(recorded(result), indent=1, ensure_ascii=False))
    print(json.dumps(result), flush=True)
    return 0


def recorded(result: dict) -> dict:
    """The run as the lesson shows it (assets/frontier/), with where, when and how it was measured."""
    w = result["workload"]
    return {"about": f"Measured on {w['path']} ({result['device']}), fp32, one server per arm launched in turn "
                     f"(load average {os.getloadavg()[0]:.2f} when it ended); tokens/s end to end (prefill "
                     f"included), EOS ignored, each cell the median of {w['repeats']} run(s) after a warm-up "
                     f"at its class size.",
            "command": result["command"], "engine": "vllm", "engine_version": result["vllm_version"],
            "device": f"cpu: {result['device']}", "recorded_at": time.strftime("%Y-%m-%d"),
            "workload": w, "identical": result["identical"], "server_start_s": result["server_start_s"],
            "rows": result["rows"]}
