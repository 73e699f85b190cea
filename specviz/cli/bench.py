"""`python -m specviz bench-hf`: our engine against transformers' own decoding, same pair, same prompt.

At B = 1 it times, after a warm-up and interleaved so that machine noise hits all alike:
- ours at depth k, ours at depth 0,
- transformers' assisted generation (`assistant_model=draft`, constant k, no confidence cut-off; for
  `--draft ngram`, `prompt_lookup_num_tokens=k`; none exists for layerskip),
- transformers' plain greedy `generate()`,
checks that every greedy output is identical, and prints a final JSON line with the ratios of our
tokens/s to theirs (medians). With --batch-size B > 1 it compares against plain batched `generate()`
(transformers' assisted generation supports batch size 1 only).
Tokens/s here is end to end (prefill included) for both sides, so the comparison is like for like.
`assisted_skipped` says why the assisted arm did not run where it did not (batch > 1, a layer-skip or a
synthetic draft: transformers' assisted generation needs a draft model or prompt lookup).
With `--draft synthetic:A` (specviz.cli.dial) each of our engines' reference is decoded first, at depth 0 on
the same batch, and reported apart in `synthetic` (`reference_s`, `realigned`, `unreferenced`), never in a
timed figure. `outputs` holds our depth-k rows, `prompt_ids` the rows' prompts.
With --compile on|auto, "ours" runs the fast path (specviz.fastpath); the warm-up repetition then
includes compiling, reported as `warmup_s`, and the extra variants `ours_k_eager` / `ours_k0_eager`
(our engine on the stock modules, interleaved with the rest, so both meet the same machine noise)
measure whether the fast path paid on this machine. `verify_ms_k0` is the median one-token target pass
inside our engine at depth 0 (B rows). `path` and `layout` say which forward path ran "ours" and which
weight layouts served it (specviz.fastpath.layout); on the graph path `graphs` holds its counters
(shapes captured, compilations and captures after warm-up, replays, passes run eagerly, tokens given
and tokens computed after padding).
Losslessness: every variant's rows against plain `generate()`'s; `divergence` holds, per variant that
differs, each row's first divergence and whether it is a near-tie (specviz.engine.divergence); `lossless`
is false when one of ours is above the rule — a bug, reported on stderr with exit status 1.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from specviz.cli.args import int_in
from specviz.cli.common import DEFAULT_PROMPTS, add_compile_arg, add_dtype_arg, add_pair_args, exact_dtype
from specviz.cli.dial import Dial
from specviz.engine.divergence import compare_rows
from specviz.engine.request import Knobs
from specviz.limits import check_prompt_text
from specviz.serve.door import check_knobs
from specviz.serve.heap import freeze_long_lived


def add_parser(sub) -> None:
    p = sub.add_parser("bench-hf", help="time our engine against transformers generate()")
    add_pair_args(p)
    p.add_argument("--depth", type=int, default=4, help="draft tokens per step (0 = plain decoding)")
    p.add_argument("--max-new-tokens", type=int_in(1, 4096), default=64)
    p.add_argument("--batch-size", type=int, default=1, help="rows decoded together")
    p.add_argument("--prompt", default=DEFAULT_PROMPTS[0])
    p.add_argument("--repeats", type=int_in(1, 20), default=3, help="timed runs per variant (median reported)")
    p.add_argument("--raw", action="store_true", help="feed the prompt as is (no chat template)")
    add_compile_arg(p)
    add_dtype_arg(p)
    p.set_defaults(func=run)


def _ours(pair, prompts, depth, max_new, batch, refs=None, dial: Dial | None = None):
    """One run of our engine; `refs`: a synthetic draft's reference (decoded beforehand, untimed), whose
    drafter's counters go to `dial`."""
    engine = pair.engine()
    verify = []
    t0 = time.perf_counter()
    for ev in engine.generate(prompts, Knobs(depth=depth, batch_size=batch), max_new, references=refs):
        verify.append(ev.verify_s)
    secs = time.perf_counter() - t0
    if dial is not None:
        dial.count(engine.drafter)
    outs = list(engine.outputs().values())
    # verify: the target pass time of every step (prefill is timed apart)
    return sum(map(len, outs)), secs, outs, engine.totals, verify


def _hf(pair, prompts, max_new, **extra):
    tok, model = pair.tokenizer, pair.target.model
    width = max(map(len, prompts))
    pad = tok.pad_token_id if tok.pad_token_id is not None else pair.target.eos_ids[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=pair.target.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=ids.device)
    eos = pair.target.eos_ids
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new, pad_token_id=pad,
                         eos_token_id=eos, temperature=None, top_p=None, top_k=None, **extra)
    if pair.target.device.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    outs = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        outs.append(row[:cut])
    return sum(map(len, outs)), secs, outs


def _assisted_kwargs(pair, depth):
    if pair.draft is not None:
        # transformers reads these from the *assistant's* generation config, not from generate()'s
        # arguments: left unset, the assistant would stop drafting below 0.4 confidence (its default)
        gc = pair.draft.model.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = depth, "constant"
        gc.assistant_confidence_threshold = 0.0
        return {"assistant_model": pair.draft.model, "num_assistant_tokens": depth,
                "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    if pair.draft_ref == "ngram":
        return {"prompt_lookup_num_tokens": depth}
    return None  # layerskip, synthetic: transformers has no equivalent for a draft without its own weights


def _assisted_skipped(pair, batch: int) -> str | None:
    """Why transformers' assisted generation is not among the arms (None: it is)."""
    if pair.synthetic is not None:
        return ("not run: transformers' assisted generation needs a draft model (or prompt lookup), and a "
                "synthetic draft is neither; ours with the synthetic draft is compared with plain generate()")
    if batch > 1:
        return "not run: transformers' assisted generation supports batch size 1 only"
    if pair.draft is None and pair.draft_ref != "ngram":
        return "not run: transformers has no layer-skip draft (a draft without weights of its own)"
    return None


def run(args) -> int:
    # on first use: transformers is slow to import
    from specviz.pairs.pipeline import encode_prompt, load_pair

    checked = check_knobs(args.depth, args.batch_size)
    check_prompt_text(args.prompt)             # before the model loads
    pair = load_pair(args.target, args.draft, args.device, compile=args.compile, dtype=exact_dtype(args))
    if pair.fast.note:
        print(f"specviz: --compile {pair.fast.note}")
    prompt = encode_prompt(pair.tokenizer, args.prompt, raw=args.raw)
    B, k, N = checked.batch, checked.depth, args.max_new_tokens
    prompts = [prompt] * B
    last_totals = {}
    dial = Dial.of(pair)
    # a synthetic draft's reference, before anything is timed; each row draws its coins by its row id
    refs = dial.reference(pair.engine(), prompts, B, N)
    if dial.on:
        print(f"specviz: {dial.as_dict()['note']}")

    def ours_k():
        n, secs, outs, last_totals["k"], _ = _ours(pair, prompts, k, N, B, refs, dial)
        return n, secs, outs

    def ours_k0():
        n, secs, outs, _, last_totals["verify_k0"] = _ours(pair, prompts, 0, N, B, refs, dial)
        return n, secs, outs

    variants = {"ours_k": ours_k, "ours_k0": ours_k0, "plain": lambda: _hf(pair, prompts, N)}
    if pair.fast.on:       # the same engine on the stock modules: did the fast path pay here?
        eager = load_pair(args.target, args.draft, args.device, target=pair.target, draft=pair.draft,
                          compile="off", dtype=exact_dtype(args))
        eager_refs = dial.reference(eager.engine(), prompts, B, N)
        variants["ours_k_eager"] = lambda: _ours(eager, prompts, k, N, B, eager_refs, dial)[:3]

        def ours_k0_eager():
            n, secs, outs, _, last_totals["verify_k0_eager"] = _ours(eager, prompts, 0, N, B, eager_refs, dial)
            return n, secs, outs
        variants["ours_k0_eager"] = ours_k0_eager
    skipped = _assisted_skipped(pair, B)
    kw = _assisted_kwargs(pair, k) if skipped is None else None
    if kw is not None:
        variants["assisted"] = lambda: _hf(pair, prompts, N, **kw)
    rates = {name: [] for name in variants}
    outputs, warmup = {}, {}
    for rep in range(args.repeats + 1):          # repetition 0 is the warm-up (and compiles)
        if rep == 1:
            freeze_long_lived()      # warm: the collector's full passes no longer walk the models (as the app)
        for name, fn in variants.items():
            n, secs, outs = fn()
            outputs[name] = outs
            if rep:
                rates[name].append(n / secs)
            else:
                warmup[name] = secs
    med = {name: statistics.median(v) for name, v in rates.items()}
    identical = all(o == outputs["plain"] for o in outputs.values())
    reports = {name: compare_rows(pair.target.model, pair.target.device, prompts, outs, outputs["plain"])
               for name, outs in outputs.items() if name != "plain" and outs != outputs["plain"]}
    # transformers' own assisted generation is reported, but a bug there is not ours to fail on
    bugs = {name: r.bugs for name, r in reports.items() if name.startswith("ours") and r.bugs}
    totals = last_totals["k"]          # from the last timed run of our engine at depth k
    result = {
        "target": args.target, "draft": args.draft, "batch_size": B, "depth": k, "max_new_tokens": N,
        "tokens_per_s": med, "vs_plain": med["ours_k0"] / med["plain"],
        "spec_vs_plain": med["ours_k"] / med["plain"],
        "vs_assisted": med["ours_k"] / med["assisted"] if "assisted" in med else None,
        "assisted_skipped": skipped,
        "identical": identical, "lossless": not bugs,
        "divergence": {name: r.as_dict() for name, r in reports.items()},
        "acceptance_rate": totals.acceptance_rate,
        "overhead_share": totals.overhead_share, "repeats": args.repeats,
        "tokens": len(outputs["plain"][0]),
        "path": pair.fast.label, "fast_path": pair.fast.on, "layout": pair.fast.layout or "stock (transformers)",
        "warmup_s": warmup,
        "verify_ms_k0": 1e3 * statistics.median(last_totals["verify_k0"] or [0.0]),
        "synthetic": dial.as_dict(),
        "prompt_ids": prompts, "outputs": outputs["ours_k"],
    }
    if "ours_k0_eager" in med:
        result["fast_vs_eager"] = med["ours_k0"] / med["ours_k0_eager"]
        result["fast_vs_eager_k"] = med["ours_k"] / med["ours_k_eager"]
        result["verify_ms_k0_eager"] = 1e3 * statistics.median(last_totals["verify_k0_eager"] or [0.0])
    stats = pair.fast.graph_stats()
    result["graphs"] = stats.as_dict() if stats is not None else None
    print(f"     path: {pair.fast.label} ({'fast' if pair.fast.on else 'eager'}); {result['layout']}")
    if stats is not None:
        print(f"   graphs: {stats.line()}")
    for name, v in med.items():
        print(f"{name:>9}: {v:8.2f} tok/s (median of {args.repeats})")
    if skipped:
        print(f" assisted: {skipped}")
    if dial.on:
        print(f"reference: {dial.reference_s:.2f} s at depth 0 (untimed, in no figure above); "
              f"{dial.realigned} rows re-aligned, {dial.unreferenced} without a reference")
    decode = pair.tokenizer.decode
    for name, r in reports.items():
        print(f"{name:>9}: " + " ".join(r.sentences(decode)))
    print(json.dumps(result))
    for name, found in bugs.items():
        for d in found:
            print(f"specviz: error: {name}: {d.said(decode)}", file=sys.stderr)
    return 1 if bugs else 0
