"""A sweep in the layout of `assets/sweeps/*.json` (`profiles.load_sweeps` reads it), with how it was
measured: the command, the CPU, the day. Both engines' sweeps write one as `recorded.json`; copied into
`assets/sweeps/`, ours is what `whatif --sweeps` holds its models against and vLLM's is what the lesson shows."""
from __future__ import annotations

import json
import os
import re
import shlex
import time

# a list of numbers as json.dumps(indent=1) lays it out, one per line; no string holds a raw newline
_NUMBERS = re.compile(r"\[\n\s*(-?[\d.e+-]+(?:,\n\s*-?[\d.e+-]+)*)\n\s*\]")


def dumps(record: dict) -> str:
    """The record as JSON a person reads: one line per list of numbers (a batch size's row, the depths)."""
    text = json.dumps(record, indent=1, ensure_ascii=False)
    return _NUMBERS.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


def command_line(sub: str, flags: list[tuple[str, object]]) -> str:
    """`python -m specviz SUB --flag value …`, quoted for a shell, so the record says how to measure it again."""
    parts = [f"--{k.replace('_', '-')} {shlex.quote(str(v))}" for k, v in flags if v is not None]
    return " ".join(["python -m specviz", sub, *parts])


def acceptance(cells: list[dict]) -> float | None:
    """The share of drafted tokens accepted over every cell of one depth (None where nothing was drafted)."""
    drafted = sum(c["drafted"] for c in cells)
    return round(sum(c["accepted"] for c in cells) / drafted, 3) if drafted else None


def table(rows: list[dict], batches: list[int], depths: list[int]) -> dict:
    """Acceptance per depth and tokens/s per [batch][depth] from one row per cell."""
    cell = {(r["batch_size"], r["depth"]): r for r in rows}
    acc = {str(k): a for k in depths if k > 0
           and (a := acceptance([cell[b, k] for b in batches])) is not None}
    return {"acceptance_rate": acc, "batch_sizes": batches, "depths": depths,
            "tokens_per_s": [[round(cell[b, k]["tokens_per_s"], 2) for k in depths] for b in batches]}


def ours(args, rows: list[dict], batches: list[int], depths: list[int], *, target: str, draft: str, path: str,
         dtype: str, device: str, cpu: str, prompt_tokens: int) -> dict:
    """Our engine's sweep as a record: each cell its median run (`--repeats`) after the sweep's warm-up,
    end to end. `target`/`draft`: the what-if presets of their shapes where there are such."""
    command = command_line("sweep", [("compile", args.compile), ("target", args.target), ("draft", args.draft),
                                     ("device", args.device), ("prompt", args.prompt),
                                     ("batch_sizes", ",".join(map(str, batches))),
                                     ("depths", ",".join(map(str, depths))),
                                     ("max_new_tokens", args.max_new_tokens),
                                     ("repeats", args.repeats if args.repeats > 1 else None)])
    machine = cpu if device.startswith("cpu") else f"{device.removeprefix('cuda: ')} (host {cpu})"
    return {"about": f"Measured with SpecViz on {machine}, {dtype}, forward path {path} (load average "
                     f"{os.getloadavg()[0]:.2f} when it ended); tokens/s end to end (prefill included), each cell "
                     f"the median of {args.repeats} run(s) on a fresh engine, after a warm-up.",
            "command": command, "engine": "specviz", "device": device, "cpu": cpu, "path": path,
            "target": target, "draft": draft, "prompt_tokens": prompt_tokens,
            "new_tokens": args.max_new_tokens, "recorded_at": time.strftime("%Y-%m-%d"),
            **table(rows, batches, depths)}
