"""Recorded GPU truth: `scripts/gpu-check` runs committed under assets/gpu/, one file per device and date.

That folder is the one home of recorded GPU curves. A run file is gpu-check's own JSON: a `device` block,
a `date`, a `source` (the command, or where a converted run came from) and a `steps` list; each step has a
`name`, a `status`, the forward `path` it ran on ("eager", "graph") and its command's own JSON as
`result`. Every passed roofline step is a recorded curve: the knee chapter and the What-if draw it beside
what this machine measured, always labelled with the device, the path and the date. Plain JSON, no torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specviz.hardware.costmodel import Calibration, latency_curve
from specviz.hardware.device import FLAT, flat_to
from specviz.hardware.presets import GPUS, MODELS
from specviz.hardware.profiles import ASSETS, Profile, preset_calibration
from specviz.hardware.roofline import ModelSpec, predicted_knee
from specviz.lessons import Key, Said

GPU_DIR = ASSETS / "gpu"
SHAPE = "shape:"
PATH_KEYS = {"eager": "gpu.path.eager", "graph": "gpu.path.graph"}


@dataclass(frozen=True)
class RecordedCurve:
    """One roofline step of a recorded run: latency of one row against tokens per pass."""

    run: str                          # the run file's stem, "<device>-<YYYY-MM-DD>"
    device: str                       # "NVIDIA H200"
    date: str                         # YYYY-MM-DD
    path: str                         # "eager", "graph", or another path's name
    target: str                       # "shape:SmolLM2-1.7B"
    context: int
    tokens_per_pass: tuple[int, ...]
    latency_s: tuple[float, ...]
    bandwidth: float                  # calibrated on that GPU, bytes/s
    flops: float
    measured_knee: float | None
    mbu_at_1_token: float | None
    spec: ModelSpec | None
    source: str

    @property
    def model(self) -> str:
        """The model preset's name ("SmolLM2-1.7B") for a `shape:` target, else the target as recorded."""
        return self.target[len(SHAPE):] if self.target.startswith(SHAPE) else self.target

    @property
    def where(self) -> Said:
        """"NVIDIA H200, eager path, <date>": where, on which path and when it was measured."""
        path = Key(PATH_KEYS[self.path]) if self.path in PATH_KEYS else self.path
        return Said("gpu.where", device=self.device, path=path, date=self.date)

    @property
    def label(self) -> Said:
        return Said("gpu.curve_label", where=self.where, model=self.model)

    @property
    def predicted_knee(self) -> int | None:
        return None if self.spec is None else predicted_knee(self.spec, self.bandwidth, self.flops, self.context)

    def flat_to(self, tolerance: float = FLAT) -> int:
        """The largest tokens per pass up to which every pass stayed within `tolerance` × the first."""
        return flat_to(list(self.tokens_per_pass), list(self.latency_s), tolerance)

    def on_gpu(self, gpu_name: str) -> bool:
        """Whether a GPU preset ("H200", "H100 SXM") names the device this was recorded on."""
        key = gpu_name.split()[0] if gpu_name else ""
        return bool(key) and key in self.device.split()


def _curve(run: str, d: dict, step: dict) -> RecordedCurve:
    r = step["result"]
    spec = ModelSpec(**r["model_spec"]) if r.get("model_spec") else None
    ns, secs = [int(n) for n in r["tokens_per_pass"]], [float(t) for t in r["latency_s"]]
    if not ns or len(ns) != len(secs) or min(secs) <= 0:
        raise ValueError(f"{run}: step {step['name']} needs one positive latency per tokens-per-pass")
    mbu = r.get("mbu_at_1_token")
    knee = r.get("measured_knee")
    return RecordedCurve(run, str(d["device"]["name"]), str(d["date"]), str(step["path"]), str(r["target"]),
                         int(r["context"]), tuple(ns), tuple(secs), float(r["bandwidth"]), float(r["flops"]),
                         None if knee is None else float(knee), None if mbu is None else float(mbu), spec,
                         str(d.get("source", "")))


def load_run(path: Path) -> list[RecordedCurve]:
    """The recorded curves of one run file: its passed roofline steps, in the file's order."""
    d = json.loads(Path(path).read_text())
    if d.get("dry_run"):
        return []                     # a CPU rehearsal of the script, not a GPU measurement
    return [_curve(Path(path).stem, d, s) for s in d["steps"]
            if s.get("status") == "passed" and str(s.get("name", "")).startswith("roofline")]


def recorded_curves(folder: Path = GPU_DIR) -> list[RecordedCurve]:
    """Every recorded curve, newest run first; unreadable files are skipped (the app still starts)."""
    out = []
    for p in sorted(Path(folder).glob("*.json")):
        try:
            out.append(load_run(p))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    runs = sorted(out, key=lambda cs: cs[0].date if cs else "", reverse=True)
    return [c for cs in runs for c in cs]


def newest_per_model(curves: list[RecordedCurve]) -> list[RecordedCurve]:
    """One curve per model: from the newest run that has it, the graph path where one was recorded."""
    best: dict[str, RecordedCurve] = {}
    for c in curves:                    # newest run first
        had = best.get(c.model)
        if had is None or (had.date == c.date and had.path != "graph" and c.path == "graph"):
            best[c.model] = c
    return list(best.values())


def curve_for(gpu_name: str, model: str, curves: list[RecordedCurve] | None = None) -> RecordedCurve | None:
    """The newest recorded curve of a model preset on the GPU a preset names (graph path preferred)."""
    found = [c for c in (recorded_curves() if curves is None else curves) if c.model == model and c.on_gpu(gpu_name)]
    return next(iter(newest_per_model(found)), None)


@dataclass(frozen=True)
class HeldAgainst:
    """A What-if estimate at a recorded curve's own points (its context, one row)."""

    curve: RecordedCurve
    estimate_s: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        """Measured ÷ estimate per point (above 1: the GPU was slower than the estimate)."""
        return [m / e for m, e in zip(self.curve.latency_s, self.estimate_s)]

    def as_dict(self) -> dict:
        c = self.curve
        return {"recorded": str(c.label), "device": c.device, "path": c.path, "date": c.date, "model": c.model,
                "context": c.context, "tokens_per_pass": list(c.tokens_per_pass),
                "measured_ms": [1000 * t for t in c.latency_s], "estimate_ms": [1000 * t for t in self.estimate_s],
                "measured_over_estimate": self.ratios, "source": c.source}


def hold_against(curve: RecordedCurve, bandwidth: float, flops: float, spec: ModelSpec,
                 calibration: Calibration | None = None, overhead_s: float = 0.0) -> HeldAgainst:
    """The estimate for `spec` on a GPU of `bandwidth` and `flops`, at the curve's points and context."""
    est = latency_curve(spec, bandwidth, flops, list(curve.tokens_per_pass), curve.context, overhead_s, calibration)
    return HeldAgainst(curve, tuple(est))


def preset_estimates(curve: RecordedCurve) -> dict[str, HeldAgainst] | None:
    """The What-if's calibrated and ideal estimates for the curve's GPU preset and model preset (None when
    no preset names that GPU or that model)."""
    gpu = next((g for name, g in GPUS.items() if curve.on_gpu(name)), None)
    if gpu is None or curve.model not in MODELS:
        return None
    spec = MODELS[curve.model]
    return {"calibrated": hold_against(curve, gpu.bandwidth, gpu.flops, spec, preset_calibration(gpu)),
            "ideal": hold_against(curve, gpu.bandwidth, gpu.flops, spec)}


@dataclass(frozen=True)
class RecordedProfile(Profile):
    """A recorded GPU curve as the What-if's profile views read it, labelled with where and when."""

    recorded: RecordedCurve | None = None

    @property
    def label(self) -> str:
        return self.recorded.label if self.recorded is not None else Profile.label.fget(self)


def as_profile(curve: RecordedCurve) -> RecordedProfile:
    return RecordedProfile(f"{curve.run}-{curve.model}", f"cuda: {curve.device}", curve.target, curve.context,
                           list(curve.tokens_per_pass), list(curve.latency_s), curve.bandwidth, curve.flops,
                           float(curve.measured_knee or curve.tokens_per_pass[-1]), curve.spec, curve.path,
                           recorded=curve)
