"""`python -m specviz whatif`: the What-if tab's estimates without a browser (all labelled "estimate").

    python -m specviz whatif --gpu "H100 SXM" --target Llama-3.1-8B --draft EAGLE:Llama-3.1-8B \
        --alpha 0.7 --context 800 --batch-sizes 1,2,4,8,16,32,64 --depths 0,1,2,3,4 --json
    python -m specviz whatif --published [--json]   # estimates against the published measurements
    python -m specviz whatif --sweeps [--json]      # against this project's recorded CPU sweeps
    python -m specviz whatif --recorded [--json]    # against the GPU curves scripts/gpu-check recorded

A grid for a GPU preset and model preset with a recorded GPU curve (assets/gpu/) also holds the estimate
against it: `recorded` gives, at the recording's own points and context, measured and estimated ms per pass.

Pure arithmetic (roofline + recorded JSON): no torch needed. Bad input ends as one line on stderr and
exit status 2, like every other command.
"""
from __future__ import annotations

import json
import sys

from specviz.cli.args import given_flags, whole_numbers
from specviz.hardware import costmodel, gpu_records, presets, profiles

MODELS = ("calibrated", "ideal")
LIMITS = {"batch-sizes": (1, 65536), "depths": (0, 64)}
ESTIMATE = "estimate"     # every number this command prints is one


class WhatIfError(ValueError):
    """A bad argument: reported as one line."""


def add_parser(sub) -> None:
    p = sub.add_parser("whatif", help="estimated tokens/s and speed-up over batch sizes × depths on a GPU "
                                      "(calibrated or ideal roofline model)")
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", default=None, help="GPU preset (the grid needs it, or --bandwidth with --flops): "
                     + ", ".join(presets.GPUS))
    lo, hi = presets.CUSTOM_BANDWIDTH
    gpu.add_argument("--bandwidth", type=float, default=None,
                     help=f"custom GPU: memory bandwidth, bytes/s ({lo:g}-{hi:g})")
    lo, hi = presets.CUSTOM_FLOPS
    p.add_argument("--flops", type=float, default=None,
                   help=f"custom GPU: dense FLOP/s, with --bandwidth ({lo:g}-{hi:g})")
    p.add_argument("--target", default="Llama-3.1-8B", help="model preset: " + ", ".join(presets.MODELS))
    p.add_argument("--draft", default="ngram",
                   help="a model preset, EAGLE:<target>, EAGLE-3:<target>, layerskip:A-B or ngram")
    p.add_argument("--alpha", type=float, default=0.7, help="acceptance rate per draft token, 0 ≤ α < 1")
    p.add_argument("--context", type=int, default=1024, help="cached tokens each row attends to")
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256,512")
    p.add_argument("--depths", default="0,1,2,3,4,6,8")
    p.add_argument("--model", default="calibrated", help="calibrated (default) or ideal (the roofline)")
    p.add_argument("--stack", default="vllm",
                   help="calibrated model's serving stack: vllm (default; the pass-time fit's own) or sglang "
                        "(adds its per-sequence bookkeeping, fitted to its published speed-ups)")
    p.add_argument("--overhead-ms", type=float, default=0.0, help="extra fixed time per forward pass")
    report = p.add_mutually_exclusive_group()
    report.add_argument("--published", action="store_true",
                        help="compare both models with every published measurement instead")
    report.add_argument("--sweeps", action="store_true",
                        help="compare both models with this project's recorded CPU sweeps instead")
    report.add_argument("--recorded", action="store_true",
                        help="compare both models with the GPU curves scripts/gpu-check recorded (assets/gpu/) "
                             "instead")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    # a report covers every GPU and model it holds: a grid's settings given with one would be ignored
    p.set_defaults(func=run, grid_defaults={dest: p.get_default(dest) for dest in GRID})


GRID = ("gpu", "bandwidth", "flops", "target", "draft", "alpha", "context", "batch_sizes", "depths", "model", "stack",
        "overhead_ms")


def _ignored(args) -> list[str]:
    """The grid's settings given with a report (--published, --sweeps, --recorded), as flags."""
    return given_flags(args, args.grid_defaults)


def run(args) -> int:
    report = next((f"--{k}" for k in ("published", "sweeps", "recorded") if getattr(args, k)), None)
    if report and _ignored(args):
        print(f"specviz: error: {report} compares the models with every measurement it holds; it takes no "
              f"{', '.join(_ignored(args))}", file=sys.stderr)
        return 2
    try:
        if args.published:
            out = published_report()
        elif args.sweeps:
            out = sweeps_report()
        elif args.recorded:
            out = recorded_report()
        else:
            out = grid(args)
    except (WhatIfError, presets.PresetError) as exc:
        print(f"specviz: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out) if args.json else render(out))
    return 0


# --- arguments ----------------------------------------------------------------------------------------

def parse_ints(text: str, what: str) -> list[int]:
    try:
        return whole_numbers(text, *LIMITS[what])
    except ValueError as exc:
        raise WhatIfError(f"--{what} {exc}") from None


def calibration(model: str, gpu: presets.GpuSpec, stack: str = "vllm") -> costmodel.Calibration:
    if model not in MODELS:
        raise WhatIfError(f"--model must be one of {', '.join(MODELS)}, got {model!r}")
    if model == "ideal":
        return costmodel.IDEAL
    return profiles.preset_calibration(gpu, stack_name(stack))


def stack_name(text: str) -> str:
    """"vllm" / "sglang" (any case, or a full name such as "SGLang v0.4.4") → the stack's full name."""
    names = sorted({profiles.BASE_STACK} | {s.stack for s in profiles.load_published()})
    word = str(text).strip().lower()
    found = [n for n in names if n.lower() == word or n.split()[0].lower() == word]
    if not found:
        short = ", ".join(n.split()[0].lower() for n in names)
        raise WhatIfError(f"--stack must be one of {short}, got {text!r}")
    return found[0]


def _check_custom(bandwidth: float, flops: float | None) -> None:
    """A custom GPU's two numbers, each refused by its flag and its bounds."""
    if flops is None:
        raise WhatIfError("--bandwidth goes with --flops: a custom GPU needs both")
    for flag, value, (lo, hi), unit in (("--bandwidth", bandwidth, presets.CUSTOM_BANDWIDTH, "bytes/s"),
                                        ("--flops", flops, presets.CUSTOM_FLOPS, "FLOP/s")):
        if not lo <= value <= hi:
            raise WhatIfError(f"{flag} must be from {lo:g} to {hi:g} {unit}, not {value:g}")


def setup_from(args) -> tuple[costmodel.Setup, presets.GpuSpec]:
    if args.gpu is None and args.bandwidth is None:
        raise WhatIfError("give --gpu NAME, or --bandwidth BYTES_PER_S with --flops FLOP_PER_S")
    if args.gpu is not None and args.flops is not None:
        raise WhatIfError("--flops goes with --bandwidth (a custom GPU), not with --gpu")
    if args.gpu is None:
        _check_custom(args.bandwidth, args.flops)
    if args.model == "ideal" and args.stack != args.grid_defaults["stack"]:
        raise WhatIfError("--stack picks the calibrated model's serving stack; --model ideal reads none")
    gpu = presets.resolve_gpu(args.gpu, args.bandwidth, args.flops)
    if not 0 <= args.alpha < 1:
        raise WhatIfError(f"--alpha must be at least 0 and below 1, got {args.alpha}")
    if not 1 <= args.context <= 1_000_000:
        raise WhatIfError(f"--context must be 1-1000000 tokens, got {args.context}")
    if not 0 <= args.overhead_ms <= 1000:
        raise WhatIfError(f"--overhead-ms must be 0-1000, got {args.overhead_ms}")
    target = presets.resolve_model(args.target)
    draft = presets.resolve_draft(args.draft, target)
    cal = calibration(args.model, gpu, args.stack)
    return costmodel.Setup(target, draft, gpu.bandwidth, gpu.flops, args.context, cal, args.overhead_ms / 1000), gpu


# --- the grid -----------------------------------------------------------------------------------------

def grid(args) -> dict:
    setup, gpu = setup_from(args)
    batches, depths = parse_ints(args.batch_sizes, "batch-sizes"), parse_ints(args.depths, "depths")
    rows = costmodel.whatif_rows(setup.target, setup.draft, setup.bandwidth, setup.flops, args.alpha, setup.context,
                          batches, depths, setup.overhead_s, setup.calibration)
    by_depth = {}
    for k in depths:
        if k > 0:
            below = [r["batch_size"] for r in rows if r["depth"] == k and r["speedup"] < 1]
            by_depth[str(k)] = below[0] if below else None
    curve = gpu_records.curve_for(gpu.name, args.target) if gpu.name in presets.GPUS else None
    held = None if curve is None else gpu_records.hold_against(
        curve, setup.bandwidth, setup.flops, setup.target, None if setup.calibration.is_ideal else setup.calibration,
        setup.overhead_s).as_dict()
    fit = costmodel.memory_fit(setup, gpu.memory)
    memory = None if fit is None else {"gpu_gb": fit.memory / 1e9, "weights_gb": fit.weights / 1e9,
                                       "kv_per_row_gb": fit.kv_per_row / 1e9, "max_rows": fit.max_rows}
    return {"label": ESTIMATE, "recorded": held, "memory": memory,
            "model": args.model, "stack": None if args.model == "ideal" else stack_name(args.stack),
            "calibration": setup.calibration.name,
            "calibration_source": setup.calibration.source, "gpu": gpu.name, "target": args.target,
            "draft": args.draft, "alpha": args.alpha, "context": args.context,
            "rows": [{"batch_size": r["batch_size"], "depth": r["depth"], "tokens_per_s": r["tokens_per_s"],
                      "speedup": r["speedup"]} for r in rows],
            "best_depth": {str(b): k for b, k in costmodel.best_depths(rows).items()},
            "crossover_batch": costmodel.crossover_from_rows(rows), "crossover_batch_by_depth": by_depth}


# --- comparisons with measurements ---------------------------------------------------------------------

def published_report() -> dict:
    series = profiles.load_published()
    if not series:
        raise WhatIfError(f"no published measurements readable in {profiles.PUBLISHED_FILE}")
    gpu = presets.resolve_gpu(series[0].gpu)
    base = calibration("calibrated", gpu)
    out = []
    # the calibrated model with each stack's fitted bookkeeping; without it (the pass-time fit alone); ideal
    for model, cal, per_stack in (("calibrated", base, True), ("calibrated, no stack fit", base, False),
                                  ("ideal", costmodel.IDEAL, False)):
        for c in profiles.compare_all(series, cal, per_stack):
            out.append({"model": model, "stack": c.series.stack, "series": c.series.id, "label": profiles.PUBLISHED_LABEL,
                        "source": c.series.source, "draft": c.series.draft, "depth": c.series.depth,
                        "context": c.series.context, "alpha": round(c.alpha, 4), "alpha_from": c.alpha_note,
                        "batch_sizes": c.series.batch_sizes, "published": c.series.speedup,
                        "estimate": [round(x, 3) for x in c.estimate],
                        "error": [round(x, 3) for x in c.errors], "max_abs_error": round(c.max_error, 3),
                        "crossover_estimate": c.crossover, "crossover_published": c.published_crossover})
    return {"label": ESTIMATE, "comparisons": out, "stack_fits": stack_fits(series, base)}


def stack_fits(series, base: costmodel.Calibration) -> list[dict]:
    """Each stack's fitted bookkeeping, its worst error on the series it was fitted to, and each series'
    error when fitted to the others only (the honest, held-out figure)."""
    out = []
    for stack in sorted({s.stack for s in series}):
        fit = profiles.fit_stack(stack, base, series)
        if fit is None:
            continue
        out.append({"stack": stack, "row_overhead_us": round(1e6 * fit.row_overhead_s, 1),
                    "fitted_to": list(fit.fitted_to), "max_abs_error": round(fit.max_error, 3),
                    "held_out": [{"series": sid, "row_overhead_us": round(1e6 * x, 1), "max_abs_error": round(e, 3)}
                                 for sid, x, e in fit.held_out]})
    return out


def sweeps_report() -> dict:
    """Every recorded sweep against three models, each sweep with the profile recorded on its forward path."""
    recorded, pairs, skipped = profiles.load_profiles(), [], []
    for sw in profiles.load_sweeps():
        why = profiles.cannot_model(sw)
        prof = None if why else profiles.profile_for_sweep(recorded, sw)
        if why is None and prof is None:
            why = f"no profile in assets/profiles/ of {sw.target} on {sw.device} to take its pass times from"
        if why:
            skipped.append({"sweep": sw.name, "why": why})
        else:
            pairs.append((sw, prof))
    if not pairs:
        raise WhatIfError("needs a recorded sweep in assets/sweeps/ and a profile in assets/profiles/ of its model on its "
                          "device" + "".join(f"; skipped {s['sweep']}: {s['why']}" for s in skipped))
    out = []
    for model in ("measured pass curve", "calibrated", "ideal"):
        for sw, prof in pairs:
            # the profile's measured pass times themselves; the calibrated rule fitted to them; the roofline
            curve = tuple(zip(prof.tokens_per_pass, prof.latency_s)) if model == "measured pass curve" else ()
            cal = profiles.profile_calibration(prof) if model == "calibrated" else costmodel.IDEAL
            out.append(_sweep_row(model, sw, prof, cal, curve))
    return {"label": ESTIMATE, "profiles": sorted({prof.name for _, prof in pairs}), "comparisons": out,
            "skipped": skipped}


def _sweep_row(model: str, sw, prof, cal: costmodel.Calibration, curve: tuple) -> dict:
    c = profiles.compare_sweep(sw, cal, prof.bandwidth, prof.flops, curve)
    abs_err, rel_err = c.errors(), c.errors(relative_to_plain=True)
    return {"model": model, "sweep": sw.name, "path": sw.path, "profile": prof.name, "command": sw.command,
            "alpha": c.alpha, "calibration": f"{prof.name} measured pass times" if curve else cal.name,
            "batch_sizes": sw.batch_sizes, "depths": sw.depths, "measured_tokens_per_s": sw.tokens_per_s,
            "estimate_tokens_per_s": [[round(x, 1) for x in row] for row in c.estimate],
            "mean_abs_error": round(sum(map(abs, abs_err)) / len(abs_err), 3),
            "max_abs_error": round(max(map(abs, abs_err)), 3),
            "share_within_20pct": round(sum(abs(e) <= 0.2 for e in abs_err) / len(abs_err), 3),
            "speedup_mean_abs_error": round(sum(map(abs, rel_err)) / len(rel_err), 3),
            "speedup_max_abs_error": round(max(map(abs, rel_err)), 3)}


def recorded_report() -> dict:
    """Every recorded GPU curve against the calibrated and the ideal estimate for its GPU and model presets."""
    curves = gpu_records.recorded_curves()
    if not curves:
        raise WhatIfError(f"no recorded GPU run readable in {gpu_records.GPU_DIR}")
    out = []
    for c in curves:
        held = gpu_records.preset_estimates(c)
        for model, h in (held or {}).items():
            out.append({"estimate": model, **h.as_dict()})
        if held is None:
            out.append({"estimate": None, "recorded": str(c.label), "note": "no GPU or model preset names it"})
    return {"label": ESTIMATE, "comparisons": out}


# --- plain text -----------------------------------------------------------------------------------------

def render(out: dict) -> str:
    if "rows" in out:
        lines = [f"{ESTIMATE}s ({out['model']}: {out['calibration']}) — {out['target']} + {out['draft']} on "
                 f"{out['gpu']}, α = {out['alpha']}, context {out['context']}",
                 "tokens/s: all rows together",
                 f"{'batch':>6} {'depth':>5} {'tokens/s':>12} {'speed-up':>9}"]
        lines += [f"{r['batch_size']:>6} {r['depth']:>5} {r['tokens_per_s']:>12.1f} {r['speedup']:>8.2f}×"
                  for r in out["rows"]]
        cross = out["crossover_batch"]
        lines.append(f"speculation stops paying from batch {cross}" if cross else
                     "speculation still pays at the largest batch")
        if out.get("memory"):
            lines.append(_memory_line(out["gpu"], out["context"], out["memory"]))
        if out.get("recorded"):
            lines.append(_recorded_line(out["model"], out["recorded"]))
        return "\n".join(lines)
    lines = [f"{f['stack']}: bookkeeping {f['row_overhead_us']:.0f} µs per sequence per speculative step, fitted "
             f"to {', '.join(f['fitted_to'])} (max error {100 * f['max_abs_error']:.0f} %); held out: "
             + "; ".join(f"{h['series']} {100 * h['max_abs_error']:.0f} %" for h in f["held_out"])
             for f in out.get("stack_fits", [])]
    for c in out["comparisons"]:
        if "recorded" in c:
            lines.append(_recorded_line(c["estimate"], c) if c["estimate"] else f"{c['recorded']}: {c['note']}")
        elif "series" in c:
            lines.append(f"{c['model']:>10} {c['series']}: α = {c['alpha']:.3f} ({c['alpha_from']}), max error "
                         f"{100 * c['max_abs_error']:.0f} %, crossover {c['crossover_estimate']} "
                         f"(published {c['crossover_published']})")
        else:
            lines.append(f"{c['model']:>10} {c['sweep']}: tokens/s mean error {100 * c['mean_abs_error']:.0f} %, "
                         f"max {100 * c['max_abs_error']:.0f} %; speed-up mean {100 * c['speedup_mean_abs_error']:.0f} %")
    lines += [f"skipped {s['sweep']}: {s['why']}" for s in out.get("skipped", [])]
    return "\n".join(lines)


def _memory_line(gpu: str, context: int, m: dict) -> str:
    """The estimate's memory check (weights in bf16 and KV caches only): does the pair fit, how many rows."""
    head = f"memory ({ESTIMATE}, weights and KV cache only): weights {m['weights_gb']:.1f} GB of {gpu}'s {m['gpu_gb']:.0f} GB"
    if not m["max_rows"]:
        return head + ": the weights do not fit; every row above describes a GPU with more memory"
    return head + f"; {m['kv_per_row_gb']:.2f} GB of KV cache a row at context {context}: {m['max_rows']} rows fit"


def _recorded_line(model: str, r: dict) -> str:
    """One recorded curve against one estimate: measured and estimated ms at the first and last point."""
    m, e, n = r["measured_ms"], r["estimate_ms"], r["tokens_per_pass"]
    return (f"{r['recorded']}, context {r['context']}: {n[0]} token {m[0]:.2f} ms measured vs {e[0]:.2f} ms "
            f"{model} estimate ({m[0] / e[0]:.1f}×); {n[-1]} tokens {m[-1]:.2f} vs {e[-1]:.2f} ms ({m[-1] / e[-1]:.1f}×)")
