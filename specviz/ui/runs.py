"""What the playground keeps of a finished Run, per session: its chart data (CSV), its recording (JSON),
and what the lossless check needs. Also replaying a recording through the same views, and the check.

Each session's last run belongs to that session only; files go to this app's own temporary folder.
"""
from __future__ import annotations

import csv
import os
import tempfile
import threading
import time
from dataclasses import dataclass

import gradio as gr

from specviz import lessons, recordings
from specviz.hardware import device_name
from specviz.recordings import Recording, RecordingError
from specviz.ui.errors import error
from specviz.ui.i18n import t
from specviz.ui.live import LiveRun

NEAR_TIE = 0.05        # a logit margin below this is within float noise of a tie (fp32 or bf16 kernels)
REPLAY_MAX_GAP_S = 2.0  # a replay never waits longer than this between two steps


@dataclass
class FinishedRun:
    choice: object
    prompt_text: str
    req: object              # runner.RunRequest
    result: dict
    csv_path: str
    recording_path: str


class TempFiles:
    """Unique file names in this app's own temporary folder (downloads: CSV, recordings)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix="specviz-files-")
        self._n = 0

    def path(self, stem: str, ext: str) -> str:
        with self._lock:
            self._n += 1
            return os.path.join(self._dir, f"{stem}-{self._n}.{ext}")


class RunStore:
    def __init__(self):
        self._lock = threading.Lock()
        self._last: dict[str, FinishedRun] = {}
        self._files = TempFiles()

    def _path(self, stem: str, ext: str) -> str:
        return self._files.path(stem, ext)

    # --- after a Run ----------------------------------------------------------------------------------
    def finish(self, session: str, choice, prompt_text: str, req, result: dict, parts: dict,
               live: LiveRun) -> FinishedRun:
        csv_path = self._path("specviz-chart-data", "csv")
        write_csv(csv_path, live.csv_rows())
        device = live.peaks.device if live.peaks is not None else "unknown device"
        rec = Recording(device=device, date=recordings.now_iso(), pair=choice.label, prompt=prompt_text,
                        settings={"batch": req.batch, "depth": req.depth, "policy": req.policy,
                                  "threshold": req.threshold, "temperature": req.temperature, "max_new": req.max_new},
                        steps=parts["steps"], samples=parts["samples"], totals=parts["totals"],
                        outputs=parts["outputs"], prompt_ids=result["prompt_ids"], versions=recordings.versions())
        rec_path = self._path("specviz-run", "json")
        with open(rec_path, "w", encoding="utf-8") as f:
            f.write(rec.to_json())
        run = FinishedRun(choice, prompt_text, req, result, csv_path, rec_path)
        with self._lock:
            if len(self._last) > 2000:
                self._last.clear()
            self._last[session] = run
        return run

    def last(self, session: str) -> FinishedRun | None:
        with self._lock:
            return self._last.get(session)

    # --- replay ---------------------------------------------------------------------------------------
    def shipped_titles(self) -> list[str]:
        return list(recordings.shipped())

    def open_recording(self, title, upload, lang: str = lessons.DEFAULT_LANG) -> Recording:
        path = _upload_path(upload)
        if path is None:
            path = recordings.shipped().get(title)
        if path is None:
            raise error(lang, "errors.pick_recording")
        try:
            return recordings.load(path)
        except RecordingError as exc:
            raise gr.Error(lessons.say(lang, exc)) from None

    def play(self, rec: Recording, app, lang: str, session: str, streamer_cls, pack):
        """Replay a recording through the same views at its recorded pace, labelled with its origin."""
        live = LiveRun(_NoControl(), rec.pair, None, None, shared=False, lang=lang)
        live.worker_source = "recording"
        streamer = streamer_cls(app, live, _NoTokenizer(), session, lang)
        status = t(lang, "playground.status_replay", device=rec.device, date=rec.date[:16].replace("T", " "),
                   pair=rec.pair)
        yield pack(status=status)
        start, last_yield = time.perf_counter(), 0.0
        for at, ev, pieces in rec.steps:
            wait = min(at - (time.perf_counter() - start), REPLAY_MAX_GAP_S)
            if wait > 0:
                time.sleep(wait)
            live.record(ev)
            streamer.add(ev, pieces)
            if time.perf_counter() - last_yield >= 0.2:
                last_yield = time.perf_counter()
                yield streamer.outputs(rec.totals, zero_gpu=False)
        result = {"done": True, "replay": True, "recorded_on": rec.device, "date": rec.date, "pair": rec.pair,
                  "prompt_ids": rec.prompt_ids, "outputs": [rec.outputs[i] for i in sorted(rec.outputs)],
                  **rec.totals.as_dict()}
        yield streamer.outputs(rec.totals, final=True, result=result, status=status, zero_gpu=False)

    # --- lossless check -------------------------------------------------------------------------------
    def check_lossless(self, session: str, app, lang: str) -> str:
        run = self.last(session)
        if run is None or not run.result.get("outputs"):
            return lessons.text(lang, "playground.lossless_none")
        if run.req.temperature > 0:
            return lessons.text(lang, "app.lossless_needs_greedy")
        if app.runner.zero_gpu:
            return lessons.say(lang, lessons.Said("errors.lossless_zerogpu"))
        pair = app.load(run.choice, lang)
        prompt, ours = list(run.result["prompt_ids"][0]), list(run.result["outputs"][0])
        ref = target_alone(pair, prompt, len(ours))
        for pos, (a, b) in enumerate(zip(ours, ref)):
            if a != b:
                return self._difference(pair, prompt, ours, ref, pos, lang)
        if len(ref) < len(ours):
            return self._difference(pair, prompt, ours, ref + [-1], len(ref), lang)
        return t(lang, "app.lossless_identical", n=len(ours))

    def _difference(self, pair, prompt, ours, ref, pos, lang) -> str:
        margin = logit_margin(pair, prompt + ours[:pos])
        dec = pair.tokenizer.decode
        msg = t(lang, "app.lossless_differs", pos=pos + 1, target_tok=dec([ref[pos]]) if ref[pos] >= 0 else lessons.text(lang, "app.end_of_text"),
                ours_tok=dec([ours[pos]]), margin=f"{margin:.2g}")
        if margin < NEAR_TIE:
            msg += " " + lessons.text(lang, "app.lossless_near_tie")
        return msg


def target_alone(pair, prompt: list[int], max_new: int) -> list[int]:
    """The target's own greedy continuation of `prompt` (transformers' generate, no draft, no batch)."""
    import torch

    model = pair.target.model
    ids = torch.tensor([prompt], device=pair.target.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                             pad_token_id=pair.target.eos_ids[0] if pair.target.eos_ids else 0,
                             eos_token_id=list(pair.target.eos_ids) or None,
                             temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt):].tolist()


def logit_margin(pair, seq: list[int]) -> float:
    """How far the target's best next token is ahead of its second best after `seq`."""
    import torch

    with torch.inference_mode():
        logits = pair.target.model(torch.tensor([seq], device=pair.target.device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


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


class _NoControl:
    def stop(self):
        pass

    def close(self):
        pass

    def set(self, **_):
        pass


def _upload_path(upload) -> str | None:
    if upload is None:
        return None
    if isinstance(upload, str):
        return upload
    if isinstance(upload, dict):
        return upload.get("path") or upload.get("name")
    return getattr(upload, "name", None) or getattr(upload, "path", None)
