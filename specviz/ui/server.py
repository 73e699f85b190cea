"""SpecVizApp: the state every browser session shares, and the Blocks that hold the pages.

Shared, and who owns it:
- `pairs` (PairCache): loaded weights, immutable once loaded; loading is serialised by its lock.
- `runner`: on a machine the app owns, one scheduler per pair owns that pair's engine (the batch and
  both KV caches) in its own thread; on ZeroGPU each Run's engine lives in its GPU worker.
- `gate` (DeviceGate): who may time the device now (scheduler steps, or one exclusive experiment).
- `sampler`: a daemon thread that only appends readings; `peaks`: replaced whole, never mutated.
- `runs` (LiveRuns): session → that session's live run; each LiveRun is written by its own Run.
Each page module (`playground`, `whatif`) owns its layout and its handlers.
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import gradio as gr

from specviz.hardware import Peaks, Sampler, cached_peaks
from specviz.limits import Limits, limits_from_env
from specviz.models import ModelError
from specviz.scheduler import DeviceGate
from specviz.ui import playground, runner, whatif
from specviz.ui.catalog import PairCache, PairChoice, TokenizerCache, available_choices, hub_is_offline
from specviz.ui.errors import as_human_errors
from specviz.ui.live import LiveRuns

ASSETS = Path(__file__).resolve().parents[2] / "assets"


class SpecVizApp:
    def __init__(self, target: str | None = None, draft: str | None = None, device: str | None = None,
                 preload: bool = True, calibrate_peaks: bool = True, allow_custom: bool = False,
                 limits: Limits | None = None):
        self.choices = available_choices(target, draft)
        self.allow_custom = allow_custom
        self.limits = limits or limits_from_env()
        self.runs = LiveRuns()
        self.peaks: Peaks | None = None
        self.gate = DeviceGate()
        spaces = zero_gpu_spaces()
        if spaces is not None:
            # ZeroGPU: this process never touches CUDA; the GPU worker loads weights, samples, calibrates
            self.pairs = TokenizerCache()
            self.runner = runner.ZeroGpuRunner(spaces, lambda: PairCache(device), as_human_errors)
            self.sampler = None
            calibrate_peaks = False
        else:
            self.pairs = PairCache(device)
            self.runner = runner.LocalRunner(self.pairs, self.limits, self.gate)
            self.sampler = Sampler().start()
        offline = hub_is_offline()
        self.startup_note = (("**Offline classroom mode**: the hub is unreachable; using locally cached "
                              "models and the bundled SmolLM2-135M. ") if offline else "") + self.choices[0].note
        if self.runner.zero_gpu:
            self.startup_note += (" Running on **ZeroGPU**: a GPU is attached for each Run, so the first "
                                  "Run waits for one and loads the models onto it. On this hardware each Run "
                                  "has its own batch; batches are not shared between users.")
        else:
            self.startup_note += (" Everyone using this server shares one batch per pair: press Run together "
                                  "and watch the batch grow.")
        if preload:
            self.pairs.preload(self.choices[0])
        if calibrate_peaks:
            threading.Thread(target=self._calibrate, name="specviz-calibrate", daemon=True).start()

    def _calibrate(self) -> None:
        try:
            with self.gate.exclusive():          # timed: nothing else may run meanwhile
                self.peaks = cached_peaks(size_mb=128, repeats=3)
        except Exception:
            self.peaks = None      # MBU/MFU then show as unavailable, the rest still works

    def choice(self, label: str) -> PairChoice:
        for c in self.choices:
            if c.label == label:
                return c
        if self.allow_custom:
            parts = re.split(r"\s*(?:→|->)\s*", str(label or "").strip())
            if len(parts) == 2 and all(parts):
                return PairChoice(f"{parts[0]} → {parts[1]}", parts[1], parts[0], "Custom pair.")
            raise gr.Error('Type a custom pair as "DRAFT → TARGET" (or DRAFT -> TARGET), e.g. '
                           '"ngram -> HuggingFaceTB/SmolLM2-360M-Instruct".')
        shown = str(label)[:60]
        raise gr.Error(f"Unknown model pair: {shown!r}. Pick one from the list.")

    def load(self, choice: PairChoice):
        """The pair's models, loading them if needed; a failure leaves the pairs already loaded serving."""
        try:
            return self.pairs.get(choice)
        except ModelError as exc:
            loaded = [c.label for c in self.choices if self.pairs.loaded(c)]
            still = f" The app still serves {loaded[0]}." if loaded else ""
            raise gr.Error(f"Could not load {choice.label}: {exc}.{still}") from None


def zero_gpu_spaces():
    """The `spaces` module when this app runs on a ZeroGPU Space, else None (the app then runs as is).
    `spaces` sets SPACES_ZERO_GPU there; off ZeroGPU its decorator would be a no-op anyway."""
    if os.environ.get("SPACES_ZERO_GPU", "").lower() not in ("1", "t", "true"):
        return None
    try:
        import spaces
    except ImportError:
        return None
    return spaces


def build_blocks(app: SpecVizApp) -> gr.Blocks:
    with gr.Blocks(title="SpecViz — speculative decoding, measured") as blocks:
        gr.Markdown("# SpecViz\nA small draft guesses, the big target checks k + 1 tokens in one pass. "
                    "More FLOPs, less time — while the batch is small. Drag the sliders during a run.")
        with gr.Tab("Playground"):
            playground.build(app)
        with gr.Tab("What if? (estimates + measured profiles)"):
            whatif.build(app)
    return blocks


def launch_kwargs() -> dict:
    # a classroom: every waiting Run holds a worker thread while it streams (gradio's default is 40)
    return {"css_paths": [str(ASSETS / "style.css")], "theme": gr.themes.Soft(), "max_threads": 160}
