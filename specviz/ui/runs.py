"""What the playground keeps of a finished Run, per session: its chart data (CSV), its recording (JSON),
and what the lossless check needs. Also replaying a recording through the same views, and the check.

Each session's last run belongs to that session only; files go to this app's own temporary folder.
"""
from __future__ import annotations

import atexit
import collections
import csv
import html
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import gradio as gr
from gradio.utils import get_upload_folder

from specviz import lessons
from specviz.engine.divergence import DivergenceReport, check_against_target, rule_said
from specviz.serve import recordings
from specviz.serve.catalog import known_label
from specviz.hardware.device import Sample, machine_name
from specviz.serve.live import LiveRun
from specviz.serve.recordings import Recording
from specviz.ui.errors import error
from specviz.ui.i18n import t
from specviz.ui.shown import Shown, keep_newest

LOSSLESS_ROWS = 8       # rows the lossless check decodes again (each one a plain decode of the target)
REPLAY_MAX_GAP_S = 2.0  # a replay never waits longer than this between two steps
KEEP_RUNS = 500         # sessions whose last finished Run is kept (lossless check, downloads)
REPLAY_AT_ONCE = 48     # replays playing at once (each holds a worker thread while it sleeps between steps)
REPLAY_MAX_S = 90.0     # a replay plays at most this long: a longer recording plays faster (and says so)


@dataclass
class FinishedRun:
    choice: object
    prompt_text: str
    req: object              # runner.RunRequest
    result: dict
    csv_path: str
    recording_path: str


class TempFiles:
    """Unique file names in this app's own temporary folder (downloads: CSV, recordings). The newest
    `keep` files stay (a student downloads a file soon after a Run); older ones are deleted, and the
    folder goes when the app exits, so a long-running classroom server does not fill its disk."""

    def __init__(self, keep: int = 1000):
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="specviz-files-")
        self._n = 0
        self._made: collections.deque[str] = collections.deque()
        self._keep = keep
        atexit.register(shutil.rmtree, self._dir, True)

    def path(self, stem: str, ext: str) -> str:
        with self._lock:
            self._n += 1
            path = os.path.join(self._dir, f"{stem}-{self._n}.{ext}")
            self._made.append(path)
            old = self._made.popleft() if len(self._made) > self._keep else None
        if old is not None:
            try:
                os.remove(old)
            except OSError:
                pass
        return path


UNKNOWN_DEVICE = "unknown device"       # what a recording says when no calibration named the device


def _device(name: str):
    return lessons.Key("playground.unknown_device") if name == UNKNOWN_DEVICE else name


def replay_title(lang: str, rec) -> str:
    """A recording's title (`Recording.title` is its English) in the reader's language; a Persian one
    isolated right-to-left, since the dropdown lays its text out left-to-right."""
    said = lessons.Said("playground.replay_title", pair=known_label(rec.pair), prompt=rec.prompt[:40],
                        device=_device(rec.device), date=rec.date[:16].replace("T", " "))
    text = lessons.say(lang, said)
    return lessons.isolate_ltr(lessons.isolate_rtl(text)) if lessons.direction(lang) == "rtl" else text


class RunStore:
    def __init__(self):
        self._lock = threading.Lock()
        self._last: dict[str, FinishedRun] = {}
        self._replayed: dict[str, None] = {}      # sessions whose page shows a replay, not their last Run
        self._presses: dict[str, int] = {}        # Run and Replay presses a session made (see pressed)
        self._files = TempFiles()
        self._replaying = 0
        self._uploads = UploadSweeper(float(os.environ.get("SPECVIZ_UPLOAD_KEEP_S", "") or 60.0))

    @contextmanager
    def replay_slot(self, lang: str):
        """A replay is light (it mostly sleeps), so it never queues behind others; only a flood of them
        at once is refused, with a sentence, to keep worker threads for Runs."""
        with self._lock:
            if self._replaying >= REPLAY_AT_ONCE:
                raise gr.Error(t(lang, "playground.replays_busy", limit=REPLAY_AT_ONCE), print_exception=False)
            self._replaying += 1
        try:
            yield
        finally:
            with self._lock:
                self._replaying -= 1

    def _path(self, stem: str, ext: str) -> str:
        return self._files.path(stem, ext)

    # --- after a Run ----------------------------------------------------------------------------------
    def finish(self, session: str, choice, prompt_text: str, req, result: dict, parts: dict,
               live: LiveRun) -> FinishedRun:
        csv_path = self._path("specviz-chart-data", "csv")
        write_csv(csv_path, live.csv_rows())
        device = machine_name(live.peaks.device) if live.peaks is not None else UNKNOWN_DEVICE
        rec = Recording(device=device, date=recordings.now_iso(), pair=choice.label, prompt=prompt_text,
                        settings={"batch": req.batch, "depth": req.depth, "policy": req.policy.name,
                                  "threshold": req.policy.threshold, "temperature": req.temperature, "max_new": req.max_new,
                                  "acceptance": req.acceptance},      # a synthetic Run's dial A (None otherwise)
                        steps=parts["steps"], samples=parts["samples"], totals=parts["totals"],
                        outputs=parts["outputs"], prompt_ids=result["prompt_ids"], versions=recordings.versions())
        rec_path = self._path("specviz-run", "json")
        with open(rec_path, "w", encoding="utf-8") as f:
            f.write(rec.to_json())
        run = FinishedRun(choice, prompt_text, req, result, csv_path, rec_path)
        with self._lock:
            keep_newest(self._last, session, run, KEEP_RUNS)
            self._replayed.pop(session, None)
        return run

    def replayed(self, session: str) -> None:
        """The page now shows a recording: the lossless check must not answer for the Run before it."""
        self.pressed(session)
        with self._lock:
            keep_newest(self._replayed, session, None, KEEP_RUNS)

    def pressed(self, session: str) -> None:
        """Run or Replay pressed: a lossless check still under way speaks of what the page showed before."""
        with self._lock:
            keep_newest(self._presses, session, self._presses.get(session, 0) + 1, KEEP_RUNS)

    def _presses_of(self, session: str) -> int:
        with self._lock:
            return self._presses.get(session, 0)

    def last(self, session: str) -> FinishedRun | None:
        with self._lock:
            return self._last.get(session)

    # --- replay ---------------------------------------------------------------------------------------
    def shipped_options(self, lang: str) -> list[tuple[str, str]]:
        """(shown, value) for the recordings dropdown: the title in the reader's language, the English
        title (what the API takes) as value."""
        return [(replay_title(lang, recordings.load(path)), title) for title, path in recordings.shipped().items()]

    def open_recording(self, title, upload, lang: str = lessons.DEFAULT_LANG) -> Recording:
        """The uploaded recording (read, checked, then its file deleted) or a shipped one by title."""
        path = _upload_path(upload)
        if path is None:
            path = recordings.shipped().get(title) if isinstance(title, str) else None
            if path is None:
                raise error(lang, "errors.pick_recording")
            return recordings.load(path)
        try:
            return recordings.load(path)
        finally:
            self._uploads.discard_later(path)

    def play(self, rec: Recording, app, lang_now: Callable[[], str], session: str, streamer_cls, pack,
             keep: Callable[[Shown], object] = lambda shown: None):
        """Replay a recording through the same views at its recorded pace, labelled with its origin, in the
        reader's language (`lang_now()`, asked as it plays). It is the tab's live run meanwhile: the chart
        timer draws it, and Stop ends it. Its last frame (ui.shown.Shown) goes to `keep` before it is sent."""
        control = _ReplayControl()
        live = LiveRun(control, rec.pair, None, None, shared=False, lang=lang_now(), recorded=True)
        live.worker_source = "recording"
        app.runs.start(session, live)
        try:
            yield from self._play(rec, app, lang_now, session, streamer_cls, pack, live, control, keep)
        finally:
            app.runs.finish(session, live)

    def _play(self, rec, app, lang_now, session, streamer_cls, pack, live, control, keep):
        streamer = streamer_cls(app, live, _NoTokenizer(), session, live.lang)
        readings = _readings_by_step_time(rec)
        speed = replay_speed(rec)
        yield pack(status=_replay_status(live.lang, rec, speed))
        start, last_yield, due, prev = time.perf_counter(), 0.0, 0.0, 0.0
        for at, ev, pieces in rec.steps:
            due += min(max(at - prev, 0.0), REPLAY_MAX_GAP_S) / speed       # when this step is shown
            prev = at
            wait = due - (time.perf_counter() - start)
            if wait > 0 and control.stopped.wait(wait):
                break
            if control.stopped.is_set():
                break
            while readings and readings[0][0] <= at:
                live.replay_sample(readings.pop(0)[1])
            live.record(ev)
            streamer.add(ev, pieces)
            if time.perf_counter() - last_yield >= 0.2:
                last_yield = time.perf_counter()
                was = streamer.lang
                lang = streamer.follow(lang_now())
                status = _replay_status(lang, rec, speed) if lang != was else None     # the reader switched
                yield streamer.outputs(rec.totals, zero_gpu=False, status=status)
        stopped = control.stopped.is_set()
        result = {"done": True, "replay": True, "stopped": stopped, "recorded_on": rec.device, "date": rec.date,
                  "pair": rec.pair, "prompt_ids": rec.prompt_ids,
                  "outputs": [rec.outputs[i] for i in sorted(rec.outputs)], **rec.totals.as_dict()}

        def draw(lang: str, read: bool = False, **first) -> tuple:
            """The replay's last frame in `lang`: as it ends, and again at a language switch."""
            streamer.follow(lang)
            # the line says it ended, as a Run's "Done." does (it read the same while playing and after)
            end = (t(lang, "playground.replay_stopped") if stopped
                   else t(lang, "playground.replay_done", tokens=rec.totals.tokens))
            return streamer.outputs(rec.totals, final=True, status=end + " · " + _replay_status(lang, rec, speed, True),
                                    zero_gpu=False, read=read, **first)
        shown = Shown(draw, live, lang_now, streamer.row_steps())
        keep(shown)
        yield shown.draw(read=True, result=result)

    # --- lossless check -------------------------------------------------------------------------------
    def check_lossless(self, session: str, app, lang: str) -> Callable[[str], str] | None:
        """Every row (up to LOSSLESS_ROWS) against the target decoding its prompt alone: "identical", or per
        row the first divergence judged by the one near-tie rule (engine.divergence); a bug reads red. The
        answer in any language (`lang`: the sentences of a check that could not start, and loading's). None:
        Run or Replay was pressed while it decoded, so its answer would sit under a run it never checked."""
        presses = self._presses_of(session)
        with self._lock:
            replay = session in self._replayed
        if replay:
            return _said("playground.lossless_replay")
        if app.runs.get(session) is not None or app.runs.armed(session):     # a Run going, or about to
            return _said("playground.lossless_running")
        run = self.last(session)
        if run is None or not run.result.get("outputs"):
            return _said("playground.lossless_none")
        if run.req.temperature > 0:
            return _said("app.lossless_needs_greedy")
        if app.runner.zero_gpu:
            return lambda lang: lessons.say(lang, lessons.Said("errors.lossless_zerogpu"))
        pair = app.load(run.choice, lang)
        prompts = [list(p) for p in run.result["prompt_ids"]][:LOSSLESS_ROWS]
        ours = [list(o) for o in run.result["outputs"]][:LOSSLESS_ROWS]
        target = pair.target
        report = check_against_target(target.model, target.device, target.eos_ids, prompts, ours)
        if self._presses_of(session) != presses:
            return None
        return lambda lang: lossless_md(lang, report, len(run.result["outputs"]), pair.tokenizer.decode)


def _said(key: str) -> Callable[[str], str]:
    return lambda lang: lessons.text(lang, key)


def lossless_md(lang: str, report: DivergenceReport, rows: int, decode) -> str:
    """The check's answer in the reader's language: one line for identical output, else one per diverging
    row (a bug in red), the near-tie explanation and the rule."""
    if report.identical:
        parts = [t(lang, "app.lossless_identical", n=report.tokens)]
    else:
        parts = []
        for d in report.divergences:
            line = html.escape(lessons.say(lang, d.said(decode)))
            parts.append(line if d.near_tie else f'<span class="sv-bug">{line}</span>')
        if any(d.near_tie for d in report.divergences):
            parts.append(lessons.text(lang, "app.lossless_near_tie"))
        parts.append(lessons.say(lang, rule_said()))
    if rows > report.rows:
        parts.append(t(lang, "lossless.rows_checked", checked=report.rows, rows=rows))
    return "\n\n".join(parts)


def write_csv(path: str, rows: list[dict]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r)) or ["chart"]     # first-seen column order
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


class _NoTokenizer:
    """A replay shows the texts recorded with each step; nothing is decoded."""

    def decode(self, ids, skip_special_tokens=False) -> str:
        return ""


class _ReplayControl:
    """A replay's knobs: Stop ends it; the sliders play no part in a recording."""

    def __init__(self):
        self.stopped = threading.Event()

    def stop(self):
        self.stopped.set()

    def close(self):
        pass

    def set(self, **_):
        pass


def _replay_status(lang: str, rec: Recording, speed: float, ended: bool = False) -> str:
    """Where and when the recording was made, and how much faster than recorded it plays; `ended`: after
    the line that says the replay ended (which names it a replay already)."""
    key = "playground.replay_origin" if ended else "playground.status_replay"
    status = t(lang, key, device=_device(rec.device), date=rec.date[:16].replace("T", " "), pair=known_label(rec.pair))
    settings = _replay_settings(lang, rec)
    if settings:
        status += " · " + settings
    if speed > 1:
        status += " · " + t(lang, "playground.replay_faster", speed=round(speed, 1), limit=int(REPLAY_MAX_S))
    return status


REPLAY_PROMPT_CHARS = 60


def _replay_settings(lang: str, rec: Recording) -> str:
    """What the recorded Run was asked (its prompt, batch, depth, tokens): a replay leaves the page's own
    controls as they are, and a reader who replayed their saved file could not tell which run played."""
    s = rec.settings if isinstance(rec.settings, dict) else {}
    if not all(isinstance(s.get(k), (int, float)) for k in ("batch", "depth", "max_new")):
        return ""                  # a recording from before its settings were kept
    prompt = " ".join(rec.prompt.split())
    if len(prompt) > REPLAY_PROMPT_CHARS:
        prompt = prompt[:REPLAY_PROMPT_CHARS - 1].rstrip() + "…"
    return t(lang, "playground.replay_settings", prompt=prompt, batch=int(s["batch"]), depth=int(s["depth"]),
             max_new=int(s["max_new"]))


def _readings_by_step_time(rec: Recording) -> list[tuple[float, Sample]]:
    """The recording's hardware readings on its steps' clock (seconds since the run began), oldest first.
    The readings carry wall-clock times and end with the run, so the last one sits at the last step."""
    samples = [s for s in rec.samples if isinstance(s, dict) and isinstance(s.get("t"), (int, float))]
    if not samples or not rec.steps:
        return []
    end = samples[-1]["t"]
    last_at = rec.steps[-1][0]
    timed = [(last_at - (end - s["t"]), Sample(s["t"], s.get("util"), s.get("memory"), s.get("power"),
                                               str(s.get("source") or "recording"))) for s in samples]
    # the readings begin a second before the run: keep the last of those, as the reading at its start
    before = [r for r in timed if r[0] < 0]
    return before[-1:] + [r for r in timed if r[0] >= 0]


def replay_speed(rec: Recording) -> float:
    """How much faster than recorded a replay plays so that it ends within REPLAY_MAX_S. Each gap between
    two steps is first capped at REPLAY_MAX_GAP_S (a pause in the recording is not worth watching)."""
    paced, prev = 0.0, 0.0
    for at, _, _ in rec.steps:
        paced += min(max(at - prev, 0.0), REPLAY_MAX_GAP_S)
        prev = at
    return max(1.0, paced / REPLAY_MAX_S)


class UploadSweeper:
    """Uploaded recordings are deleted once read — a little later, not at once: gradio stores an upload
    under its content's hash, so thirty students uploading the teacher's file share one path, and the
    first replay must not delete it under the others. One daemon thread deletes what is due."""

    def __init__(self, delay_s: float = 60.0):
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._due: dict[str, float] = {}
        self._thread: threading.Thread | None = None

    def discard_later(self, path: str) -> None:
        real = os.path.realpath(path)
        if not real.startswith(os.path.realpath(get_upload_folder()) + os.sep):
            return                      # only files gradio received; never anything else on the disk
        with self._lock:
            self._due[real] = time.monotonic() + self.delay_s
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="specviz-uploads", daemon=True)
                self._thread.start()

    def sweep(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        with self._lock:
            due = [p for p, t in self._due.items() if t <= now]
            for p in due:
                del self._due[p]
        for p in due:
            try:
                os.remove(p)
            except OSError:
                pass
        return len(due)

    def _run(self) -> None:
        while True:
            time.sleep(min(5.0, self.delay_s))
            self.sweep()


def _upload_path(upload) -> str | None:
    if upload is None:
        return None
    if isinstance(upload, str):
        return upload
    if isinstance(upload, dict):
        return upload.get("path") or upload.get("name")
    return getattr(upload, "name", None) or getattr(upload, "path", None)
