"""SpecVizApp: shared state (pairs, live runs, hardware sampler, calibrated peaks) and the handlers the
playground wires to its buttons and sliders."""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import gradio as gr

from specviz.engine import EngineError
from specviz.hardware import Peaks, Sampler, calibrate
from specviz.models import ModelError
from specviz.policies import PolicyError
from specviz.ui import playground
from specviz.ui.catalog import PairCache, PairChoice, available_choices, hub_is_offline
from specviz.ui.live import LiveRun, LiveRuns

MIN_UPDATE_S = 0.2   # ≤ 5 updates a second: faster only makes the browser steal the CPU
ASSETS = Path(__file__).resolve().parents[2] / "assets"


class SpecVizApp:
    def __init__(self, target: str | None = None, draft: str | None = None, device: str | None = None,
                 preload: bool = True, calibrate_peaks: bool = True, allow_custom: bool = False):
        self.choices = available_choices(target, draft)
        self.allow_custom = allow_custom
        self.cache = PairCache(device)
        self.runs = LiveRuns()
        self.sampler = Sampler().start()
        self.peaks: Peaks | None = None
        offline = hub_is_offline()
        self.startup_note = (("**Offline classroom mode**: the hub is unreachable; using locally cached "
                              "models and the bundled SmolLM2-135M. ") if offline else "") + self.choices[0].note
        if preload:
            self.cache.preload(self.choices[0])
        if calibrate_peaks:
            threading.Thread(target=self._calibrate, name="specviz-calibrate", daemon=True).start()

    def _calibrate(self) -> None:
        try:
            self.peaks = calibrate(size_mb=128, repeats=3)
        except Exception:
            self.peaks = None      # MBU/MFU then show as unavailable, the rest still works

    def choice(self, label: str):
        for c in self.choices:
            if c.label == label:
                return c
        if self.allow_custom:
            parts = re.split(r"\s*(?:→|->)\s*", str(label or "").strip())
            if len(parts) == 2 and all(parts):
                return PairChoice(f"{parts[0]} → {parts[1]}", parts[1], parts[0], "Custom pair.")
            raise gr.Error('Type a custom pair as "DRAFT → TARGET" (or DRAFT -> TARGET), e.g. '
                           '"ngram -> HuggingFaceTB/SmolLM2-360M-Instruct".')
        raise gr.Error(f"Unknown model pair: {label!r}. Pick one from the list.")

    # --- handlers -----------------------------------------------------------------------------
    def stream(self, prompt_text, pair_label, batch_size, k, policy_name, thr, temp, max_tokens, session):
        b, d, t, m = playground.validate(prompt_text, batch_size, k, temp, max_tokens)
        knobs = playground.make_knobs(b, d, policy_name, thr)
        choice = self.choice(pair_label)
        if not self.cache.loaded(choice):
            yield (gr.skip(),) * 6 + (f"Loading **{choice.label}** … (the offline model is converted "
                                      "once, about 30 s; later starts take a second)", gr.skip())
        try:
            pair = self.cache.get(choice)
        except ModelError as exc:
            raise gr.Error(str(exc))
        prompt_ids = playground.encode(pair, prompt_text)
        live = LiveRun(knobs, choice.label, self.peaks, self.sampler)
        self.runs.start(session, live)
        streamer = playground.Streamer(self, pair, live, pair.tokenizer)
        engine = pair.engine()
        last_yield, first = 0.0, True
        try:
            for ev in engine.generate([prompt_ids], knobs, m, t, seed=0):
                live.record(ev)
                streamer.add(ev)
                if ev.depth == 0 and ev.drafted == 0 and ev.wall_s > 0:
                    self.runs.note_plain(choice.label, ev.batch_size, ev.emitted / ev.wall_s)
                now = time.perf_counter()
                if now - last_yield >= MIN_UPDATE_S:
                    last_yield = now
                    yield streamer.outputs(ev.batch_size, engine.totals,
                                           status=f"Running · {choice.label}" if first else None)
                    first = False
        except (EngineError, PolicyError) as exc:
            raise gr.Error(str(exc))
        finally:
            self.runs.finish(session, live)
        stopped = knobs.stop.is_set()
        outs = engine.outputs()
        result = {"done": True, "stopped": stopped, "prompt_ids": prompt_ids,
                  "outputs": [outs[i] for i in sorted(outs)], **engine.totals.as_dict()}
        note = ("Stopped." if stopped else "Done.") + f" {engine.totals.tokens} tokens."
        yield streamer.outputs(knobs.snapshot().batch_size, engine.totals, final=True, result=result, status=note)

    def set_knobs(self, session: str, depth=None, batch=None, policy=None) -> None:
        live = self.runs.get(session)
        if live is None:
            return                  # no run streaming: the values apply at the next Run
        try:
            if policy is not None:
                live.knobs.set(policy=playground._policy(policy[0] or "fixed", policy[1]))
            live.knobs.set(depth=None if depth is None else int(depth),
                           batch_size=None if batch is None else int(batch))
        except (EngineError, PolicyError, TypeError, ValueError) as exc:
            gr.Warning(str(exc))

    def figures(self, session: str):
        live = self.runs.get(session)
        return live.figures() if live is not None else (gr.skip(),) * 3

    def stop(self, session: str) -> None:
        live = self.runs.get(session)
        if live is not None:
            live.knobs.stop.set()


def build_blocks(app: SpecVizApp) -> gr.Blocks:
    with gr.Blocks(title="SpecViz — speculative decoding, measured") as blocks:
        gr.Markdown("# SpecViz\nA small draft guesses, the big target checks k + 1 tokens in one pass. "
                    "More FLOPs, less time — while the batch is small. Drag the sliders during a run.")
        with gr.Tab("Playground"):
            playground.build(app)
    return blocks


def launch_kwargs() -> dict:
    return {"css_paths": [str(ASSETS / "style.css")], "theme": gr.themes.Soft()}
