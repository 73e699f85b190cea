"""`python -m specviz sweep --engine vllm`: the users × depth sweep on vLLM, one server per depth.

For each depth (0 = no speculative config) a local vLLM server is launched from `.venv-vllm`, warmed up,
and given B concurrent requests of the same prompt for each batch size B (EOS ignored, every row decodes
exactly --max-new-tokens). Then one more server with vLLM's dynamic schedule
(`num_speculative_tokens_per_batch_size`) runs the same batch sizes, so the schedule is measured against
the fixed depths on the same machine. Servers run one at a time and are stopped before the next starts.

Tokens/s is end to end (all rows' new tokens ÷ wall time from the first request to the last token, prefill
included), as in our own sweep. Acceptance and the depth the server actually drafted ("mean depth", the
schedule's live k) come from the difference of two `/metrics` reads around each cell.

Writes the same sweep.csv / sweep.json / sweep.html as our sweep, plus `recorded.json` in the layout of
`assets/sweeps/` (with the command, the vLLM version and the CPU): copy it there to show it in the lesson.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from specviz.cli.common import charts, write_chart
from specviz.cli.sweep_record import acceptance, command_line, dumps, table
from specviz.hardware.costmodel import best_depths, crossover_from_rows
from specviz.limits import LimitError
from specviz.pairs.models import load_tokenizer
from specviz.vllm.client import VllmClient, VllmError
from specviz.vllm import launcher
from specviz.vllm.launcher import LaunchSpec, VllmServer, free_port, python_path, speculative_config
from specviz.vllm.metrics import snapshot, window

WARMUP_TOKENS = 8


def parse_schedule(text: str) -> tuple[tuple[int, int, int], ...]:
    """ "1-4:4,5-8:2,9-256:1" → ((1, 4, 4), (5, 8, 2), (9, 256, 1)); "" or "none" → no schedule run."""

    if text.strip().lower() in ("", "none", "off"):
        return ()
    rows = []
    try:
        for part in text.split(","):
            span, k = part.split(":")
            lo, hi = span.split("-")
            rows.append((int(lo), int(hi), int(k)))
    except ValueError:
        raise LimitError(f"--schedule takes LO-HI:K entries separated by commas (e.g. 1-4:4,5-8:2,9-256:1), "
                          f"got {text!r}")
    for lo, hi, k in rows:
        if not (1 <= lo <= hi <= 4096 and 0 <= k <= 16):
            raise LimitError(f"--schedule entry {lo}-{hi}:{k}: batch sizes 1-4096 (low ≤ high), depth 0-16")
    return tuple(rows)


def schedule_text(rows) -> str:
    return ",".join(f"{lo}-{hi}:{k}" for lo, hi, k in rows)


def _cell(client, model: str, prompt: list[int], batch: int, max_new: int) -> dict:
    """B concurrent rows on a warm server; counters from /metrics around the cell."""
    # on first use: torch is slow to import
    from specviz.vllm.run import run_all

    before = snapshot(client.metrics_text())
    r = run_all(client, model, [prompt] * batch, max_new, ignore_eos=True)
    after = snapshot(client.metrics_text())
    if r.error:
        raise VllmError(r.error)
    tokens = sum(map(len, r.outputs.values()))
    w = window(before, after)
    drafted = None if after.draft_tokens is None or before.draft_tokens is None else after.draft_tokens - before.draft_tokens
    accepted = None if after.accepted_tokens is None or before.accepted_tokens is None else after.accepted_tokens - before.accepted_tokens
    return {"batch_size": batch, "tokens_per_s": tokens / r.wall_s, "tokens": tokens, "wall_s": r.wall_s,
            "acceptance_rate": w.acceptance_rate, "mean_depth": w.mean_drafted or 0.0,
            "drafted": drafted or 0.0, "accepted": accepted or 0.0}


def _server_cells(args, spec, prompt: list[int], batches: list[int], note) -> list[dict]:
    """Launch one server, warm it at the largest batch, measure every batch size, stop it."""
    # on first use: torch is slow to import
    from specviz.vllm.run import run_all

    server = VllmServer(spec)
    try:
        server.start(progress=note)
        client = VllmClient(server.url, timeout_s=600)
        model = client.model().name
        cells = []
        for b in batches:
            run_all(client, model, [prompt] * b, WARMUP_TOKENS)              # warm-up at this shape, not recorded
            runs = sorted((_cell(client, model, prompt, b, args.max_new_tokens) for _ in range(args.repeats)),
                          key=lambda c: c["tokens_per_s"])
            cells.append(runs[len(runs) // 2])                                # the median run
            note(f"B={b}: {cells[-1]['tokens_per_s']:.1f} tok/s (median of {len(runs)}), "
                 f"mean depth {cells[-1]['mean_depth']:.2f}")
        return cells
    finally:
        server.stop()


def vllm_version(python) -> str:
    try:
        out = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True, timeout=120)
        return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else "?"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "?"


def run_sweep_vllm(args, batches: list[int], depths: list[int]) -> int:
    # on first use: torch is slow to import
    from specviz.hardware.device import cpu_name
    # on first use: transformers is slow to import
    from specviz.pairs.pipeline import encode_prompt

    schedule = parse_schedule(args.schedule)
    launcher.require_installed()           # read through the module: a test stands in for the venv
    speculative_config(args.draft, max(depths + [1]))        # an unsupported draft fails before any server starts
    prompt = encode_prompt(load_tokenizer(args.target), args.prompt)
    version, cpu = vllm_version(python_path()), cpu_name()

    def note(text: str) -> None:
        print(f"sweep (vLLM): {text}", file=sys.stderr, flush=True)

    rows, per_depth = [], {}
    runs = [(k, ()) for k in depths] + ([(max(k for _, _, k in schedule), schedule)] if schedule else [])
    for k, sched in runs:
        what = f"schedule {schedule_text(sched)}" if sched else f"k={k}"
        note(f"server for {what}")
        spec = LaunchSpec(args.target, args.draft, k, free_port(), schedule=sched, eager=args.vllm_eager)
        cells = _server_cells(args, spec, prompt, batches, note)
        if sched:
            per_depth["schedule"] = cells
        else:
            per_depth[k] = cells
            rows += [{"batch_size": c["batch_size"], "depth": k, "tokens_per_s": c["tokens_per_s"],
                      "decode_tokens_per_s": None, "acceptance_rate": c["acceptance_rate"], "flops_ratio": None,
                      "tokens": c["tokens"], "mean_depth": c["mean_depth"]} for c in cells]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "sweep.csv", rows + [{**c, "depth": "schedule"} for c in per_depth.get("schedule", [])])
    best, cross = best_depths(rows), crossover_from_rows(rows)
    path = "vLLM " + version + (" (--enforce-eager)" if args.vllm_eager else " (compiled)")
    (out / "sweep.json").write_text(json.dumps({"engine": "vllm", "vllm_version": version, "target": args.target,
                                                "draft": args.draft, "path": path, "rows": rows,
                                                "schedule": [list(r) for r in schedule],
                                                "schedule_rows": per_depth.get("schedule", []),
                                                "best_depth": best, "crossover_batch": cross, "cpu": cpu}, indent=1))
    rec = recorded(args, batches, depths, per_depth, schedule, len(prompt), version, cpu, path)
    (out / "recorded.json").write_text(dumps(rec))
    write_chart(out / "sweep.html", lambda: charts().sweep_figure(rows, batches, depths))
    print("batch → best depth: " + ", ".join(f"{b}→{k}" for b, k in best.items()))
    print(json.dumps({"best_depth": best, "crossover_batch": cross, "schedule_tokens_per_s":
                      rec.get("schedule", {}).get("tokens_per_s"), "vllm_version": version, "cpu": cpu}))
    return 0


def _write_csv(path: Path, rows: list[dict]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def recorded(args, batches, depths, per_depth: dict, schedule, prompt_tokens: int, version: str, cpu: str,
             path: str) -> dict:
    """The sweep in the layout of assets/sweeps/*.json (profiles.load_sweeps reads it), with provenance."""
    command = command_line("sweep --engine vllm", [
        ("target", args.target), ("draft", args.draft), ("prompt", args.prompt),
        ("batch_sizes", ",".join(map(str, batches))), ("depths", ",".join(map(str, depths))),
        ("schedule", schedule_text(schedule) or "none"), ("max_new_tokens", args.max_new_tokens),
        ("repeats", args.repeats)])
    command += " --vllm-eager" if args.vllm_eager else ""
    load = os.getloadavg()[0]
    rec = {"about": f"Measured on vLLM {version} ({cpu}), fp32, one server per depth launched in turn "
                    f"(load average {load:.2f} when it ended); tokens/s end to end (prefill included), EOS "
                    f"ignored, each cell the median of {args.repeats} run(s) after a warm-up at its batch size.",
           "command": command, "engine": "vllm", "engine_version": version, "device": f"cpu: {cpu}",
           "path": path, "target": args.target, "draft": args.draft, "prompt_tokens": prompt_tokens,
           "new_tokens": args.max_new_tokens, "recorded_at": time.strftime("%Y-%m-%d"),
           **table([{**c, "depth": k} for k in depths for c in per_depth[k]], batches, depths)}
    if schedule:
        cells = per_depth["schedule"]
        rec["schedule"] = {"rows": [list(r) for r in schedule],
                           "tokens_per_s": [round(c["tokens_per_s"], 2) for c in cells],
                           "mean_depth": [round(c["mean_depth"], 2) for c in cells],
                           "acceptance_rate": acceptance(cells)}
    return rec
