"""Arguments and helpers shared by the CLI commands."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from specviz.cli.args import device, given_flags, int_in, model_ref
from specviz.engine.policies import FIXED, POLICY_NAMES, parse_table, reading
from specviz.engine.request import MAX_BATCH, Knobs
from specviz.fastpath import CompileError, check_compile
from specviz.lessons import Said
from specviz.limits import MAX_DEPTH, LimitError, check_prompt_text
from specviz.pairs.models import DTYPES, parse_draft_ref
from specviz.serve.door import RunArgs, check_run

DEFAULT_TARGET = "smollm2-135m-offline"
DEFAULT_DRAFT = "layerskip:12-17"   # measured: agrees with the full 135M model on ~59 % of greedy tokens


def add_pair_args(p) -> None:
    p.add_argument("--target", default=os.environ.get("SPECVIZ_TARGET", DEFAULT_TARGET),
                   type=model_ref("SPECVIZ_TARGET"),
                   help="target model: hub id, local dir, .gguf file or smollm2-135m-offline; shape:NAME@DIR "
                        "(a preset's shape, random weights, the tokenizer in DIR) with a synthetic draft only")
    p.add_argument("--draft", default=os.environ.get("SPECVIZ_DRAFT", DEFAULT_DRAFT),
                   type=model_ref("SPECVIZ_DRAFT"),
                   help=f"draft: a model reference, 'ngram', 'layerskip:A-B', or 'synthetic:A' (the target's own "
                        f"continuation, each drafted token right with probability A; greedy only; its reference run "
                        f"comes first, timed apart) (default {DEFAULT_DRAFT}, a layer-skip view of the target; the "
                        "app's default pair drafts with ngram)")
    p.add_argument("--device", default=None, type=device, help="cpu, cuda or cuda:N (default: cuda when available)")


def _compile_choice(value: str) -> str:
    try:
        return check_compile(value)
    except CompileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _compile_default() -> str:
    """SPECVIZ_COMPILE, where set, is --compile's default: refused by its own name where it is wrong."""
    value = os.environ.get("SPECVIZ_COMPILE", "auto")
    try:
        return check_compile(value, "SPECVIZ_COMPILE")
    except CompileError as exc:
        raise LimitError(str(exc)) from None


def compile_from_env(args) -> None:
    """Fill --compile's default from SPECVIZ_COMPILE after parsing: a wrong value then stops only the
    commands that take --compile (not `whatif`, nor any command's --help)."""
    if getattr(args, "compile", "") is None:
        args.compile = _compile_default()


def add_compile_arg(p) -> None:
    p.add_argument("--compile", default=None, type=_compile_choice,
                   help="fast path: auto (default, what the app uses) = static KV cache + compact forward where "
                        "its pass measured faster than eager on this machine (on CUDA: CUDA graphs per shape "
                        "bucket, captured at warm-up, where a replayed pass measured faster); static = that "
                        "path, eager, always; on = compiled on a CPU, CUDA graphs on CUDA; "
                        "off = stock transformers")


def add_dtype_arg(p) -> None:
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="model weights: auto (default) = bf16 on CUDA, fp32 on a CPU; float32 on CUDA, with TF32 "
                        "off, is the exact check of losslessness: it costs about twice the memory and the memory "
                        "traffic of bf16, so every pass takes about twice as long")


def exact_dtype(args) -> str | None:
    """The dtype the models load in (None: auto). --dtype float32 also switches TF32 off for this process, so
    fp32 matrix products on a GPU are not rounded to 10-bit mantissas behind the flag's back."""
    if getattr(args, "dtype", "auto") != "float32":
        return None
    # on first use: torch is slow to import
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return "float32"


def add_run_args(p) -> None:
    p.add_argument("--prompt", action="append", default=None, help="prompt text (repeatable)")
    p.add_argument("--batch-size", type=int, default=1, help=f"rows decoded together (1-{MAX_BATCH})")
    p.add_argument("--depth", type=int, default=4, help=f"draft tokens per step (0-{MAX_DEPTH}; 0 = plain)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless token for token)")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0, help="sampling seed (temperature > 0)")
    add_policy_args(p)
    p.add_argument("--raw", action="store_true", help="feed the prompt as is (no chat template)")


def add_policy_args(p) -> None:
    """--policy and its parameters; the door checks them (`check_run`), with the page's sentences."""
    p.add_argument("--policy", default=FIXED.name, help="depth policy, one of: " + ", ".join(POLICY_NAMES))
    p.add_argument("--threshold", type=float, default=None,
                   help=f"read by {' and '.join(reading('threshold'))}: the rows above which speculation "
                        "stops, or a probability")
    p.add_argument("--batch-table", default=None, help=f"{', '.join(reading('table'))}: B:K pairs, e.g. 1:6,8:2,32:0")
    p.add_argument("--max-depth", type=int, default=None,
                   help=f"{', '.join(reading('max_depth'))}: the largest depth to try")


def policy_args(args) -> dict:
    """--policy and its parameters, as the door (`check_run`) takes them. The page sends its threshold box
    with every policy and the door drops what a policy does not read; a flag typed for a policy that does
    not read it is refused here, as the user meant it to change something."""
    name = (args.policy or FIXED.name).strip()
    for flag, field, value in (("--threshold", "threshold", args.threshold), ("--batch-table", "table",
                               args.batch_table), ("--max-depth", "max_depth", args.max_depth)):
        if value is not None and name in POLICY_NAMES and name not in reading(field):
            raise LimitError(f"--policy {name} reads no {flag}; it is read by {' and '.join(reading(field))}")
    table = parse_table(args.batch_table) if args.batch_table else None
    return dict(policy=args.policy, threshold=args.threshold, table=table, max_depth=args.max_depth)


# the door names a value as the page does ("speculation depth"); on the command line the flag that set it
# is named too, as argparse names its own refusals
DOOR_FLAGS = {"errors.what_batch": "--batch-size", "errors.what_depth": "--depth",
              "errors.what_temperature": "--temperature", "errors.what_max_new": "--max-new-tokens"}


# a policy's refusals name the value as the page's boxes do ("adaptive max depth"): the flag leads here too
POLICY_FLAGS = {"errors.threshold_not_number": "--threshold", "errors.threshold_not_finite": "--threshold",
                "errors.threshold_batch": "--threshold", "errors.confidence_range": "--threshold",
                "errors.batch_table_range": "--batch-table", "errors.bad_batch_table": "--batch-table",
                "errors.adaptive_range": "--max-depth", "errors.unknown_policy": "--policy"}


def naming_flag(exc: Exception) -> str:
    """A refusal's sentence, led by the flag whose value the door refused ("argument --depth: …")."""
    said = exc.args[0] if exc.args else None
    flag = (DOOR_FLAGS.get(said.values.get("what")) or POLICY_FLAGS.get(said.key)) if isinstance(said, Said) else None
    return f"argument {flag}: {exc}" if flag else str(exc)


def check_run_args(args) -> RunArgs:
    """Fail fast, before any model loads, at the same door and with the same sentences as the app; the
    command then runs with the values returned."""
    draft = getattr(args, "draft", None)
    synthetic = draft is not None and parse_draft_ref(draft).kind == "synthetic"    # greedy only
    checked = check_run(args.batch_size, args.depth, args.temperature, args.max_new_tokens, synthetic=synthetic,
                        **policy_args(args))
    for text in args.prompt or []:
        check_prompt_text(text)
    return checked


def knobs_for(run: RunArgs) -> Knobs:
    """One request's live knobs, with its own policy object (policies keep a request's state)."""
    return Knobs(depth=run.depth, batch_size=run.batch, policy=run.policy.build())


DEFAULT_PROMPTS = ["Explain in two sentences why the sky is blue."]


def refuse_vllm_only(args, defaults: dict[str, object]) -> None:
    """Flags that only `--engine vllm` reads (name → its default), given to our engine: refused, not
    ignored (`sweep --vllm-eager` on our engine ran as if it was not given, and said nothing)."""
    if args.engine == "vllm":
        return
    given = given_flags(args, defaults)
    if given:
        verb = "is" if len(given) == 1 else "are"
        raise LimitError(f"{' and '.join(given)} {verb} read only with --engine vllm; our engine takes no such setting")


def n_users(n: int) -> str:
    """'1 user', '4 users': the class sizes the commands print."""
    return f"{n} user" if n == 1 else f"{n} users"


def write_chart(path: Path, make: Callable[[], object]) -> None:
    """`make()`'s figure as an HTML page at `path`, where plotly is installed. A bare GPU box (torch and
    transformers only, what scripts/gpu-check needs) measures without it: the JSON holds every figure,
    the page is a view of it."""
    try:
        fig = make()
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "plotly":
            raise
        print(f"plotly is not installed: {path.name} not written (the JSON beside it has every figure)",
              file=sys.stderr)
        return
    fig.write_html(path, include_plotlyjs=True)


def wrote(folder: Path, *names: str, also: str | None = None) -> None:
    """Where a command's files went (a default folder is written over without asking), on stderr: the
    last line of stdout stays the command's JSON."""
    where = ", ".join(n for n in names if (folder / n).exists())
    print(f"wrote {where} in {folder}/" + (f", and {also}" if also else ""), file=sys.stderr)


def charts():
    """specviz.charts, imported where a chart is drawn: it needs plotly, the measurements do not."""
    from specviz import charts as module

    return module


def graphs_of(fast) -> dict | None:
    """The graph path's counters for a command's JSON (`graphs.GraphStats`: graphs, captures and
    compilations, and those after warm-up, which stay 0), or None on another path."""
    stats = fast.graph_stats()
    return stats.as_dict() if stats is not None else None
