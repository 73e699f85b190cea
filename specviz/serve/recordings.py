"""Recorded runs: a run's step events, totals and hardware samples as JSON, to watch again later.

A class without a GPU can replay a run recorded on one; a replay goes through the same views at the
recorded pace and is always labelled with where and when it was recorded. Plain data only (no gradio,
no torch): the UI saves and replays, the CLI could too.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specviz.engine.request import RowStep, RunTotals, StepEvent
from specviz.lessons import Said, quoted
from specviz.lessons.stored import to_plain
from specviz.serve import recording_check as check
from specviz.serve.recording_check import LIMITS

RECORDINGS_DIR = Path(__file__).resolve().parents[2] / "assets" / "recordings"
FORMAT = "specviz-recording/1"


@dataclass
class Recording:
    device: str                     # "AMD EPYC (2 cores)", "NVIDIA H200", …
    date: str                       # ISO date and time (UTC) of the run
    pair: str                       # the pair's label
    prompt: str                     # row 1's prompt text
    settings: dict                  # batch, depth, policy, threshold, temperature, max_new
    # (seconds since start, event, {row: [kept, rejected, own] texts}): the text as it was shown, so a
    # replay needs no tokenizer and shows exactly what the live run showed
    steps: list[tuple[float, StepEvent, dict]] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)                    # hardware readings
    totals: RunTotals | None = None
    outputs: dict[int, list[int]] = field(default_factory=dict)
    prompt_ids: list[list[int]] = field(default_factory=list)
    versions: dict = field(default_factory=dict)

    @property
    def title(self) -> str:
        return f"{self.pair} · {self.prompt[:40]} · {self.device}, {self.date[:16].replace('T', ' ')}"

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "device": self.device, "date": self.date, "pair": self.pair,
                           "prompt": self.prompt, "settings": self.settings, "versions": self.versions,
                           "steps": _events_json(self.steps),
                           "samples": self.samples, "totals": dataclasses.asdict(self.totals or RunTotals()),
                           "outputs": {str(k): v for k, v in self.outputs.items()}, "prompt_ids": self.prompt_ids},
                          ensure_ascii=False)


class RecordingError(ValueError):
    """A file that is not a SpecViz recording; the message is meant for a human."""


def from_json(text: str) -> Recording:
    """A recording from its JSON text, every field checked first (specviz.serve.recording_check)."""
    if len(text) > LIMITS.max_bytes:
        raise RecordingError(too_big(len(text.encode("utf-8", "surrogatepass"))))
    try:
        data = json.loads(text)
    except RecursionError:
        raise RecordingError(Said("errors.recording_nested")) from None
    except json.JSONDecodeError as exc:     # where it breaks, not the parser's own words
        raise RecordingError(Said("errors.recording_not_json", line=exc.lineno, column=exc.colno)) from None
    except ValueError:                      # parsed, but a number too long to read
        raise RecordingError(Said("errors.recording_not_json_number")) from None
    found = data.get("format") if isinstance(data, dict) else None
    if found != FORMAT:       # the common case (some other JSON file) in the reader's words, not a field's
        known = isinstance(found, str) and found.startswith(FORMAT.split("/")[0] + "/") and len(found) < 40
        raise RecordingError(Said("errors.recording_other_version", found=quoted(found), format=FORMAT) if known
                             else Said("errors.recording_wrong_format"))
    try:
        d = check.check(data, FORMAT)
    except check.Bad as exc:
        raise RecordingError(Said("errors.recording_bad_field", detail=str(exc))) from None
    steps = _events(d["steps"])
    totals = RunTotals(**d["totals"])
    if "reached" not in data.get("totals", {}):       # older than the field: its steps count it
        totals.reached = sum(ev.reached for _, ev, _ in steps)
    return Recording(d["device"], d["date"], d["pair"], d["prompt"], d["settings"], steps, d["samples"],
                     totals, d["outputs"], d["prompt_ids"], d["versions"])


def too_big(size: int) -> Said:
    return Said("errors.recording_too_big", size=round(size / 1e6, 1), limit=round(LIMITS.max_bytes / 1e6))


def _events_json(steps) -> list:
    """The steps' events; their sentences (the forward path, the knob changes) also as `Said` data, so a
    replay says them in its reader's language (the plain fields stay English for older readers). The path
    is written where it changes: it names the same path step after step."""
    out, last = [], None
    for t, ev, pieces in steps:
        d, said = dataclasses.asdict(ev), {}
        if isinstance(ev.path, Said) and ev.path != last:
            said["path"] = to_plain(ev.path)
        last = ev.path
        if any(isinstance(c, Said) for c in ev.changes):
            said["changes"] = [to_plain(c) for c in ev.changes]
        if said:
            d["said"] = said
        out.append([t, d, {str(r): p for r, p in pieces.items()}])
    return out


def _events(steps: list) -> list:
    """(time, StepEvent, pieces) from the checked steps, each sentence a `Said` where the file stored one
    that this version says with the same English (a changed sentence keeps the recorded English)."""
    out, path = [], None
    for t, d, pieces in steps:
        d = dict(d)
        said = d.pop("said", {})
        d["rows"] = [RowStep(**r) for r in d["rows"]]
        path = said.get("path", path)
        if path == d["path"]:
            d["path"] = path
        if said.get("changes") == d["changes"]:
            d["changes"] = said["changes"]
        out.append((t, StepEvent(**d), pieces))
    return out


def load(path: str | Path) -> Recording:
    """Read a recording file; its size is checked before a byte is read."""
    try:
        size = Path(path).stat().st_size
        if size > LIMITS.max_bytes:
            raise RecordingError(too_big(size))
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise RecordingError(Said("errors.recording_unreadable")) from None
    return from_json(text)


def shipped() -> dict[str, Path]:
    """Recordings that come with SpecViz (assets/recordings), by title."""
    out = {}
    for path in sorted(RECORDINGS_DIR.glob("*.json")):
        try:
            out[load(path).title] = path
        except RecordingError:
            continue
    return out


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def versions() -> dict:
    # on first use: transformers is slow to import
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
