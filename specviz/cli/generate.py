"""`python -m specviz generate`: run the speculative engine and show which tokens were accepted.

Without --json the terminal view colours row 1 as it streams, like llama.cpp's --color:
green = accepted draft, red struck-through = rejected draft, blue = the target's own token
(correction or bonus), default colour = plain decoding. All rows are printed at the end.

--check compares every row with the target decoding its prompt alone (transformers' generate, greedy) and
reports "identical" or each row's first divergence under the near-tie rule (specviz.engine.divergence);
with --json the final object carries it as `lossless`. A divergence above the rule is a bug: exit 1."""
from __future__ import annotations

import json
import sys

from specviz.cli.common import (DEFAULT_PROMPTS, add_compile_arg, add_dtype_arg, add_pair_args, add_run_args,
                                check_run_args, exact_dtype, graphs_of, knobs_for)
from specviz.engine.divergence import check_against_target
from specviz.engine.synthetic import reference_run
from specviz.lessons import Said
from specviz.limits import LimitError

GREEN, RED, BLUE, DIM, RESET = "\x1b[32m", "\x1b[9;31m", "\x1b[34m", "\x1b[2m", "\x1b[0m"


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate with speculative decoding")
    add_pair_args(p)
    add_run_args(p)
    add_compile_arg(p)
    add_dtype_arg(p)
    p.add_argument("--json", action="store_true", help="one JSON object per step, then a final one")
    p.add_argument("--check", action="store_true",
                   help="compare every row with the target decoding its prompt alone (greedy only): identical, or "
                        "each row's first divergence and whether it is a near-tie; exit 1 on a bug")
    p.set_defaults(func=run)


def step_json(ev, decode) -> dict:
    return {"step": ev.step, "batch_size": ev.batch_size, "depth": ev.depth, "policy": ev.policy,
            "draft_s": ev.draft_s, "verify_s": ev.verify_s, "overhead_s": ev.overhead_s,
            "wall_s": ev.wall_s, "prefill_s": ev.prefill_s, "tokens_per_pass": ev.tokens_per_pass,
            "context": ev.context, "draft_flops": ev.draft_flops, "draft_bytes": ev.draft_bytes,
            "target_flops": ev.target_flops, "target_bytes": ev.target_bytes, "plain_flops": ev.plain_flops,
            "changes": ev.changes, "retired": ev.retired,
            "rows": [{"row": r.row, "drafted": r.drafted, "accepted": r.accepted, "emitted": r.emitted,
                      "last_kind": r.last_kind, "done": r.done, "finish": r.finish,
                      "text": decode(r.emitted)} for r in ev.rows]}


def colour_row(r, decode) -> str:
    acc = decode(r.drafted[: r.accepted])
    rej = decode(r.drafted[r.accepted:])
    last = decode(r.emitted[len(r.drafted[: r.accepted]):])
    own = BLUE if r.last_kind != "plain" else ""
    return (f"{GREEN}{acc}{RESET}" if acc else "") + (f"{RED}{rej}{RESET}" if rej else "") + \
        (f"{own}{last}{RESET if own else ''}")


def run(args) -> int:
    run_args = check_run_args(args)        # numbers and policy, before any model loads
    if args.check and run_args.temperature > 0:
        raise LimitError(Said("errors.check_greedy"))
    # on first use: transformers is slow to import
    from specviz.pairs.pipeline import encode_prompt, load_pair

    pair = load_pair(args.target, args.draft, args.device, compile=args.compile, dtype=exact_dtype(args))
    if pair.fast.note:
        print(f"specviz: --compile {pair.fast.note}", file=sys.stderr)
    tok = pair.tokenizer
    texts = args.prompt or DEFAULT_PROMPTS
    prompts = [encode_prompt(tok, t, raw=args.raw) for t in texts]
    if len(prompts) > run_args.batch:
        first = "the first" if run_args.batch == 1 else f"the first {run_args.batch}"
        print(f"specviz: --batch-size {run_args.batch} runs only {first} of {len(prompts)} prompts (a row each); "
              f"--batch-size {len(prompts)} runs them all", file=sys.stderr)
    engine = pair.engine()
    refs = _reference(engine, pair, prompts, run_args)
    knobs = knobs_for(run_args)
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    tty = sys.stdout.isatty() and not args.json
    for ev in engine.generate(prompts, knobs, run_args.max_new, run_args.temperature, args.seed, references=refs):
        if args.json:
            # which forward path ran this step's passes (the fast path or the stock modules)
            print(json.dumps({**step_json(ev, decode), "path": engine.fast_label}), flush=True)
        elif tty:
            first = next((r for r in ev.rows if r.row == 0), None)
            if first is not None:
                print(colour_row(first, decode), end="", flush=True)
    outs = engine.outputs()
    t = engine.totals
    final = {"done": True, "target": args.target, "draft": args.draft, "path": pair.fast.shown,
             "graphs": graphs_of(pair.fast),
             "prompt_ids": [engine.prompt_of(i) for i in outs], "outputs": list(outs.values()),
             "texts": [tok.decode(o, skip_special_tokens=True) for o in outs.values()], **t.as_dict()}
    if refs is not None:
        final["synthetic"] = {"rate": pair.synthetic, "reference_s": refs.seconds,
                              "realigned": engine.drafter.realigned}
    report = None
    if args.check:
        report = check_against_target(pair.target.model, pair.target.device, pair.target.eos_ids,
                                      final["prompt_ids"], final["outputs"])
        final["lossless"] = report.as_dict()
    if args.json:
        print(json.dumps(final), flush=True)
        return _verdict(report, decode)
    if tty:
        print(f"\n{DIM}green = accepted draft, red = rejected draft, blue = target's own token{RESET}")
    rows = "1 row" if run_args.batch == 1 else f"{run_args.batch} rows"
    print(f"--- {args.target} with draft {args.draft}, depth {run_args.depth}, {rows}, on "
          f"{_machine(pair.target.device)}\n--- forward path: {pair.fast.shown}")
    for i, text in enumerate(final["texts"]):
        print(f"--- row {i + 1} ---\n{text}")
    acc = "n/a" if t.acceptance_rate is None else f"{t.acceptance_rate:.1%}"
    print(f"--- {t.tokens} tokens in {t.wall_s:.2f} s = {t.tokens_per_s:.1f} tok/s; acceptance {acc}; "
          f"{t.mean_accepted_length:.2f} tokens per target pass; FLOPs ×{t.flops_ratio:.2f} of plain decoding "
          f"(counted from the models' shapes)")
    if final["graphs"] is not None:
        print(f"--- graphs: {pair.fast.graph_stats().line()}")
    if report is not None:
        print("--- lossless check ---\n" + "\n".join(report.sentences(decode)))
    return _verdict(report, decode)


def _machine(device) -> str:
    """Where the figures were measured: the GPU's name, or the CPU's model as lscpu shows it."""
    # on first use: torch is slow to import
    from specviz.hardware.device import machine_name

    return machine_name(device.type)


def _verdict(report, decode) -> int:
    """Exit status of a checked run: 1 (and the bug on stderr) when a divergence is above the near-tie rule."""
    if report is None or report.lossless:
        return 0
    for d in report.bugs:
        print(f"specviz: error: {d.said(decode)}", file=sys.stderr)
    return 1


def _reference(engine, pair, prompts, run_args):
    """A synthetic draft's reference: the target's own continuation of each row, decoded first by this
    engine at depth 0 on the same batch (its time is reported apart, never in the run's figures)."""
    if pair.synthetic is None:
        return None
    if run_args.temperature > 0:
        raise LimitError(Said("errors.synthetic_sampling"))
    refs, secs = reference_run(engine, prompts, run_args.batch, run_args.max_new)
    return _Refs(refs, secs)


class _Refs(dict):
    """prompt → continuation, with the seconds the reference run took."""

    def __init__(self, refs: dict, seconds: float):
        super().__init__(refs)
        self.seconds = seconds
