"""What one chart tick costs the server for one watching page: the Playground's four live figures built
and turned into JSON, as the timer does it for every page during a Run (full series: 8 rows × 300 steps).
Beside it, the same figures put through plotly's property checks (what building them with
plotly.graph_objects costs), paired in one run. Usage: .venv/bin/python scripts/chart-tick-cost.py"""
from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import plotly.graph_objects as go  # noqa: E402

from specviz import live_charts as lc  # noqa: E402
from specviz.serve.live import live_labels  # noqa: E402

ROUNDS = 40


def series(n: int, scale: float) -> lc.Series:
    s = lc.Series()
    for i in range(n):
        s.add(i * 0.05 + random.random() * 0.01, scale * (0.5 + random.random()))
    return s


def tick(checked: bool) -> int:
    labels = live_labels("en")
    marks = [(3.0, [("k=2", "depth 4→2")]), (9.0, [("k=0", "depth 2→0")])]
    figs = [lc.throughput_figure(series(300, 900), {r: series(300, 200) for r in range(8)}, marks,
                                 shared=series(300, 1000), labels=labels),
            lc.hardware_figure(series(300, 90), series(300, 5), series(300, 3), "CPU busy", labels=labels),
            lc.acceptance_histogram([300, 120, 40, 12, 3, 0], labels=labels),
            lc.knee_live_figure(([1, 2, 4, 8, 16, 32, 64], [0.004] * 5 + [0.006, 0.011]), "curve", 32.0,
                                [lc.PassPoint(9, 9, 0.0041)] * 30, "this step", labels)]
    if checked:
        figs = [go.Figure(f.to_plotly_json()) for f in figs]
    return sum(len(f.to_json()) for f in figs)


def main() -> None:
    random.seed(0)
    times = {False: [], True: []}
    for _ in range(3):
        tick(False), tick(True)                        # warm-up
    for _ in range(ROUNDS):
        for checked in (False, True):                  # paired, alternating
            t = time.perf_counter()
            size = tick(checked)
            times[checked].append(time.perf_counter() - t)
    fast, slow = statistics.median(times[False]), statistics.median(times[True])
    print(f"one tick, 4 figures + JSON ({size / 1000:.0f} kB): unchecked {1000 * fast:.1f} ms, "
          f"with plotly's checks {1000 * slow:.1f} ms ({slow / fast:.1f}×), medians of {ROUNDS}")


if __name__ == "__main__":
    main()
