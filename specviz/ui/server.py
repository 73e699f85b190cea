"""SpecVizApp: shared state (pairs, live runs, hardware sampler, calibrated peaks) and the handlers the
playground wires to its buttons and sliders."""
from __future__ import annotations

import os
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import gradio as gr

from specviz.engine import EngineError
from specviz.hardware import Peaks, Sampler, cached_peaks
from specviz.models import ModelError
from specviz.policies import PolicyError
from specviz.ui import playground, runner, whatif
from specviz.ui.catalog import PairCache, PairChoice, TokenizerCache, available_choices, hub_is_offline
from specviz.ui.live import LiveRun, LiveRuns

MIN_UPDATE_S = 0.2   # ≤ 5 updates a second: faster only makes the browser steal the CPU
ASSETS = Path(__file__).resolve().parents[2] / "assets"


class SpecVizApp:
    def __init__(self, target: str | None = None, draft: str | None = None, device: str | None = None,
                 preload: bool = True, calibrate_peaks: bool = True, allow_custom: bool = False):
        self.choices = available_choices(target, draft)
        self.allow_custom = allow_custom
        self.runs = LiveRuns()
        self.peaks: Peaks | None = None
        spaces = zero_gpu_spaces()
        if spaces is not None:
            # ZeroGPU: this process never touches CUDA; the GPU worker loads weights, samples, calibrates
            self.cache = TokenizerCache()
            self.runner = runner.ZeroGpuRunner(spaces, lambda: PairCache(device), _as_gradio_errors)
            self.sampler = None
            calibrate_peaks = False
        else:
            self.cache = PairCache(device)
            self.runner = runner.LocalRunner(self.cache)
            self.sampler = Sampler().start()
        offline = hub_is_offline()
        self.startup_note = (("**Offline classroom mode**: the hub is unreachable; using locally cached "
                              "models and the bundled SmolLM2-135M. ") if offline else "") + self.choices[0].note
        if self.runner.zero_gpu:
            self.startup_note += (" Running on **ZeroGPU**: a GPU is attached for each Run, so the first "
                                  "Run waits for one and loads the models onto it.")
        if preload:
            self.cache.preload(self.choices[0])
        if calibrate_peaks:
            threading.Thread(target=self._calibrate, name="specviz-calibrate", daemon=True).start()

    def _calibrate(self) -> None:
        try:
            self.peaks = cached_peaks(size_mb=128, repeats=3)
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
        with _as_gradio_errors():
            pair = self.cache.get(choice)
        prompt_ids = playground.encode(pair, prompt_text)
        req = runner.RunRequest(choice.target, choice.draft, tuple(prompt_ids), d, b, policy_name or "fixed",
                                thr, t, m)
        control = self.runner.control(knobs, (policy_name or "fixed", thr))
        live = LiveRun(control, choice.label, self.peaks, self.sampler)
        self.runs.start(session, live)
        streamer = playground.Streamer(self, live, pair.tokenizer)
        if self.runner.zero_gpu:
            yield (gr.skip(),) * 6 + ("Waiting for a ZeroGPU worker; the first Run also loads the pair onto "
                                      "its GPU …", gr.skip())
        last_yield, first, packet = 0.0, True, None
        try:
            with _as_gradio_errors():
                for packet in self.runner.packets(req, choice, control):
                    self._fold(packet, live, streamer, choice.label)
                    now = time.perf_counter()
                    if not packet.final and now - last_yield >= MIN_UPDATE_S:
                        last_yield = now
                        yield streamer.outputs(streamer.batch, packet.totals,
                                               status=f"Running · {choice.label}{self._where()}" if first else None)
                        first = False
        finally:
            self.runs.finish(session, live)
            control.close()
        if packet is None or not packet.final:
            raise gr.Error("The generation ended without a result (the GPU worker stopped). Please run again.")
        outs = packet.outputs
        result = {"done": True, "stopped": packet.stopped, "prompt_ids": prompt_ids,
                  "outputs": [outs[i] for i in sorted(outs)], "worker_pid": packet.worker_pid,
                  **packet.totals.as_dict()}
        note = ("Stopped." if packet.stopped else "Done.") + f" {packet.totals.tokens} tokens."
        yield streamer.outputs(streamer.batch, packet.totals, final=True, result=result, status=note)

    def _fold(self, packet, live: LiveRun, streamer, label: str) -> None:
        """One packet from the runner into the charts, the transcripts and the plain baseline."""
        live.feed(packet.samples, packet.sampler_source, packet.peaks, packet.spec)
        if packet.peaks is not None:
            self.peaks = packet.peaks          # a ZeroGPU worker's calibration: the what-if tab can use it
        for ev in packet.events:
            live.record(ev)
            streamer.add(ev)
            if ev.depth == 0 and ev.drafted == 0 and ev.wall_s > 0:
                self.runs.note_plain(label, ev.batch_size, ev.emitted / ev.wall_s)

    def _where(self) -> str:
        return " · on a ZeroGPU worker" if self.runner.zero_gpu else ""

    def set_knobs(self, session: str, depth=None, batch=None, policy=None) -> None:
        live = self.runs.get(session)
        if live is None:
            return                  # no run streaming: the values apply at the next Run
        try:
            live.control.set(depth=None if depth is None else int(depth),
                             batch=None if batch is None else int(batch), policy=policy)
        except (EngineError, PolicyError, TypeError, ValueError) as exc:
            gr.Warning(str(exc))

    def figures(self, session: str):
        live = self.runs.get(session)
        return live.figures() if live is not None else (gr.skip(),) * 3

    def stop(self, session: str) -> None:
        live = self.runs.get(session)
        if live is not None:
            live.control.stop()


@contextmanager
def _as_gradio_errors():
    """Errors meant for a human become a gradio message (also inside a ZeroGPU worker, whose other
    exceptions reach the browser only as "ZeroGPU worker error")."""
    try:
        yield
    except (ModelError, EngineError, PolicyError) as exc:
        raise gr.Error(str(exc)) from None


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
    return {"css_paths": [str(ASSETS / "style.css")], "theme": gr.themes.Soft()}
