"""The fast path: a static-shape KV cache (`cache.StaticCache`) driven by a compact Llama-family forward
(`llama.CompactLlama`); on CUDA that forward replayed as CUDA graphs, one per shape bucket, over one KV
arena per model (`graphs.GraphRunner`, `graphcache.GraphCache`).

Off by default. The engine and the model drafters receive a *cache factory* (`batch → cache`); with
the fast path off it builds the engine's `RaggedCache`, so nothing changes. Modes:
- "off":      stock transformers modules + RaggedCache (the reference path);
- "static":   StaticCache + compact forward, eager (no compile, no graphs; what most tests use);
- "compiled": StaticCache + compact forward, each decoder layer compiled by inductor (a CPU's `on`);
- "graphs":   CUDA graphs captured at warm-up per (rows, tokens per row, cache slots) bucket; nothing
              compiles or captures afterwards (a CUDA device's `on`);
- "buckets":  the graph path's machinery on a CPU without CUDA graphs — the same buckets, padding, arena,
              static buffers and lock, the body simply run (tests; `scripts/gpu-check --dry-run`).
              `--compile on` picks it on a CPU when SPECVIZ_BUCKETS_ON_CPU=1.
- "auto" (the default of the app and of every CLI command): on a CPU "static" where its measured pass
  beats eager here (`specviz.fastpath.passes` times both when the model loads), else "off"; on CUDA
  "graphs" where a one-token pass replayed measures faster than the stock modules' (timed right after
  capture, so it never rests on an old measurement), else "off".
Unsupported architectures fall back to "off" with a sentence (`FastPath.note`).
"""
from __future__ import annotations

import functools
import logging
import os
import statistics
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable

from specviz.hardware.device import measure_latency
from specviz.lessons import Said
from specviz.machine import cache_root

# no torch import at module level: app.py checks --compile before ZeroGPU's `spaces` is imported

log = logging.getLogger("specviz.fastpath")

COMPILE_CHOICES = ("auto", "on", "off", "static")    # every value --compile takes (help, errors)
GRAPH_MODES = ("graphs", "buckets")
AUTO_ROUNDS = 5           # interleaved one-token timings per side when auto decides on CUDA


class CompileError(ValueError):
    """A bad --compile value; the message is meant for a human."""


def check_compile(value: str, name: str = "--compile") -> str:
    """`value` as a fast-path mode; `name`: where it came from, for the refusal (a flag, or the variable)."""
    v = (value or "").strip().lower()
    if v not in COMPILE_CHOICES:
        raise CompileError(f"{name} must be one of {', '.join(COMPILE_CHOICES)}, not '{value}'")
    return v


@dataclass(frozen=True)
class FastPath:
    """What a pair runs: `mode` (see the module docstring) and, when it fell back, why."""

    mode: str = "off"
    note: str = ""
    layout: str = ""          # which weight layouts serve (fastpath.layout.Plan.summary), "" when off
    auto: bool = False        # chosen by --compile auto: falls back to eager where that measured faster
    graphs: int = 0           # shapes captured for the graph path (target and draft together)
    runners: tuple = ()       # the graph runners serving the pair (their counters: `graph_stats`)

    @property
    def shown(self) -> str:
        """The label with the graph count and the weights' layout: what step events, counters and
        benchmarks print."""
        label = self.label
        if self.mode in GRAPH_MODES:
            label = Said(f"playground.fast.{self.mode}_n", label=label, graphs=self.graphs)
        return Said("playground.fast.shown", label=label, layout=self.layout) if self.on and self.layout else label

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @property
    def label(self) -> str:
        # a Said: "eager (transformers)" … in logs, JSON and the CLI; the counters show the reader's language
        return Said(f"playground.fast.{self.mode}")

    def joined(self, draft: "FastPath") -> "FastPath":
        """This path with a draft model's graphs counted in (a pair's draft runs on its own runner)."""
        if draft.mode not in GRAPH_MODES:
            return self
        return replace(self, graphs=self.graphs + draft.graphs, runners=self.runners + draft.runners)

    def graph_stats(self):
        """The graph path's counters summed over the pair's runners (`graphs.GraphStats`), or None."""
        if not self.runners:
            return None
        stats = [r.stats() for r in self.runners]
        return functools.reduce(lambda a, b: a + b, stats)


def resolve(choice: str, device=None) -> FastPath:
    """Turn a --compile choice into the mode this machine runs."""
    choice = check_compile(choice)
    if choice == "off":
        return FastPath("off")
    if choice == "static":
        return FastPath("static")
    cpu = _on_cpu(device)
    if choice == "on":
        if not cpu:
            return FastPath("graphs")
        return FastPath("buckets" if _buckets_on_cpu() else "compiled")
    if cpu:
        return FastPath("static", "auto: the fast path where its pass measured faster than eager here", auto=True)
    return FastPath("graphs", "auto: CUDA graphs where a replayed pass measures faster than eager here", auto=True)


def _buckets_on_cpu() -> bool:
    return os.environ.get("SPECVIZ_BUCKETS_ON_CPU", "").strip().lower() in ("1", "true", "yes")


def _on_cpu(device) -> bool:
    import torch

    if device is None:
        return not torch.cuda.is_available()
    return torch.device(device).type == "cpu"


def cache_factory(model, fast: FastPath, buckets=None) -> tuple[Callable | None, FastPath]:
    """A `batch → cache` factory for `model` (None when the fast path is off or cannot serve this
    architecture) and the FastPath that applies. The compact view is built once here and shared
    read-only by every cache (and engine) the factory makes; on the graph path so are the arena and the
    graphs (`buckets`: a `buckets.Buckets` to capture instead of the device's defaults)."""
    if not fast.on:
        return None, fast
    # on first use: torch is slow to import
    from specviz.fastpath.llama import Unsupported
    from specviz.fastpath.passes import compact_for, eager_faster

    try:
        if fast.mode in GRAPH_MODES:
            return _graph_factory(model, fast, buckets)
        compact = compact_for(model, compiled=fast.mode == "compiled")
    except Unsupported as exc:
        return None, FastPath("off", f"{exc}; running eager")
    if fast.auto:
        slower = eager_faster(compact.plan)
        if slower is not None:
            return None, FastPath("off", f"auto: the fast path measured slower here ({slower[0]:.1f} vs "
                                         f"{slower[1]:.1f} ms a one-token pass eager; {compact.summary()}); running eager")
    if fast.mode == "compiled":
        compile_compact(compact)

    # on first use: transformers is slow to import
    from specviz.fastpath.cache import StaticCache

    return (lambda batch: StaticCache(compact, batch)), replace(fast, layout=compact.summary())


def _graph_factory(model, fast: FastPath, buckets) -> tuple[Callable | None, FastPath]:
    """The graph path for `model`: its runner (captured now, or already), and for auto the one-token
    pass timed against the stock modules'."""
    from specviz.fastpath.graphs import runner_for
    from specviz.fastpath.llama import Unsupported
    from specviz.fastpath.passes import compact_for

    setup_compile_cache()            # the compiled forward (auto's probe, =compiled): a second start reuses it
    try:
        runner = runner_for(model, lambda: compact_for(model), buckets)
    except (RuntimeError, ValueError) as exc:        # a capture the device refused, a bad bucket setting
        if isinstance(exc, Unsupported):
            raise
        log.exception("graph path: warm-up failed")
        return None, FastPath("off", f"the graph path could not warm up ({type(exc).__name__}: {exc}); running eager")
    # the mode follows the device: a CPU never runs CUDA graphs, and its label must not say so
    mode = "graphs" if runner.backend.kind == "cuda" else "buckets"
    done = replace(fast, mode=mode, layout=runner.compact.summary(), graphs=runner.graphs, runners=(runner,))
    if not fast.auto:
        return runner.new_cache, done
    replayed, eager = one_token_ms(model, runner.new_cache)
    verdict = f"{replayed:.2f} vs {eager:.2f} ms a one-token pass eager"
    log.info("graph path, auto: a replayed one-token pass %s", verdict)
    if replayed >= eager:
        return None, FastPath("off", f"auto: the graph path measured slower here ({verdict}); running eager")
    return runner.new_cache, replace(done, note=f"auto: the graph path measured faster here ({verdict})")


def one_token_ms(model, new_cache, context: int = 64) -> tuple[float, float]:
    """Median one-token pass (ms) through `new_cache`'s path and through the stock modules, interleaved."""
    p = next(model.parameters())
    ours, eager = [], []
    for _ in range(AUTO_ROUNDS):
        ours += measure_latency(model, [1], context, p.device, p.dtype, 1, new_cache)
        eager += measure_latency(model, [1], context, p.device, p.dtype, 1, None)
    return 1e3 * statistics.median(ours), 1e3 * statistics.median(eager)


def compile_compact(compact, scope: str | None = None) -> None:
    """Give `compact` a compiled forward for short blocks (the CPU's `--compile on`).

    scope "layer" (default): one compiled decoder layer serves every layer and model (short compile;
    Python still loops over the layers). scope "model": the whole layer stack is one graph, with automatic
    dynamic shapes. SPECVIZ_COMPILE_SCOPE overrides the default (for measurements). Never inductor's
    "reduce-overhead" CUDA graph trees: they are thread-local (the graph path captures its own)."""

    # on first use: torch is slow to import
    import torch

    scope = scope or os.environ.get("SPECVIZ_COMPILE_SCOPE") or "layer"
    setup_compile_cache()
    if scope == "layer":
        compact.fast_hidden = functools.partial(compact.hidden, layer_fn=compiled_layer(compact.device.type))
        return
    compact.fast_hidden = torch.compile(compact.hidden, dynamic=None)


@lru_cache(maxsize=None)
def compiled_layer(device_type: str):
    """One compiled decoder layer per device type, shared by every model and engine (the weights are
    arguments, so the same graph serves every layer; Dynamo guards on shapes, not on tensor identity)."""
    # on first use: torch is slow to import
    import torch

    # on first use: torch is slow to import
    from specviz.fastpath.llama import decoder_layer

    setup_compile_cache()
    # shapes are unpadded here: automatic dynamic shapes recompile once into a graph for all
    return torch.compile(decoder_layer, dynamic=None)


def setup_compile_cache() -> None:
    """Persist inductor's compiled code in the user cache so a second start is warm."""
    root = cache_root() / "inductor"
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
