"""A recorded vLLM sweep (`sweep --engine vllm`, assets/sweeps/) as the lesson's charts read it.

The lesson's sweep chapter shows it as a speed-up heatmap beside the class's own measurement, and "vLLM's
answer" shows vLLM's dynamic schedule against its fixed depths, both labelled with the vLLM version and
the machine it was recorded on. Pure functions of the recorded numbers (no gradio, no server).
"""
from __future__ import annotations

from specviz.hardware.profiles import RecordedSweep, load_sweeps


def recorded_vllm_sweep() -> RecordedSweep | None:
    """The newest recorded vLLM sweep (by file name), or None when none is shipped."""
    sweeps = load_sweeps(engine="vllm")
    return sweeps[-1] if sweeps else None


def _plain(sw: RecordedSweep, bi: int) -> float | None:
    return sw.tokens_per_s[bi][sw.depths.index(0)] if 0 in sw.depths else None


def sweep_result(sw: RecordedSweep) -> dict:
    """The heatmap's input, as the live sweep chapter builds it: speed-up over k = 0 at the same batch."""
    table, best = [], []
    for bi, b in enumerate(sw.batch_sizes):
        plain = _plain(sw, bi)
        cells = [{"batch_size": b, "depth": k, "tokens_per_s": sw.tokens_per_s[bi][ki],
                  "speedup": sw.tokens_per_s[bi][ki] / plain if plain else None} for ki, k in enumerate(sw.depths)]
        table += cells
        top = max(cells, key=lambda c: c["tokens_per_s"])
        best.append({"batch_size": b, "depth": top["depth"]})
    return {"batches": sw.batch_sizes, "depths": sw.depths, "table": table, "best_depth": best}


def schedule_result(sw: RecordedSweep, schedule_name: str = "vLLM schedule") -> dict:
    """vLLM's schedule against its fixed depths, as the policies chapter's chart reads it (× plain decoding)."""
    rows = []
    named = [(f"k = {k}", [sw.tokens_per_s[bi][ki] for bi in range(len(sw.batch_sizes))])
             for ki, k in enumerate(sw.depths) if k > 0]
    if sw.schedule:
        named.append((schedule_name, sw.schedule["tokens_per_s"]))
    for name, series in named:
        for bi, b in enumerate(sw.batch_sizes):
            plain = _plain(sw, bi)
            rows.append({"policy": name, "batch_size": b, "tokens_per_s": series[bi],
                         "vs_plain": series[bi] / plain if plain else None})
    winners = []
    for b in sw.batch_sizes:
        mine = [r for r in rows if r["batch_size"] == b]
        if mine:
            winners.append({"batch_size": b, "policy": max(mine, key=lambda r: r["tokens_per_s"])["policy"]})
    return {"table": rows, "winners": winners}


def schedule_points(sw: RecordedSweep) -> list[dict]:
    """At each batch size: the schedule's tokens/s ÷ the best fixed depth's, which depth that was, and the
    depth the schedule actually drafted (from vLLM's /metrics)."""
    if not sw.schedule:
        return []
    out = []
    for bi, b in enumerate(sw.batch_sizes):
        fixed = [(sw.tokens_per_s[bi][ki], k) for ki, k in enumerate(sw.depths)]
        best_tps, best_k = max(fixed)
        out.append({"batch": b, "ratio": sw.schedule["tokens_per_s"][bi] / best_tps, "best_k": best_k,
                    "mean_depth": sw.schedule["mean_depth"][bi]})
    return out
