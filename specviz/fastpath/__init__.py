"""The fast path: a static-shape KV cache (`cache.StaticCache`) driven by a compact Llama-family forward
(`llama.CompactLlama`), optionally compiled (`torch.compile`, inductor on CPU, CUDA graphs on CUDA).

Off by default. The engine and the model drafters receive a *cache factory* (`batch → cache`); with
the fast path off it builds today's `RaggedCache`, so nothing changes. Modes:
- "off":      stock transformers modules + RaggedCache (the reference path);
- "static":   StaticCache + compact forward, eager (no compile; what most tests use);
- "compiled": StaticCache + compact forward, each decoder layer compiled;
- "on" = "compiled"; "auto": on a CPU what the app serves, "static" where its measured pass beats
  eager here (`specviz.fastpath.passes` times both when the model loads), else "off"; on CUDA
  "compiled" where a measurement on this machine found it faster (recorded by `python -m specviz
  bench-hf --compile on`), else "off". The default of the app and of every CLI command.
Unsupported architectures fall back to "off" with a sentence (`FastPath.note`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

from specviz.hardware.device import machine_key
from specviz.lessons import Said
from specviz.machine import cache_root

# no torch import at module level: app.py checks --compile before ZeroGPU's `spaces` is imported

COMPILE_CHOICES = ("auto", "on", "off", "static")    # every value --compile takes (help, errors)


class CompileError(ValueError):
    """A bad --compile value; the message is meant for a human."""


def check_compile(value: str) -> str:
    v = (value or "").strip().lower()
    if v not in COMPILE_CHOICES:
        raise CompileError(f"--compile must be one of {', '.join(COMPILE_CHOICES)}, not '{value}'")
    return v


@dataclass(frozen=True)
class FastPath:
    """What a pair runs: `mode` (off / static / compiled) and, when it fell back, why."""

    mode: str = "off"
    note: str = ""
    layout: str = ""          # which weight layouts serve (fastpath.layout.Plan.summary), "" when off
    auto: bool = False        # chosen by --compile auto: falls back to eager where that measured faster

    @property
    def shown(self) -> str:
        """The label with the weights' layout: what the counters and benchmarks print."""
        return Said("playground.fast.shown", label=self.label, layout=self.layout) if self.on and self.layout else self.label

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @property
    def label(self) -> str:
        # a Said: "eager (transformers)" … in logs, JSON and the CLI; the counters show the reader's language
        return Said(f"playground.fast.{self.mode}")


def resolve(choice: str, device=None) -> FastPath:
    """Turn a --compile choice into the mode this machine runs."""
    choice = check_compile(choice)
    if choice == "off":
        return FastPath("off")
    if choice == "static":
        return FastPath("static")
    if choice == "on":
        return FastPath("compiled")
    if _on_cpu(device):
        return FastPath("static", "auto: the fast path where its pass measured faster than eager here", auto=True)
    decided = auto_decision(device)
    if decided is None:
        return FastPath("off", "auto: not measured on this machine yet (bench-hf --compile on records it)")
    return FastPath("compiled" if decided else "off", "auto: " + ("measured faster" if decided else "measured slower"))


def _on_cpu(device) -> bool:
    import torch

    if device is None:
        return not torch.cuda.is_available()
    return torch.device(device).type == "cpu"


def cache_factory(model, fast: FastPath) -> tuple[Callable | None, FastPath]:
    """A `batch → StaticCache` factory for `model` (None when the fast path is off or cannot serve
    this architecture) and the FastPath that applies. The compact view is built once here and shared
    read-only by every cache (and engine) the factory makes."""
    if not fast.on:
        return None, fast
    # on first use: torch is slow to import
    from specviz.fastpath.llama import CompactLlama, Unsupported

    try:
        compact = CompactLlama(model, compiled=fast.mode == "compiled")
    except Unsupported as exc:
        return None, FastPath("off", f"{exc}; running eager")
    if fast.auto:
        from specviz.fastpath.passes import eager_faster

        slower = eager_faster(compact.plan)
        if slower is not None:
            return None, FastPath("off", f"auto: the fast path measured slower here ({slower[0]:.1f} vs "
                                         f"{slower[1]:.1f} ms a one-token pass eager; {compact.summary()}); running eager")
    if fast.mode == "compiled":
        compile_compact(compact)

    # on first use: transformers is slow to import
    from specviz.fastpath.cache import StaticCache

    return (lambda batch: StaticCache(compact, batch)), replace(fast, layout=compact.summary())


def compile_compact(compact, scope: str | None = None) -> None:
    """Give `compact` a compiled forward for short blocks.

    scope "layer" (CPU default): one compiled decoder layer serves every layer and model (short compile;
    Python still loops over the layers). scope "model" (CUDA default): the whole layer stack is one
    graph, replayed as CUDA graphs ("reduce-overhead") on CUDA — one launch per pass instead of ~15 a
    layer. SPECVIZ_COMPILE_SCOPE overrides the default (for measurements)."""

    # on first use: torch is slow to import
    import torch

    cuda = compact.device.type == "cuda"
    scope = scope or os.environ.get("SPECVIZ_COMPILE_SCOPE") or ("model" if cuda else "layer")
    setup_compile_cache()
    if scope == "layer":
        compact.fast_hidden = functools.partial(compact.hidden, layer_fn=compiled_layer(compact.device.type))
        return
    compact.graphs = cuda
    # CUDA graphs need fixed shapes (the cache pads to buckets); on CPU automatic dynamic shapes
    compact.fast_hidden = torch.compile(compact.hidden, mode="reduce-overhead" if cuda else None,
                                        dynamic=False if cuda else None)


@lru_cache(maxsize=None)
def compiled_layer(device_type: str):
    """One compiled decoder layer per device type, shared by every model and engine (the weights are
    arguments, so the same graph serves every layer; Dynamo guards on shapes, not on tensor identity)."""
    # on first use: torch is slow to import
    import torch

    # on first use: torch is slow to import
    from specviz.fastpath.llama import decoder_layer

    setup_compile_cache()
    # no CUDA graphs here: 30 replays of one graph per pass would chain outputs across replays. Shapes
    # are unpadded without CUDA graphs: automatic dynamic shapes recompile once into a graph for all
    return torch.compile(decoder_layer, dynamic=None)


def setup_compile_cache() -> None:
    """Persist inductor's compiled code in the user cache so a second start is warm."""
    root = cache_root() / "inductor"
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")


# --- auto: remember on this machine whether compiling paid ----------------------------------------
def _auto_file(device) -> Path:
    # on first use: torch is slow to import
    import torch


    key = machine_key(torch.device(device or "cpu"), None)      # host, device, torch version
    return cache_root() / "fastpath" / f"auto-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def auto_decision(device=None) -> bool | None:
    """True/False when a measurement on this machine said compiled is faster/slower; None if none."""
    try:
        data = json.loads(_auto_file(device).read_text())
        return bool(data["faster"])
    except (OSError, ValueError, KeyError):
        return None


def record_auto(device, eager_tps: float, fast_tps: float) -> None:
    """Store a measurement (tokens/s eager vs compiled) for `auto` to use."""
    path = _auto_file(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"eager_tokens_per_s": eager_tps, "fast_tokens_per_s": fast_tps,
                                "faster": fast_tps > eager_tps}))
