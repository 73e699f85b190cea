"""`python -m specviz kernels`: what this CPU's matrix products stream, per weight shape and row count.

Decode multiplies a few rows by every weight matrix, so a pass is as fast as the product that streams
the weights fastest at those rows — a property of the CPU and its libraries, not of our code. This
prints, for the target's own matrix shapes at 1, 5 and 16 rows, the rate (GB/s of weights read) of each
product the fast path can choose (specviz.fastpath.layout): stock (`F.linear` on the model's matrix:
MKL on x86), column-major (the same call on a transposed copy), oneDNN (reordered weights) and ours
(specviz.fastpath.rows), with the CPU's model name and the vector code path our kernel was built for.
Timed as the fast path times them (matrices enough to exceed the last-level cache, layouts
interleaved, best of several rounds). `--quick` times two small shapes once (for tests).
"""
from __future__ import annotations

import json

import torch

from specviz.cli.args import int_list, model_ref
from specviz.cli.common import DEFAULT_TARGET
from specviz.limits import LimitError

QUICK_SHAPES = ((96, 64), (64, 128))
NAMES = {"stock": "stock", "colmajor": "column-major", "onednn": "oneDNN", "rows": "ours"}


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="per-shape GB/s of each matrix product this CPU offers the fast path")
    p.add_argument("--target", default=None, type=model_ref(),
                   help=f"model whose matrix shapes are timed (default {DEFAULT_TARGET})")
    p.add_argument("--rows", default="1,5,16", type=int_list(1, 64),
                   help="rows multiplied at once (comma-separated, 1-64)")
    p.add_argument("--quick", action="store_true", help="two small shapes, one round (seconds; for tests)")
    p.add_argument("--json", action="store_true", help="only the JSON line")
    p.set_defaults(func=run)


def model_shapes(target: str) -> dict[tuple[int, int], int]:
    """The [out, in] shapes the fast path multiplies for `target` (q/k/v and gate/up stacked, as
    specviz.fastpath.llama does), with how many matrices of each the model has."""
    from specviz.pairs.models import load_model

    cfg = load_model(target, "cpu").model.config
    d, H, Hkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or d // H
    n, inter = cfg.num_hidden_layers, cfg.intermediate_size
    counts: dict[tuple[int, int], int] = {}
    for shape, k in (((H + 2 * Hkv) * hd, d), n), ((d, H * hd), n), ((2 * inter, d), n), ((d, inter), n), \
            ((cfg.vocab_size, d), 1):
        counts[shape] = counts.get(shape, 0) + k
    return counts


def measure(shapes: dict[tuple[int, int], int], rows: list[int], quick: bool) -> list[dict]:
    from specviz.fastpath import layout

    names = layout.available(torch.float32)
    out = []
    for shape, count in shapes.items():
        kw = {"rounds": 1, "budget_s": 0.0} if quick else {}
        secs = layout.time_layouts(shape, count, names, torch.float32, probes=tuple((1, r) for r in rows), **kw)
        nbytes = shape[0] * shape[1] * 4
        for r, per in zip(rows, secs):
            rates = {n: nbytes / s / 1e9 for n, s in per.items()}
            out.append({"shape": f"{shape[0]}x{shape[1]}", "rows": r, "GBps": rates,
                        "best": max(rates, key=rates.get)})
    return out


def run(args) -> int:
    from specviz.fastpath import rows as kernel
    from specviz.machine import cpu_model

    rows = args.rows
    if args.quick and args.target is not None:
        raise LimitError("--quick times two small fixed shapes, not a model's: it takes no --target")
    args.target = args.target or DEFAULT_TARGET
    shapes = {s: 1 for s in QUICK_SHAPES} if args.quick else model_shapes(args.target)
    table = measure(shapes, rows, args.quick)
    info = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "our_kernel_isa": kernel.isa() or None,
            "our_kernel": "built" if kernel.library() is not None else f"not available ({kernel.why()})",
            "c_layer_library_product": kernel.has_gemm(), "target": None if args.quick else args.target,
            "quick": args.quick, "table": table}
    if not args.json:
        names = list(table[0]["GBps"]) if table else []
        print(f"CPU: {info['cpu']} · {info['threads']} threads · our kernel: "
              f"{info['our_kernel_isa'] or info['our_kernel']} · C layers can call the library product: "
              f"{'yes' if info['c_layer_library_product'] else 'no'}")
        print("GB/s of weights read per product (higher is faster; * = fastest)"
              + ("; --quick: two tiny shapes, one round, a smoke test that says nothing of this CPU's speed"
                 if args.quick else ""))
        print(f"{'shape':>12} {'rows':>4} " + " ".join(f"{NAMES.get(n, n):>12}" for n in names))
        for row in table:
            cells = " ".join(f"{row['GBps'][n]:11.2f}{'*' if n == row['best'] else ' '}" for n in names)
            print(f"{row['shape']:>12} {row['rows']:>4} {cells}")
    print(json.dumps(info))
    return 0
