"""Recorded data the what-if compares its estimates with. Plain JSON, no torch.

- Hardware profiles (`assets/profiles/`, written by `python -m specviz roofline`): a measured
  latency-vs-tokens-per-pass curve with the calibrated peaks and the model shape; the calibrated cost
  model fits its overheads and achieved FLOP rate to them (`profile_calibration`).
- Published measurements (`assets/published/speedups.json`): speed-up over batch size from papers and
  blogs, each with its source, matched to what-if presets — never ours, always labelled so.
- Recorded sweeps (`assets/sweeps/`): `python -m specviz sweep` results on this project's machine.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specviz.hardware.costmodel import (SERVING, Calibration, Setup, depth_crossover, fit_alpha, fit_calibration,
                                        run_seconds)
from specviz.hardware.presets import (GPUS, MODELS, GpuSpec, PresetError, named_by_shape, resolve_draft, resolve_gpu,
                                      resolve_model)
from specviz.hardware.roofline import ModelSpec, predicted_knee
from specviz.lessons import Said

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PROFILES_DIR = ASSETS / "profiles"
PUBLISHED_FILE = ASSETS / "published" / "speedups.json"
SWEEPS_DIR = ASSETS / "sweeps"
PUBLISHED_LABEL = "published measurement"
EAGER = "eager (transformers)"        # specviz.fastpath.FastPath("off").label: the stock modules
# the serving stack whose pass-time fit the calibrated model is built on (roofline.SERVING): its
# per-step bookkeeping is inside that fit, so it needs no fitted extra
BASE_STACK = "vLLM 0.10.1"


@dataclass(frozen=True)
class Profile:
    name: str                  # file stem, e.g. "h200-smollm2-1.7b"
    device: str                # hardware.device_name(): "cpu: 2 cores", "cuda: NVIDIA H200", …
    target: str
    context: int
    tokens_per_pass: list[int]
    latency_s: list[float]
    bandwidth: float           # calibrated bytes/s
    flops: float               # calibrated FLOP/s
    measured_knee: float
    spec: ModelSpec | None     # the model shape (for the roofline prediction); None in old files
    path: str = EAGER          # the forward path that ran the passes (`--compile`); eager in old files
    recorded: str = ""         # the day it was measured (YYYY-MM-DD); unknown in old files
    cpu: str = ""              # lscpu's model name and cores, on a CPU ("AMD EPYC (2 cores)"); not in old files

    @property
    def where(self) -> str:
        """The machine to name on a page: a CPU's model where it was recorded ("AMD EPYC (2 cores)"), else
        the device's name (a GPU profile's `cpu` is its host's, not what it measured)."""
        return self.cpu if self.cpu and self.device.startswith("cpu") else self.device

    @property
    def predicted_knee(self) -> int | None:
        if self.spec is None:
            return None
        return predicted_knee(self.spec, self.bandwidth, self.flops, self.context)

    @property
    def label(self) -> str:
        """English (the value the dropdown and the API exchange); a page shows it in its reader's language."""
        if self.path == EAGER:
            return Said("whatif.profile_label", target=self.target, device=self.device)
        # the path its own field: beside the device in one value, a right-to-left label swapped the two
        return Said("whatif.profile_label_path", target=self.target, device=self.device, path=self.path)


def spec_to_dict(spec: ModelSpec) -> dict:
    return asdict(spec)


def load_profile(path: Path) -> Profile:
    d = json.loads(Path(path).read_text())
    spec = ModelSpec(**d["model_spec"]) if d.get("model_spec") else None
    return Profile(Path(path).stem, d.get("device_name") or d["device"], d["target"], int(d["context"]),
                   [int(n) for n in d["tokens_per_pass"]], [float(t) for t in d["latency_s"]],
                   float(d["bandwidth"]), float(d["flops"]), float(d["measured_knee"]), spec,
                   str(d.get("path") or EAGER), str(d.get("recorded") or ""), str(d.get("cpu") or ""))


def load_profiles(folder: Path = PROFILES_DIR) -> list[Profile]:
    """Every readable profile in `folder`, sorted by name; unreadable files are skipped, not fatal."""
    out = []
    for p in sorted(Path(folder).glob("*.json")):
        try:
            out.append(load_profile(p))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


# --- calibrations from recorded profiles -------------------------------------------------------------

def profile_calibration(prof: Profile) -> Calibration:
    """The calibrated model's constants fitted to one recorded profile (needs its model shape)."""
    if prof.spec is None:
        raise ValueError(f"profile {prof.name} has no model shape to fit")
    return fit_calibration(prof.spec, prof.tokens_per_pass, prof.latency_s, prof.context, prof.bandwidth,
                           prof.flops, Said("whatif.profile_source", name=prof.name),
                           Said("whatif.profile_note", name=prof.name, target=prof.target, device=prof.device))


def profile_for_device(profiles: list[Profile], device_kind: str, path: str | None = None) -> Profile | None:
    """A profile (with a model shape) recorded on this kind of device ("cpu" or "cuda"): on the forward
    path `path` when one was recorded on it, else preferring the fast path (what the app serves where it
    measured faster), then the first by name."""
    found = [p for p in profiles if p.spec is not None and p.device.split(":")[0] == device_kind]
    if path is not None:
        found = [p for p in found if p.path == path] or found
    return min(found, key=lambda p: p.path == EAGER, default=None)


def profile_for_sweep(profiles: list[Profile], sweep: RecordedSweep) -> Profile | None:
    """The profile whose pass times a recorded sweep's estimate takes: the same device ("cpu: 2 cores",
    "cuda: NVIDIA H200") and the same model shape, on the sweep's forward path where one was recorded."""
    mine = [p for p in profiles if p.device == sweep.device and p.spec is not None
            and named_by_shape(p.spec, p.target) == sweep.target]
    return profile_for_device(mine, sweep.device.split(":")[0], sweep.path)


def gpu_calibration(gpu: GpuSpec, profiles: list[Profile]) -> Calibration:
    """The calibrated model for a GPU preset: the serving stack's overheads from the published fit; its
    achieved rates from a profile recorded on that GPU when there is one (rates belong to the hardware;
    a recorded eager profile's launch overheads would not apply to a stack that replays CUDA graphs)."""
    words = gpu.name.split()
    key = " ".join(words[:3]) if words[0] == "RTX" else words[0]      # "H100", "A100", "RTX PRO 6000"
    prof = next((p for p in profiles if p.spec is not None and p.device.startswith("cuda")
                 and re.search(rf"\b{re.escape(key)}\b", p.device)), None)
    if prof is None or gpu.name not in GPUS:
        return SERVING
    fitted = profile_calibration(prof)
    scale = prof.flops / gpu.flops          # the profile's efficiency is of its calibrated peak
    return replace(SERVING, name=Said("whatif.cal.rates_name", base=SERVING.name, profile=prof.name),
                   flops_eff=min(1.0, fitted.flops_eff * scale),
                   bandwidth_eff=min(1.0, prof.bandwidth / gpu.bandwidth),
                   source=Said("whatif.cal.rates_source", base=SERVING.source, rates=fitted.source))


# --- published measurements --------------------------------------------------------------------------

@dataclass(frozen=True)
class PublishedSeries:
    """Speed-up over plain decoding against batch size, as a source published it (not ours)."""

    id: str
    label: str                 # short, e.g. "EAGLE on SGLang"
    cite: str                  # short citation for a legend, e.g. "EAGLE-3 paper, Table 4"
    source: str                # paper/blog, table, framework, hardware, model, data set
    gpu: str                   # matching what-if presets
    target: str
    draft: str
    depth: int
    context: int               # the what-if context used to compare (sources do not state one)
    fit_batch: int | None      # batch at which α is fitted to this series (None: no such point)
    batch_sizes: list[int]
    speedup: list[float]
    stack: str = BASE_STACK    # the serving software that measured it (its bookkeeping is fitted per stack)

    @property
    def legend(self) -> str:
        return f"{self.label} ({PUBLISHED_LABEL}, {self.cite})"

    def matches(self, gpu: str, target: str, draft: str) -> bool:
        return (self.gpu, self.target, self.draft) == (gpu, target, draft)


_LABEL = re.compile(r"(?P<method>.+) on (?P<engine>.+)")              # "EAGLE on SGLang"
_CITE = re.compile(r"(?P<paper>.+) paper, Table (?P<table>\d+)")     # "EAGLE-3 paper, Table 4"


def _said(text: str, pattern: re.Pattern, key: str) -> str:
    """A label or citation of the data file in the reader's language where it has the usual shape (a
    Said: its English is the text itself), else the text as it is (a name)."""
    m = pattern.fullmatch(text)
    return Said(key, **m.groupdict()) if m else text


def _series(d: dict) -> PublishedSeries:
    s = PublishedSeries(str(d["id"]), _said(str(d["label"]), _LABEL, "whatif.series_label"),
                        _said(str(d["cite"]), _CITE, "whatif.series_cite"), str(d["source"]), str(d["gpu"]), str(d["target"]),
                        str(d["draft"]), int(d["depth"]), int(d["context"]),
                        None if d.get("fit_batch") is None else int(d["fit_batch"]),
                        [int(b) for b in d["batch_sizes"]], [float(x) for x in d["speedup"]],
                        str(d.get("stack") or BASE_STACK))
    if not (s.source and s.cite) or len(s.batch_sizes) != len(s.speedup) or not s.batch_sizes:
        raise ValueError(f"published series {s.id}: needs a source and one speed-up per batch size")
    if s.fit_batch is not None and s.fit_batch not in s.batch_sizes:
        raise ValueError(f"published series {s.id}: fit_batch {s.fit_batch} is not one of its batch sizes")
    return s


def load_published(path: Path = PUBLISHED_FILE) -> list[PublishedSeries]:
    """Every published series in the data file (an unreadable file gives none: the tab still works)."""
    try:
        data = json.loads(Path(path).read_text())
        return [_series(d) for d in data["series"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


# --- recorded sweeps on this project's machine ---------------------------------------------------------

@dataclass(frozen=True)
class RecordedSweep:
    name: str
    command: str               # the command that measured it
    device: str
    target: str                # what-if presets: the shape of the measured models
    draft: str
    prompt_tokens: int
    new_tokens: int
    acceptance: dict[int, float]   # depth → measured share of drafted tokens accepted
    batch_sizes: list[int]
    depths: list[int]
    tokens_per_s: list[list[float]]  # [batch][depth], end to end
    path: str = EAGER                # the forward path that ran it (`sweep --compile`)
    engine: str = "specviz"          # "vllm": `sweep --engine vllm`, one vLLM server per depth
    engine_version: str = ""
    schedule: dict | None = None     # vLLM's dynamic schedule on the same batch sizes: rows, tokens_per_s, mean_depth
    recorded_at: str = ""            # the day it was measured (YYYY-MM-DD)


def load_sweeps(folder: Path = SWEEPS_DIR, engine: str = "specviz") -> list[RecordedSweep]:
    """The recorded sweeps of one engine (ours by default: the what-if compares its models with them)."""
    out = []
    for p in sorted(Path(folder).glob("*.json")):
        try:
            d = json.loads(p.read_text())
            if str(d.get("engine", "specviz")) != engine:
                continue
            out.append(RecordedSweep(p.stem, str(d["command"]), str(d["device"]), str(d["target"]),
                                     str(d["draft"]), int(d["prompt_tokens"]), int(d["new_tokens"]),
                                     {int(k): float(v) for k, v in d["acceptance_rate"].items()},
                                     [int(b) for b in d["batch_sizes"]], [int(k) for k in d["depths"]],
                                     [[float(x) for x in row] for row in d["tokens_per_s"]],
                                     str(d.get("path") or EAGER), engine, str(d.get("engine_version", "")),
                                     _schedule(d.get("schedule"), len(d["batch_sizes"])),
                                     str(d.get("recorded_at", ""))))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def cannot_model(sweep: RecordedSweep) -> str | None:
    """Why the what-if's models cannot estimate a recorded sweep (None where they can): they need presets
    for its target and draft, plain decoding (depth 0) and its acceptance at depth 1 (α)."""
    if sweep.target not in MODELS:
        return f"its target {sweep.target} has the shape of no what-if preset"
    try:
        resolve_draft(sweep.draft, MODELS[sweep.target])
    except PresetError:
        return f"its draft {sweep.draft} is not one the what-if models"
    if 0 not in sweep.depths:
        return "it has no depth 0, the plain decoding its speed-ups are measured against"
    if 1 not in sweep.acceptance:
        return "it measured no acceptance at depth 1, where the models read α"
    return None


def _schedule(d, n_batches: int) -> dict | None:
    if not d:
        return None
    out = {"rows": [[int(x) for x in r] for r in d["rows"]],
           "tokens_per_s": [float(x) for x in d["tokens_per_s"]],
           "mean_depth": [float(x) for x in d["mean_depth"]]}
    if len(out["tokens_per_s"]) != n_batches or len(out["mean_depth"]) != n_batches:
        raise ValueError("a schedule needs one figure per batch size")
    return out


# --- how far the estimates are from the measurements ---------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """A what-if model's estimate at a published series' points (α fitted at its fit batch)."""

    series: PublishedSeries
    model: str                  # the calibration's name
    alpha: float
    alpha_note: str             # how α was chosen
    estimate: list[float]       # speed-up at each published batch size
    crossover: int | None       # first batch where the estimate falls below 1 at the series' depth

    @property
    def errors(self) -> list[float]:
        return [e / p - 1 for e, p in zip(self.estimate, self.series.speedup)]

    @property
    def max_error(self) -> float:
        return max(abs(e) for e in self.errors)

    @property
    def published_crossover(self) -> int | None:
        return next((b for b, s in zip(self.series.batch_sizes, self.series.speedup) if s < 1), None)


def series_setup(series: PublishedSeries, cal: Calibration, context: int | None = None):

    gpu, target = resolve_gpu(series.gpu), resolve_model(series.target)
    return Setup(target, resolve_draft(series.draft, target), gpu.bandwidth, gpu.flops,
                 series.context if context is None else context, cal)


def compare(series: PublishedSeries, cal: Calibration, alpha: float | None = None,
            alpha_note: str = "given", context: int | None = None) -> Comparison:
    """Estimate the series' points with `cal`; α is fitted at the series' fit batch unless given."""

    setup = series_setup(series, cal, context)
    if alpha is None:
        if series.fit_batch is None:
            raise ValueError(f"published series {series.id} has no fit point: give α")
        fit = series.speedup[series.batch_sizes.index(series.fit_batch)]
        alpha = fit_alpha(setup, series.fit_batch, series.depth, fit)
        alpha_note = f"fitted at batch {series.fit_batch}"
    est = [setup.speedup(b, series.depth, alpha) for b in series.batch_sizes]
    return Comparison(series, cal.name, alpha, alpha_note, est, depth_crossover(setup, alpha, series.depth))


def compare_all(published: list[PublishedSeries], cal: Calibration, per_stack: bool = False) -> list[Comparison]:
    """Every published series compared; a series without a fit point borrows α from a fitted series of
    the same setup (same GPU, target, draft and depth), and says so. `per_stack`: each series is
    estimated with `cal` plus the bookkeeping fitted for the stack that measured it."""
    out, fitted = [], {}

    def cal_for(s):
        return stack_calibration(s.stack, cal, published) if per_stack else cal

    for s in published:
        if s.fit_batch is not None:
            c = compare(s, cal_for(s))
            fitted.setdefault((s.gpu, s.target, s.draft, s.depth), c)
            out.append(c)
    for s in published:
        if s.fit_batch is None:
            donor = fitted.get((s.gpu, s.target, s.draft, s.depth))
            if donor is not None:
                out.append(compare(s, cal_for(s), donor.alpha, f"from {donor.series.id} (another data set)"))
    return out


# --- a stack's bookkeeping, fitted to its published speed-ups ------------------------------------------

@dataclass(frozen=True)
class StackFit:
    """The per-sequence cost of a speculative step (`Calibration.spec_row_overhead_s`) that best explains
    one serving stack's published speed-ups, and how well it does on data it was not fitted to."""

    stack: str
    row_overhead_s: float
    fitted_to: tuple[str, ...]            # series ids
    max_error: float                      # worst |estimate ÷ published − 1| over those series
    held_out: tuple[tuple[str, float, float], ...]   # (series id, overhead fitted without it, its max error)


ROW_OVERHEAD_GRID_S = [i * 20e-6 for i in range(51)]     # 0 … 1 ms per sequence per step, then refined
_FITS: dict = {}


def _worst(series: list[PublishedSeries], cal: Calibration) -> float:
    return max(compare(s, cal).max_error for s in series)


def _fit_row_overhead(series: list[PublishedSeries], base: Calibration) -> tuple[float, float]:
    """Minimise the worst relative error (the goal's "within N %") over the series, α refitted at each
    series' fit batch for every candidate: a coarse grid, then 1 µs steps around its best."""
    def err(x: float) -> float:
        return _worst(series, replace(base, spec_row_overhead_s=x))

    best = min(ROW_OVERHEAD_GRID_S, key=err)
    fine = [max(0.0, best + i * 1e-6) for i in range(-20, 21)]
    best = min(fine, key=err)
    return best, err(best)


def fit_stack(stack: str, base: Calibration, published: list[PublishedSeries]) -> StackFit | None:
    """The stack's fitted bookkeeping (None for the base stack, or without series to fit to), with a
    leave-one-series-out check: each series' error when the overhead is fitted to the others only."""
    series = [s for s in published if s.stack == stack and s.fit_batch is not None]
    if stack == BASE_STACK or not series or base.is_ideal:
        return None
    key = (stack, base, tuple((s.id, tuple(s.batch_sizes), tuple(s.speedup)) for s in series))
    if key not in _FITS:
        x, worst = _fit_row_overhead(series, base)
        held = []
        for s in series if len(series) > 1 else []:
            xo, _ = _fit_row_overhead([o for o in series if o is not s], base)
            held.append((s.id, xo, compare(s, replace(base, spec_row_overhead_s=xo)).max_error))
        _FITS[key] = StackFit(stack, x, tuple(s.id for s in series), worst, tuple(held))
    return _FITS[key]


def stack_calibration(stack: str, base: Calibration, published: list[PublishedSeries]) -> Calibration:
    """`base` plus the bookkeeping fitted for `stack` (`base` itself for the base stack)."""
    fit = fit_stack(stack, base, published)
    if fit is None:
        return base
    return replace(base, name=Said("whatif.cal.stack_name", base=base.name, stack=stack),
                   spec_row_overhead_s=fit.row_overhead_s,
                   source=Said("whatif.cal.stack_source", base=base.source, us=1e6 * fit.row_overhead_s, stack=stack,
                               series=", ".join(fit.fitted_to)))


def preset_calibration(gpu: GpuSpec, stack: str | None = None) -> Calibration:
    """The calibrated model the What-if tab and `whatif` use for a GPU preset: a recorded profile's rates
    on that GPU where one is shipped (else the published serving fit), plus `stack`'s per-sequence
    bookkeeping fitted to its published speed-ups (None or the base stack: none added)."""
    base = gpu_calibration(gpu, load_profiles())
    return base if stack is None else stack_calibration(stack, base, load_published())


@dataclass(frozen=True)
class SweepComparison:
    sweep: RecordedSweep
    model: str
    alpha: float
    estimate: list[list[float]]     # tokens/s end to end, [batch][depth]

    def errors(self, relative_to_plain: bool = False) -> list[float]:
        """Estimate ÷ measurement − 1 per cell: of tokens/s, or of the speed-up over depth 0."""
        out = []
        for est, meas in zip(self.estimate, self.sweep.tokens_per_s):
            for e, m in zip(est, meas):
                out.append((e / est[0]) / (m / meas[0]) - 1 if relative_to_plain else e / m - 1)
        return out


@dataclass(frozen=True)
class CurveSetup(Setup):
    """A what-if setup whose passes cost what a recorded profile measured on this machine: the latency of
    n tokens in one pass, interpolated between the measured points (log-spaced tokens), linear beyond the
    last one. A draft of the target's own shape with fewer layers (layer-skip) costs the target's time
    scaled by the weights it streams; any other draft falls back to the calibration's rule."""

    curve: tuple[tuple[int, float], ...] = ()

    def pass_s(self, spec: ModelSpec, batch: int, tokens: int, context: int | None = None) -> float:
        if not self.curve or (spec is not self.target and spec.d_model != self.target.d_model):
            return Setup.pass_s(self, spec, batch, tokens, context)
        share = spec.streamed_params / self.target.streamed_params
        return share * curve_time(self.curve, batch * tokens) + self.overhead_s


def curve_time(curve: tuple[tuple[int, float], ...], n: int) -> float:
    """Seconds for n tokens in one pass from measured (tokens, seconds) points."""
    ns = [p[0] for p in curve]
    if n <= ns[0]:
        return curve[0][1]
    if n >= ns[-1]:
        return curve[-1][1] * n / ns[-1]
    i = next(i for i, x in enumerate(ns) if x >= n)
    (n0, t0), (n1, t1) = curve[i - 1], curve[i]
    return t0 + (t1 - t0) * (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))


def compare_sweep(sweep: RecordedSweep, cal: Calibration, bandwidth: float, flops: float,
                  curve: tuple[tuple[int, float], ...] = ()) -> SweepComparison:
    """The end-to-end tokens/s the model expects for every cell of a recorded sweep. α is the measured
    acceptance at depth 1 (at k = 1 the share of drafts accepted *is* α); bytes per parameter follow
    the profile's dtype (fp32 on a CPU)."""

    target = replace(resolve_model(sweep.target), bytes_per_param=4.0 if sweep.device.startswith("cpu") else 2.0)
    setup = CurveSetup(target, resolve_draft(sweep.draft, target), bandwidth, flops, sweep.prompt_tokens, cal,
                       curve=tuple(curve))
    alpha = sweep.acceptance[1]
    est = [[b * sweep.new_tokens / run_seconds(setup, b, k, alpha, sweep.prompt_tokens, sweep.new_tokens)
            for k in sweep.depths] for b in sweep.batch_sizes]
    return SweepComparison(sweep, cal.name, alpha, est)
