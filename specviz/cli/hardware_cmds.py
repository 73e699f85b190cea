"""`python -m specviz calibrate | roofline | sweep`: measure this machine.

The sweep times every (batch B, depth k) cell on a fresh engine, B rows of one prompt. With `--draft
synthetic:A` each batch size's reference (the same B rows at depth 0, specviz.cli.dial) is decoded first,
untimed, and reported apart in `synthetic`; every row keeps its own coins (seed 0, its row id), so every
depth draws the same ones. sweep.json also holds each cell's generated rows (`outputs`) and the prompt's ids
(`prompt_ids`); recorded.json is the sweep as `assets/sweeps/` keeps it (specviz.cli.sweep_record)."""
from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

from specviz.cli.args import device, int_in, int_list, model_ref, out_file, out_folder
from specviz.cli.common import (DEFAULT_PROMPTS, add_compile_arg, add_pair_args, charts, refuse_vllm_only,
                                write_chart, wrote)
from specviz.cli import sweep_record
from specviz.cli.dial import Dial
from specviz.cli.sweep_vllm import run_sweep_vllm
from specviz.engine.request import Knobs
from specviz.fastpath import GRAPH_MODES, cache_factory, forwardchoice, resolve
from specviz.fastpath.buckets import for_roofline
from specviz.fastpath.layout import forget
from specviz.hardware.costmodel import best_depths, crossover_from_rows
from specviz.hardware.device import (cached_peaks, calibrate, cpu_name, device_name, find_knee, measure_latency,
                                     paired_roofline)
from specviz.hardware.presets import named_by_shape
from specviz.hardware.profiles import spec_to_dict
from specviz.hardware.roofline import pass_cost, predicted_knee, spec_from_config
from specviz.lessons import Said
from specviz.limits import LimitError, check_prompt_text
from specviz.pairs.models import load_model, parse_draft_ref, pick_device
from specviz.serve.heap import freeze_long_lived
from specviz.vllm.client import VllmError


# what only `--engine vllm` reads, and its default
VLLM_ONLY = {"schedule": "1-4:4,5-8:2,9-256:1", "vllm_eager": False}


def add_parsers(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this device's copy bandwidth and matmul FLOP/s "
                                         "(stored in the cache; the app uses it)")
    p.add_argument("--device", default=None, type=device, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.set_defaults(func=run_calibrate)

    p = sub.add_parser("roofline", help="measure target latency against tokens per pass and find the knee")
    p.add_argument("--target", default="smollm2-135m-offline", type=model_ref(),
                   help="the model measured: a model reference, or shape:NAME[@DIR] (a preset's shape, random weights)")
    p.add_argument("--device", default=None, type=device, help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--max-tokens", type=int_in(1, 8192), default=None,
                   help="largest tokens per pass (default: CPU 128, GPU 512)")
    p.add_argument("--context", type=int_in(0, 32768), default=256, help="cached tokens each pass attends to")
    p.add_argument("--repeats", type=int_in(1, 50), default=3, help="timed passes per width (median reported)")
    p.add_argument("--out", default="runs/roofline", type=out_folder,
                   help="folder for roofline.json and roofline.html, replaced if there (default runs/roofline)")
    p.add_argument("--profile", default=None, type=out_file,
                   help="also write the result as a recorded profile (e.g. assets/profiles/NAME.json)")
    add_compile_arg(p)
    p.set_defaults(func=run_roofline)

    p = sub.add_parser("sweep", help="measure throughput over batch sizes × depths")
    add_pair_args(p)
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64", type=int_list(1, 64),
                   help="rows decoded together, comma-separated (1-64)")
    p.add_argument("--depths", default="0,1,2,4,8", type=int_list(0, 16),
                   help="draft tokens per step, comma-separated (0-16; 0 = plain decoding, which the crossover needs)")
    p.add_argument("--max-new-tokens", type=int_in(1, 4096), default=32, help="tokens each row decodes (1-4096)")
    p.add_argument("--prompt", default=DEFAULT_PROMPTS[0])
    p.add_argument("--out", default="runs/sweep", type=out_folder,
                   help="folder for sweep.csv, sweep.json, recorded.json (the layout of assets/sweeps/), sweep.html "
                        "and (our engine) crossover.html, replaced if there (default runs/sweep)")
    p.add_argument("--engine", choices=("specviz", "vllm"), default="specviz",
                   help="vllm: one local vLLM server per depth, launched in turn (needs scripts/vllm-setup; "
                        "--draft ngram or a draft model)")
    p.add_argument("--schedule", default=VLLM_ONLY["schedule"],
                   help="vLLM only: also run vLLM's dynamic schedule (num_speculative_tokens_per_batch_size) "
                        "as LO-HI:K entries; 'none' skips it")
    p.add_argument("--vllm-eager", action="store_true", help="vLLM only: launch with --enforce-eager")
    p.add_argument("--repeats", type=int_in(1, 9), default=1,
                   help="timed runs per cell, the median kept (for an even number, the faster middle one); our "
                        "engine runs them in rounds over the whole grid, vLLM back to back on each server "
                        "(1-9, default 1)")
    add_compile_arg(p)
    p.set_defaults(func=run_sweep)


def run_calibrate(args) -> int:
    device = pick_device(args.device)
    peaks = cached_peaks(device, refresh=True)   # measure now; the app reuses it
    if peaks.device == "cpu":
        forget()          # the fast path's weight layouts are re-timed at the next model load, beside these
    else:
        forwardchoice.forget(device)      # and on a GPU, which forward the graph path runs
    print(json.dumps({"device": peaks.device, "dtype": peaks.dtype, "bandwidth_GBps": peaks.bandwidth / 1e9,
                      "flops_TFLOPs": peaks.flops / 1e12, "ridge_flop_per_byte": peaks.ridge}))
    return 0


def run_roofline(args) -> int:
    loaded = load_model(args.target, args.device)
    cap = args.max_tokens or (512 if loaded.device.type == "cuda" else 128)
    ns = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512} & set(range(1, cap + 1)) | {cap})
    peaks = calibrate(loaded.device, loaded.dtype)
    choice = resolve(args.compile, loaded.device)                                   # --compile: which path
    new_cache, fast = cache_factory(loaded.model, choice, _roofline_buckets(choice, ns, args.context))
    secs = measure_latency(loaded.model, ns, args.context, loaded.device, loaded.dtype, args.repeats, new_cache)
    spec = spec_from_config(loaded.config_dict, args.target, 2.0 if loaded.device.type == "cuda" else 4.0)
    result = {"target": args.target, "device": peaks.device, "device_name": device_name(loaded.device),
              "cpu": cpu_name(),
              "recorded": time.strftime("%Y-%m-%d"),
              "path": fast.label, "layout": fast.layout or "stock (transformers)",
              "dtype": peaks.dtype, "context": args.context, "model_spec": spec_to_dict(spec),
              "tokens_per_pass": ns, "latency_s": secs, "measured_knee": find_knee(ns, secs),
              "predicted_knee": predicted_knee(spec, peaks.bandwidth, peaks.flops, args.context),
              "bandwidth": peaks.bandwidth, "flops": peaks.flops,
              # MBU of a one-token pass: bytes it must stream (from the model shape) ÷ time ÷ calibrated peak
              "mbu_at_1_token": pass_cost(spec, 1, 1, args.context).bytes / secs[0] / peaks.bandwidth
              if 1 in ns else None}
    if result["mbu_at_1_token"]:          # the issue-18 goal: a one-token pass ≤ 1.3× weights ÷ bandwidth
        # against the calibration above (taken minutes earlier), and in bandwidth/pass pairs (robust to drift)
        result["pass_vs_roofline_1_token_unpaired"] = 1 / result["mbu_at_1_token"]
        pairs = paired_roofline(loaded.model, args.context, loaded.device, loaded.dtype,
                                pass_cost(spec, 1, 1, args.context).bytes, args.repeats, new_cache)
        result["pass_vs_roofline_pairs"] = pairs
        result["pass_vs_roofline_1_token"] = sorted(pairs)[len(pairs) // 2]
    graphed = _graphed(fast, ns, args.context)
    if graphed is not None:
        stats = fast.graph_stats()
        result.update(graphs=stats.as_dict(), in_graph=graphed,
                      graph_max_tokens=max((n for n, g in zip(ns, graphed) if g), default=0))
    print(f"path: {fast.shown}" + (f" ({fast.note})" if fast.note else ""))
    for i, (n, t) in enumerate(zip(ns, secs)):
        beyond = graphed is not None and not graphed[i]
        print(f"{n:5d} tokens/pass: {1000 * t:8.2f} ms  ({n / t:8.1f} tokens/s)"
              + ("  eager: beyond the graph path's largest bucket" if beyond else ""))
    if graphed is not None:
        print(f"graphs: {fast.graph_stats().line()}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "roofline.json").write_text(json.dumps(result, indent=1))
    if args.profile:
        Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
        Path(args.profile).write_text(json.dumps(result, indent=1))
    write_chart(out / "roofline.html",
                lambda: charts().knee_figure(ns, secs, result["measured_knee"], result["predicted_knee"]))
    wrote(out, "roofline.json", "roofline.html", also=args.profile)
    print(json.dumps({k: result.get(k) for k in ("measured_knee", "predicted_knee", "mbu_at_1_token",
                                                  "pass_vs_roofline_1_token", "pass_vs_roofline_1_token_unpaired",
                                                  "path", "layout", "graph_max_tokens")}))
    return 0


ROOFLINE_GRAPH_TOKENS = 1024     # the widest pass the roofline captures; wider ones run eagerly, labelled


def _roofline_buckets(choice, ns: list[int], context: int):
    """On the graph path: one row, every measured width up to ROOFLINE_GRAPH_TOKENS (SPECVIZ_GRAPH_BUCKETS
    overrides); None elsewhere."""
    if choice.mode not in GRAPH_MODES:
        return None
    # on first use: torch is slow to import
    from specviz.fastpath.graphs import env_buckets

    return env_buckets() or for_roofline(ns, context, ROOFLINE_GRAPH_TOKENS)


def _graphed(fast, ns: list[int], context: int) -> list[bool] | None:
    """Per width, whether its timed pass replayed a captured shape (the second pass of the width on a
    cache of `context` tokens); None off the graph path."""
    if not fast.runners:
        return None
    target = fast.runners[0]
    return [target.pick(1, n, context + n) is not None for n in ns]


def _sweep_cell(pair, prompt, b: int, k: int, max_new: int, refs, target) -> tuple[dict, list, object]:
    """One timed run of a cell on a fresh engine: its row of figures, the rows it generated, its drafter."""
    eng = pair.engine()
    before = target.stats() if target else None
    t0 = time.perf_counter()
    list(eng.generate([prompt] * b, Knobs(depth=k, batch_size=b), max_new, references=refs))
    wall = time.perf_counter() - t0
    t = eng.totals
    row = {"batch_size": b, "depth": k, "tokens_per_s": t.tokens / wall, "decode_tokens_per_s": t.tokens_per_s,
           "acceptance_rate": t.acceptance_rate, "flops_ratio": t.flops_ratio, "tokens": t.tokens,
           "drafted": t.drafted, "accepted": t.accepted, **t.per_step_ms(),
           **(_padding(before, target.stats()) if target else {})}
    return row, list(eng.outputs().values()), eng.drafter


def _write_record(path: Path, args, rows, batches, depths, pair, prompt_tokens: int) -> None:
    """recorded.json: the sweep as assets/sweeps/ keeps it (what `whatif --sweeps` compares with)."""
    # the what-if's models need presets' shapes: a model of the same shape names it, else the reference stays
    target = named_by_shape(pair.target_spec, args.target)
    draft = named_by_shape(pair.draft_spec, args.draft) if pair.draft is not None else args.draft
    rec = sweep_record.ours(args, rows, batches, depths, target=target, draft=draft, path=pair.fast.label,
                            dtype=str(pair.target.dtype).removeprefix("torch."),
                            device=device_name(pair.target.device), cpu=cpu_name(), prompt_tokens=prompt_tokens)
    path.write_text(sweep_record.dumps(rec))


def run_sweep(args) -> int:
    # on first use: transformers is slow to import
    from specviz.pairs.pipeline import encode_prompt, load_pair

    batches, depths = args.batch_sizes, args.depths
    refuse_vllm_only(args, VLLM_ONLY)
    check_prompt_text(args.prompt)             # before a model loads or a server starts
    if args.engine == "vllm":
        if parse_draft_ref(args.draft).kind == "synthetic":
            raise VllmError(Said("errors.vllm.no_synthetic", draft=args.draft))
        return run_sweep_vllm(args, batches, sorted(set(depths)))
    pair = load_pair(args.target, args.draft, args.device, compile=args.compile)
    prompt = encode_prompt(pair.tokenizer, args.prompt)
    dial = Dial.of(pair)
    # a synthetic draft's references come first: B rows at depth 0 per batch size, untimed
    refs = {b: dial.reference(pair.engine(), [prompt], b, args.max_new_tokens) for b in batches}
    if dial.on:
        print(dial.as_dict()["note"], file=sys.stderr)
    list(pair.engine().generate([prompt], Knobs(depth=max(depths), batch_size=1), 4,
                                references=refs[batches[0]]))   # warm-up
    # as the app once its pair is warm: a full collection walking the models and compiler would stall one
    # cell for a tenth of a second or more (on a GPU, longer than a whole batch-1 cell)
    freeze_long_lived()
    repeats = args.repeats
    runs, total, done = {}, len(batches) * len(depths) * repeats, 0
    target = pair.fast.runners[0] if pair.fast.runners else None     # the graph path's target runner
    # rounds over the whole grid: a burst of other load lands on one run of many cells, not on every run of one
    for _ in range(repeats):
        for b in batches:
            for k in depths:
                run = _sweep_cell(pair, prompt, b, k, args.max_new_tokens, refs[b], target)
                runs.setdefault((b, k), []).append(run)
                row = run[0]
                done += 1
                bar = "#" * (30 * done // total)
                print(f"\r[{bar:<30}] {done}/{total} B={b} k={k}: {row['tokens_per_s']:7.1f} tok/s", end="",
                      file=sys.stderr, flush=True)
    # each cell the run of median throughput (its rows are the same in every run: greedy, or seeded coins);
    # the synthetic draft's counters are the kept runs', as its figures are
    kept = [sorted(runs[b, k], key=lambda r: r[0]["tokens_per_s"])[repeats // 2] for b in batches for k in depths]
    for _, _, drafter in kept:
        dial.count(drafter)
    rows = [{**row, "runs": repeats} for row, _, _ in kept]
    outputs = [o for _, o, _ in kept]
    print(file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "sweep.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    best = best_depths(rows)
    # a crossover compares speculation with plain decoding: without both in the sweep there is none
    cross = crossover_from_rows(rows) if 0 in depths and any(depths) else None
    print(f"path: {pair.fast.shown}" + (f" ({pair.fast.note})" if pair.fast.note else ""))
    stats = pair.fast.graph_stats()
    if stats is not None:
        print(f"graphs: {stats.line()}")
    graphs = stats.as_dict() if stats is not None else None
    doc = json.dumps({"target": args.target, "draft": args.draft, "device_name": device_name(pair.target.device),
                      "cpu": cpu_name(), "recorded": time.strftime("%Y-%m-%d"), "path": pair.fast.label,
                      "layout": pair.fast.layout or "stock (transformers)", "graphs": graphs, "rows": rows,
                      "best_depth": best, "crossover_batch": cross, "synthetic": dial.as_dict(),
                      "prompt_ids": prompt, "outputs": None}, indent=1)
    # each cell's token rows on one line: indented, a 64-row cell would take thousands of lines
    cells = ",\n  ".join(json.dumps({"batch_size": r["batch_size"], "depth": r["depth"], "rows": o})
                          for r, o in zip(rows, outputs))
    (out / "sweep.json").write_text(doc.replace('"outputs": null', f'"outputs": [\n  {cells}\n ]'))
    _write_record(out / "recorded.json", args, rows, batches, depths, pair, len(prompt))
    write_chart(out / "sweep.html", lambda: charts().sweep_figure(rows, batches, depths))
    write_chart(out / "crossover.html", lambda: charts().crossover_figure(rows, "Measured throughput vs batch size"))
    wrote(out, "sweep.csv", "sweep.json", "recorded.json", "sweep.html", "crossover.html")
    print("batch → best depth: " + ", ".join(f"{b}→{k}" for b, k in best.items()))
    if not (0 in depths and any(depths)):
        print("no crossover: --depths needs 0 (plain decoding) and a depth above 0 to compare them")
    else:
        print(f"speculation stops paying from batch size {cross}" if cross else
              "speculation pays at every batch size measured")
    if dial.on:
        print(f"reference: {dial.reference_s:.2f} s at depth 0 (untimed, in no cell); {dial.realigned} rows "
              f"re-aligned, {dial.unreferenced} without a reference")
    print(json.dumps({"best_depth": best, "crossover_batch": cross, "path": pair.fast.label,
                      "layout": pair.fast.layout or "stock (transformers)", "graphs": graphs,
                      "synthetic": dial.as_dict()}))
    return 0


def _padding(before, after) -> dict:
    """The target's verify passes of one cell on the graph path: block tokens each was given (rows × (k + 1))
    and tokens each computed in its bucket, averaged over the cell's replays."""
    n = after.replays - before.replays
    if n <= 0:
        return {"block_tokens_per_pass": None, "padded_tokens_per_pass": None}
    return {"block_tokens_per_pass": (after.block_tokens - before.block_tokens) / n,
            "padded_tokens_per_pass": (after.padded_tokens - before.padded_tokens) / n}
