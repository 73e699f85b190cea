"""What both frontier commands share (ours, cli/frontier.py, and vLLM's, cli/frontier_vllm.py): the class's
prompt texts and the files `--out` writes. A module of its own, so neither command imports the other."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from specviz.cli.common import write_chart
from specviz.serve.prompts import GROUNDED, ROW_POOL

FIELDS = ["arm", "depth", "users", "tokens_per_s", "per_user_tokens_per_s", "acceptance_rate", "accepted_length",
          "drafted_per_step", "verified_per_step", "noise", "repeats", "classes", "tokens", "wall_s", "steps"]


def prompt_texts(kind: str) -> list[str]:
    # prompts.GROUNDED: the answer copies the input, so an n-gram draft finds it
    return list(GROUNDED) if kind == "grounded" else list(ROW_POOL)


def write_out(folder: Path, result: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "frontier.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(result["rows"])
    (folder / "frontier.json").write_text(json.dumps(result, indent=1))
    write_chart(folder / "frontier.html", lambda: _figure(result["rows"]))


def _figure(rows: list[dict]):
    from specviz.chapters.frontier import figure_frontier     # plotly: only where the page is drawn

    return figure_frontier({"table": rows})
