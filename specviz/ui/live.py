"""The state of one live run in the browser: knobs that sliders change, and the data the charts draw.

`LiveRuns` maps a browser session to its current run, so a slider event (another request, another
thread) finds the knobs of the generation that is streaming in that session."""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from specviz import charts
from specviz.engine import Knobs, StepEvent
from specviz.hardware import Peaks, Sampler, step_metrics


@dataclass
class LiveRun:
    knobs: Knobs
    pair_label: str
    peaks: Peaks | None
    sampler: Sampler | None
    t0: float = field(default_factory=time.perf_counter)
    tps: charts.Series = field(default_factory=charts.Series)
    per_row: dict = field(default_factory=dict)
    util: charts.Series = field(default_factory=charts.Series)
    mbu: charts.Series = field(default_factory=charts.Series)
    mfu: charts.Series = field(default_factory=charts.Series)
    markers: list = field(default_factory=list)
    hist: list = field(default_factory=lambda: [0] * 17)
    recent: deque = field(default_factory=lambda: deque(maxlen=6))
    regime: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)   # record() and figures() race

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def record(self, ev: StepEvent) -> None:
        """Fold one step into the chart series (called by the generating thread)."""
        with self.lock:
            self._record(ev)

    def _record(self, ev: StepEvent) -> None:
        now = self.elapsed()
        self.recent.append(ev)
        secs = sum(e.wall_s for e in self.recent)
        toks = sum(e.emitted for e in self.recent)
        self.tps.add(now, toks / secs if secs else None)
        for r in ev.rows:
            s = self.per_row.setdefault(r.row, charts.Series())
            s.add(now, len(r.emitted) / ev.wall_s if ev.wall_s else None)
            if r.drafted:
                self.hist[min(r.accepted, 16)] += 1
        if ev.changes:
            self.markers.append((now, ", ".join(ev.changes)))
        m = step_metrics(ev.draft_flops + ev.target_flops, ev.draft_bytes + ev.target_bytes,
                         ev.draft_s + ev.verify_s, self.peaks)
        self.regime = m.regime
        self.mbu.add(now, None if m.mbu is None else 100 * m.mbu)
        self.mfu.add(now, None if m.mfu is None else 100 * m.mfu)

    def figures(self):
        """The three live figures (called by the chart timer's thread, ~4 times a second)."""
        with self.lock:
            if self.sampler is not None:
                latest = self.sampler.recent(1.0)
                if latest:
                    self.util.add(self.elapsed(), latest[-1].util)
            return self._figures()

    def _figures(self):
        util_label = {"nvml": "GPU busy (NVML)", "psutil": "CPU busy (psutil)"}.get(
            self.sampler.source if self.sampler else "none", "utilisation unavailable")
        return (charts.throughput_figure(self.tps, self.per_row, self.markers),
                charts.hardware_figure(self.util, self.mbu, self.mfu, util_label),
                charts.acceptance_histogram(self.hist[: max(2, _last_nonzero(self.hist) + 2)]))


def _last_nonzero(xs: list[int]) -> int:
    return max([i for i, x in enumerate(xs) if x] + [0])


class LiveRuns:
    """Session id → its current LiveRun; plain-decoding baselines measured in this app's lifetime."""

    def __init__(self):
        self._lock = threading.Lock()
        self._runs: dict[str, LiveRun] = {}
        self._baseline: dict[tuple[str, int], float] = {}

    def start(self, session: str, run: LiveRun) -> None:
        with self._lock:
            old = self._runs.get(session)
            if old is not None:
                old.knobs.stop.set()       # a new Run in the same tab replaces the old one
            self._runs[session] = run

    def get(self, session: str) -> LiveRun | None:
        with self._lock:
            return self._runs.get(session)

    def finish(self, session: str, run: LiveRun) -> None:
        with self._lock:
            if self._runs.get(session) is run:
                del self._runs[session]

    def note_plain(self, pair: str, batch: int, tps: float) -> None:
        """Remember plain (depth 0) throughput at this batch size, smoothed."""
        with self._lock:
            old = self._baseline.get((pair, batch))
            self._baseline[(pair, batch)] = tps if old is None else 0.7 * old + 0.3 * tps

    def plain(self, pair: str, batch: int) -> float | None:
        with self._lock:
            return self._baseline.get((pair, batch))
