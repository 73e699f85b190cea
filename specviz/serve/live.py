"""The state of one live run in the browser: the control that sliders change, and the data the charts draw.

`LiveRuns` maps a browser session to its current run, so a slider event (another request, another
thread) finds the control of the generation that is streaming in that session."""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

from specviz import lessons, live_charts
from specviz.engine.request import StepEvent
from specviz.hardware.device import BEATEN, UNKNOWN_REGIMES, Peaks, Sample, Sampler, distrust, step_metrics
from specviz.hardware.passcurve import PassCurve
from specviz.hardware.roofline import ModelSpec, predicted_knee

TRAIL = 24               # steps the pass-time chart keeps as a faint trail behind the current one


class PassShape(NamedTuple):
    """One verify pass as the counters name it: the tokens it carried (rows + verified drafts), the
    tokens its path computed (a bucket's padding, a rectangle's holes), at which context."""
    real: int
    rows: int
    context: int
    computed: int


@dataclass
class LiveRun:
    control: object          # runner.LocalControl or runner.ControlFile: set(...), stop(), close()
    pair_label: str
    peaks: Peaks | None
    sampler: Sampler | None
    t0: float = field(default_factory=time.perf_counter)
    tps: live_charts.Series = field(default_factory=live_charts.Series)
    per_row: dict = field(default_factory=dict)
    util: live_charts.Series = field(default_factory=live_charts.Series)
    mbu: live_charts.Series = field(default_factory=live_charts.Series)
    mfu: live_charts.Series = field(default_factory=live_charts.Series)
    markers: list = field(default_factory=list)
    hist: list = field(default_factory=lambda: [0] * 17)
    recent: deque = field(default_factory=lambda: deque(maxlen=live_charts.SMOOTH_STEPS))
    regime: str = ""
    worker_sample: Sample | None = None    # the GPU worker's latest reading (ZeroGPU)
    worker_source: str | None = None
    spec: ModelSpec | None = None          # the target's shape, for the knee estimate
    last_pass: PassShape | None = None   # the latest verify pass: what it carried and computed
    path: str = ""                                  # the forward path that ran the latest step
    shared: bool = False                   # the run shares its batch with other users: chart the whole batch too
    shared_tps: live_charts.Series = field(default_factory=live_charts.Series)
    crowded: bool = False                  # a step shared its batch with another user: the whole batch is charted
    lang: str = lessons.DEFAULT_LANG       # the reader's language, for the charts' words
    curve: PassCurve | None = None         # this machine's pass-time curve (the knee chart), if known yet
    curve_of: Callable[[], PassCurve | None] | None = None   # asks again until a curve measured here arrives
    passes: deque = field(default_factory=lambda: deque(maxlen=TRAIL))   # live_charts.PassPoint of recent steps
    last_rows: tuple[int, int] = (0, 0)    # (rows, verified drafts) of the latest step's pass
    acceptance: float | None = None        # a synthetic Run's dial A (latest)
    rates: list = field(default_factory=list)   # the dial's A at each recorded step (synthetic Runs)
    lock: threading.Lock = field(default_factory=threading.Lock)   # record() and figures() race
    recorded: bool = False                 # a replay: its steps ran elsewhere, its readings are the recording's
    baseline: bool = False                 # a Run's plain baseline: Stop ends it, the sliders do not reach it
    beaten: str | None = None              # how far a pass ran past the calibrated peaks ("180%"): measured low
    ended: bool = False                    # its last step ran: later readings (its baseline's) are not its own

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def record(self, ev: StepEvent, rate: float | None = None) -> StepEvent:
        """Fold one step into the chart series (called by the generating thread); `rate`: the dial's A
        at this step (a synthetic Run). Returns the step as the Run keeps it: where the dial moved, a copy
        whose changes name the move (it reaches the engine outside them), so a saved Run replays its mark."""
        with self.lock:
            if rate is not None and self.rates and rate != self.rates[-1]:
                moved = lessons.Said("playground.chart.change_acceptance", old=f"{self.rates[-1]:g}", new=f"{rate:g}")
                ev = replace(ev, changes=[*ev.changes, moved])
            self._record(ev)
            if rate is not None:
                self.acceptance = rate
                self.rates.append(rate)
        return ev

    def _record(self, ev: StepEvent) -> None:
        now = self.elapsed()
        self.recent.append(ev)
        secs = sum(e.wall_s for e in self.recent)
        toks = sum(e.emitted for e in self.recent)
        self.tps.add(now, toks / secs if secs else None)
        if self.shared:
            self.crowded = self.crowded or ev.users > 1
            all_toks = sum(e.shared_emitted for e in self.recent)
            self.shared_tps.add(now, all_toks / secs if secs else None)
        for r in ev.rows:
            s = self.per_row.setdefault(r.row, live_charts.Series())
            s.add(now, len(r.emitted) / ev.wall_s if ev.wall_s else None)
            if r.drafted:
                self.hist[min(r.accepted, 16)] += 1
        if ev.changes:
            self.markers.append((now, list(ev.changes)))     # said in the chart's language
        m = step_metrics(ev.draft_flops + ev.target_flops, ev.draft_bytes + ev.target_bytes,
                         ev.draft_s + ev.verify_s, self.peaks)
        # a replay has no peaks of the machine it ran on: this machine's would name a wrong regime
        self.regime = "unrecorded" if self.recorded and self.peaks is None else m.regime
        most = max(m.mbu or 0.0, m.mfu or 0.0)
        if most > BEATEN and not self.recorded:
            self.beaten = f"{most:.0%}"             # the app measures them again after the Run
            distrust(self.peaks, self.beaten)        # and a start before that measures again too
        self.path = ev.path or self.path
        # the event names the tokens the pass carried and the shape the path computed (its padding); a
        # recording older than those fields has only the pass's width, unpadded then
        real = ev.real_tokens or ev.tokens_per_pass or ev.batch_size + ev.slots_verified
        self.last_pass = PassShape(real, ev.batch_size, ev.context, ev.padded_tokens or real)
        self.passes.append(live_charts.PassPoint(real, ev.padded_tokens or real, ev.verify_s))
        self.last_rows = (ev.batch_size, max(real - ev.batch_size, 0))
        self.mbu.add(now, None if m.mbu is None else 100 * m.mbu)
        self.mfu.add(now, None if m.mfu is None else 100 * m.mfu)

    def knee_for_counters(self) -> tuple[int | None, bool]:
        """(knee, measured): the pass-time chart's measured knee where it has one, so the counters and
        the chart below them name the same knee; else the roofline estimate (measured False)."""
        with self.lock:
            curve = self.curve
        knee = getattr(curve, "knee", None)
        if knee is not None and 0 < knee < float("inf"):
            return int(round(knee)), True
        return self.knee_estimate(), False

    def knee_estimate(self) -> int | None:
        """This device's roofline knee for the target at the latest step's context (an estimate), or
        None before calibration."""
        with self.lock:
            if self.last_pass is None or self.spec is None or self.peaks is None:
                return None
            return predicted_knee(self.spec, self.peaks.bandwidth, self.peaks.flops, max(self.last_pass.context, 1))

    def sample_dicts(self) -> list[dict]:
        """The hardware readings of this run (for a recording)."""
        with self.lock:
            src = [self.worker_sample] if self.worker_source is not None and self.worker_sample else \
                (self.sampler.recent(self.elapsed() + 1.0) if self.sampler is not None else [])
            return [dict(t=s.t, util=s.util, memory=s.memory, power=s.power, source=s.source) for s in src if s]

    def csv_rows(self) -> list[dict]:
        """Every chart's data in long form (chart, series, x, y): the 'Download CSV' file."""
        with self.lock:
            out = []
            series = [("throughput", "your rows", self.tps), ("throughput", "whole shared batch", self.shared_tps),
                      ("hardware", "utilisation %", self.util), ("hardware", "MBU % (estimate)", self.mbu),
                      ("hardware", "MFU % (estimate)", self.mfu)]
            series += [("throughput", f"row {r + 1}", s) for r, s in sorted(self.per_row.items())]
            for chart, name, s in series:
                out += [{"chart": chart, "series": name, "x": x, "y": y} for x, y in zip(s.x, s.y)]
            out += [{"chart": "acceptance", "series": "rows with this many drafts accepted", "x": i, "y": n}
                    for i, n in enumerate(self.hist)]
            return out

    def feed(self, samples: list[Sample], source: str | None, peaks: Peaks | None,
             spec: ModelSpec | None = None) -> None:
        """Hardware readings and peaks streamed from a GPU worker (the main process cannot read it)."""
        with self.lock:
            if spec is not None:
                self.spec = spec
            if source is not None:
                self.worker_source = source
            if samples:
                self.worker_sample = samples[-1]
            if peaks is not None:
                self.peaks = peaks

    def replay_sample(self, sample: Sample) -> None:
        """A recorded hardware reading, shown as this replay's latest (the chart's utilisation line)."""
        with self.lock:
            self.worker_sample = sample
            self.worker_source = sample.source
            self.util.add(self.elapsed(), sample.util)

    def figures(self, read: bool = True):
        """The three live figures (the chart timer's thread asks twice a second; a Run's last frame and the
        language switch ask too). `read`: the latest hardware reading joins the chart first (not when a
        finished Run is drawn again: it ran then)."""
        with self.lock:
            latest = self._latest_sample() if read and not self.ended else None
            if latest is not None:
                self.util.add(self.elapsed(), latest.util)
            return self._figures()

    def end(self) -> None:
        """Its last step ran: the hardware line stops there (the plain baseline that follows it, on the
        same machine, drew its own readings into this Run's chart for seconds after it)."""
        with self.lock:
            self.ended = True

    def latest_sample(self) -> Sample | None:
        with self.lock:
            return self._latest_sample()

    def _latest_sample(self) -> Sample | None:
        if self.worker_source is not None:
            return self.worker_sample
        if self.sampler is not None:
            recent = self.sampler.recent(1.0)
            return recent[-1] if recent else None
        return None

    def _source(self) -> str:
        if self.worker_source is not None:
            return self.worker_source
        return self.sampler.source if self.sampler else "none"

    def _figures(self):
        labels = live_labels(self.lang)
        util_label = labels["util_" + self._source()] if self._source() in ("nvml", "psutil") else labels["util_none"]
        rtl = lessons.direction(self.lang) == "rtl"
        markers = [(x, [_marker(self.lang, c) for c in changes])
                   for x, changes in self.markers[-live_charts.MARKERS_SHOWN:]]
        shared = self.shared_tps if self.shared and self.crowded else None
        span = live_charts.time_range([self.tps, *self.per_row.values(), *([shared] if shared else []),
                                       self.util, self.mbu, self.mfu])
        return (live_charts.throughput_figure(self.tps, self.per_row, markers, shared=shared, labels=labels, rtl=rtl,
                                              x_range=span, comparison=self.baseline),
                live_charts.hardware_figure(self.util, self.mbu, self.mfu, util_label, labels=labels, rtl=rtl,
                                            x_range=span, comparison=self.baseline),
                live_charts.acceptance_histogram(self.hist[: max(2, _last_nonzero(self.hist) + 2)], labels=labels,
                                                 rtl=rtl))


    def current_curve(self) -> PassCurve | None:
        """The pass-time curve: the one measured here once it is (a recorded one, or none, until then)."""
        with self.lock:
            return self._refresh_curve()

    def _refresh_curve(self) -> PassCurve | None:
        if (self.curve is None or self.curve.recorded) and self.curve_of is not None:
            self.curve = self.curve_of() or self.curve
        return self.curve

    def knee_figure(self):
        """The pass-time chart: the curve, its knee and where the latest step sits (the timer's 4th chart)."""
        with self.lock:
            labels, curve = live_labels(self.lang), self._refresh_curve()
            steps = list(self.passes)
            name, knee = labels["curve_pending"], None
            if curve is not None:
                key = "curve_recorded" if curve.recorded else "curve_measured"
                name = lessons.chart_fill(labels[key], dict(context=curve.context, device=curve.device,
                                                           name=curve.recorded))
                knee = curve.knee
            rtl = lessons.direction(self.lang) == "rtl"
            return live_charts.knee_live_figure(None if curve is None else (list(curve.tokens), list(curve.seconds)),
                                                name, knee, steps, self._step_label(labels, knee), labels, rtl,
                                                comparison=self.baseline)

    def _step_label(self, labels: dict, knee: float | None) -> str:
        """ "this step: 48 tokens per pass (16 rows + 32 verified drafts) · past the knee · compute-bound"."""
        if not self.passes:
            return ""
        n, (rows, drafts) = self.passes[-1].real, self.last_rows
        # a count and its noun ("1 row", "2 rows"); a Persian one keeps its number left-to-right
        say = lessons.text_bidi if lessons.direction(self.lang) == "rtl" else lessons.text
        parts = [lessons.chart_fill(labels["this_step_one" if n == 1 else "this_step"], dict(n=n)),
                 lessons.chart_fill(labels["step_parts"], dict(rows=say(self.lang, "app.n_rows", n=rows),
                                                               drafts=say(self.lang, "app.n_drafts_verified", n=drafts)))]
        if knee is not None and 0 < knee < float("inf"):
            # the knee as the legend and the counters name it, rounded: the raw one put a step past the
            # knee here that the counters placed at it
            k = round(knee)
            parts.append(labels["below_knee" if n < k else "at_knee" if n == k else "past_knee"])
        if self.regime:
            name = f"playground.regime_name.{self.regime}"
            has = lessons.template("en", name) != name
            shown = lessons.text(self.lang, name) if has else self.regime
            # the regime comes from the roofline (model shape against calibrated peaks), the knee beside it
            # from the measured curve: the two can disagree, and the label says which is which
            if self.regime not in UNKNOWN_REGIMES:
                shown = lessons.text(self.lang, "playground.chart.regime_estimate", regime=shown)
            parts.append(lessons.isolate_rtl(shown))
        return " · ".join(parts)


SHORT_MARKS = {"playground.chart.change_depth": "k", "playground.chart.change_batch": "B",
               "playground.chart.change_acceptance": "A"}


def _marker(lang: str, change) -> tuple[str, str]:
    """A knob change as the throughput chart marks it: (its short label, written up the plot, where a
    sentence did not fit a phone's plot; its sentence, on hover)."""
    full = lessons.say(lang, change)
    key, values = getattr(change, "key", None), getattr(change, "values", {})
    if key in SHORT_MARKS:
        return f"{SHORT_MARKS[key]}={values['new']}", full
    if key == "playground.chart.change_policy":
        return lessons.say(lang, values["new"]), full
    return full, full


def live_labels(lang: str) -> dict:
    """The live charts' words in `lang` ([playground.chart]); a Persian label is right-to-left as a whole,
    since plotly lays its text out left-to-right."""
    keys = [*live_charts.LIVE_LABELS, "util_nvml", "util_psutil", "util_none", "below_knee", "at_knee", "past_knee"]
    return {k: lessons.isolate_rtl(lessons.text(lang, f"playground.chart.{k}")) for k in keys}


def _last_nonzero(xs: list[int]) -> int:
    return max([i for i, x in enumerate(xs) if x] + [0])


STOP_MEMORY_S = 5.0      # a Stop with no Run to stop yet waits this long for one (API: /stop before /generate starts)
# a press whose handler never started nor ended (its request dropped in the queue) counts this long
ARM_MEMORY_S = 60.0


def _seq(value) -> int | None:
    """A press number from the page (1, 2, …; 0 when its Run was never pressed, sent as -1); None for
    an API call, which sends none (0, the default)."""
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if n == 0 else max(n, 0)


ENDED_KEEP = 256      # ended Runs whose last pass-time chart no timer has drawn yet (one a tab)


class LiveRuns:
    """Session id → its current LiveRun, and the Stops that arrived before their Run did.

    A Run's life in a session: `arm` (the Run button was pressed; the UI calls it at once, before the
    queued handler starts), then `start` (the run streams) or `end` (it never did). A Stop before
    `start` is kept as a pending stop: the Run checks it (`stopped_early`) before it asks for rows, and
    `start` applies one that lands in between.

    The page numbers its presses of Run (1, 2, …) and a Stop names the newest one, because the two
    clicks travel as separate requests and may arrive in either order: a Stop for press n stops Run n
    whether it lands before or after Run n's arm, and never a later Run. An API client sends no number:
    its Stop with no Run in sight is kept for STOP_MEMORY_S, unless a Run is armed after it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._runs: dict[str, LiveRun] = {}
        self._armed: dict[str, tuple[float, int | None]] = {}   # session → (when, press number) of its Run
        self._stops: dict[str, tuple[float, int | None]] = {}   # session → (when, press number) of a pending Stop
        self._ended: dict[str, LiveRun] = {}     # session → its Run that ended, until the chart timer draws it

    def arm(self, session: str, seq=None) -> None:
        with self._lock:
            self._forget_old()
            self._armed[session] = (time.monotonic(), _seq(seq))

    def stop(self, session: str, seq=None) -> bool:
        """Stop the session's Run, or the one about to start. True when a streaming run was stopped."""
        with self._lock:
            run, n = self._runs.get(session), _seq(seq)
            if run is None or n is not None:     # a numbered Stop may name a Run not streaming yet
                self._forget_old()
                self._stops[session] = (time.monotonic(), n)
        if run is not None:
            run.control.stop()
        return run is not None

    def stopped_early(self, session: str) -> bool:
        """A Stop arrived for this session's Run before it started streaming (consumed here)."""
        with self._lock:
            return self._take_stop(session)

    def _take_stop(self, session: str, consume: bool = True) -> bool:
        stop = self._stops.pop(session, None) if consume else self._stops.get(session)
        armed = self._armed.get(session)
        if stop is None:
            return False
        (at, n), (armed_at, armed_n) = stop, armed or (None, None)
        if n is not None and armed_n is not None:
            return n >= armed_n                  # the page said which press it stops
        if armed_at is not None:
            return at >= armed_at                # a Stop before this press was meant for nothing
        return time.monotonic() - at < STOP_MEMORY_S

    def start(self, session: str, run: LiveRun) -> None:
        with self._lock:
            old = self._runs.get(session)
            self._runs[session] = run
            self._ended.pop(session, None)
            stop_now = self._take_stop(session)
            self._armed.pop(session, None)
        if old is not None:
            old.control.stop()         # a new Run in the same tab replaces the old one
        if stop_now:
            run.control.stop()

    def end(self, session: str) -> None:
        """A Run's handler ended before it streamed (refused, stopped early)."""
        with self._lock:
            self._armed.pop(session, None)

    def _forget_old(self) -> None:
        """Stops and arms older than a minute mean nothing any more (bounded in a long-running class)."""
        now = time.monotonic()
        for table in (self._stops, self._armed):
            for k in [k for k, (t, _) in table.items() if now - t > ARM_MEMORY_S]:
                del table[k]

    def touch(self, session: str) -> None:
        """The session's Run handler is alive (loading, waiting for the warm-up): its press stays armed
        past ARM_MEMORY_S, which only forgets presses whose request never came or whose handler died."""
        with self._lock:
            armed = self._armed.get(session)
            if armed is not None:
                self._armed[session] = (time.monotonic(), armed[1])

    def get(self, session: str) -> LiveRun | None:
        with self._lock:
            return self._runs.get(session)

    def armed(self, session: str) -> bool:
        """Run was pressed and its handler has neither streamed nor ended (it loads or waits in the queue),
        within ARM_MEMORY_S: a press whose request was dropped must not hold the session's check for good."""
        with self._lock:
            armed = self._armed.get(session)
            return armed is not None and time.monotonic() - armed[0] <= ARM_MEMORY_S

    def finish(self, session: str, run: LiveRun) -> None:
        with self._lock:
            if self._runs.get(session) is run:
                del self._runs[session]
                # the chart timer draws its pass-time chart once more: the Run may end between two ticks
                self._draw_once(session, run)

    def follow(self, session: str, run: LiveRun) -> None:
        """A run that belongs to the session's Run that just ended (its plain-decoding baseline): Stop stops
        it and the chart timer draws it; a Stop that landed since the Run ended stops it too. Presses armed
        and Stops pending stay for the next Run; a Run of the session streaming already keeps its place."""
        with self._lock:
            if session in self._runs:
                return
            self._runs[session] = run
            stop_now = self._take_stop(session, consume=False)
        if stop_now:
            run.control.stop()

    def draw_once(self, session: str, run: LiveRun) -> None:
        """The chart timer draws `run`'s pass-time chart once more (a Run's, after its baseline drew its own)."""
        with self._lock:
            self._draw_once(session, run)

    def _draw_once(self, session: str, run: LiveRun) -> None:
        self._ended.pop(session, None)
        self._ended[session] = run
        while len(self._ended) > ENDED_KEEP:       # tabs closed before their next tick
            del self._ended[next(iter(self._ended))]

    def take_ended(self, session: str) -> LiveRun | None:
        """The session's Run that ended since the timer last asked (once), or None."""
        with self._lock:
            return self._ended.pop(session, None)
