"""The graph path: the compact forward (`llama.CompactLlama`) captured once per shape bucket
(`buckets.Buckets`) over one preallocated KV arena per model, and replayed from any thread, one at a time.

Why this shape (the first GPU run is in the repository's history): eager decode on a GPU is bound by
kernel launches, not by the weights; inductor's "reduce-overhead" recompiled for every new width and its
CUDA graph trees are thread-local, so graphs recorded at warm-up failed on the shared scheduler's thread.
Here, as in vLLM's model runner:
- one `torch.cuda.CUDAGraph` per bucket, all captured at warm-up, sharing one memory pool; nothing is
  captured or compiled afterwards (`GraphStats` counts both, and what ran outside the buckets);
- a graph bakes in addresses, so the KV arena [rows, n_kv, slots, head_dim] per layer and the static
  inputs (tokens, positions, visible slots, block slots) are allocated once, before capture; a pass
  copies its inputs into them, replays, and reads the output buffer before the next replay;
- one lock per model (an RLock) serialises replays, the arena's contents and the static buffers, so the
  scheduler's worker, a lesson's thread and the CLI may each run passes. The lock orders the calls; the
  GPU work keeps that order because every thread issues it on the default stream (a pass run inside
  `torch.cuda.stream(s)` would need an event before the next replay);
- warm-up runs each body on a side stream before its capture, the body has no host sync, and capture
  happens at load, with the device to itself (the app's warm-up holds the device gate).

What the graphs run (SPECVIZ_GRAPH_FORWARD): the compact forward as it is (=eager), or with its decoder
layer compiled by inductor at warm-up, dynamic shapes and none of inductor's own CUDA graphs (=compiled),
then captured. A graph removes the launches' host cost, but each kernel still takes a few µs on the
device, and compiling fuses a layer's many small kernels into a few, for a longer warm-up (a few
compilations: sizes of 1 are specialised). =auto, the default, captures the one-token decode shape both
ways on a probe pool, times the replays in turns and keeps the faster (the eager forward where compiling
fails; an eager verdict is kept for the device's later loads, `forwardchoice.py`); a CPU rehearsal times
nothing and keeps eager.

On a CPU the same machinery runs without CUDA (`CpuRehearsal`): "capturing" runs the body once on the
static buffers and "replaying" runs it again, so tests exercise the buckets, the padding, the arena and
the lock. Its label says so: a CPU never runs CUDA graphs.
"""
from __future__ import annotations

import functools
import gc
import logging
import os
import threading
import time
import types
import weakref
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch

from specviz.engine.kvcache import attention_bias
from specviz.hardware.device import device_seconds
from specviz.fastpath import forwardchoice
from specviz.fastpath.buckets import Buckets, Shape, parse
from specviz.fastpath.graphcache import GraphCache
from specviz.fastpath.llama import CompactLlama, decoder_layer

log = logging.getLogger("specviz.fastpath")

WARM_RUNS = 1             # runs of a body on the capture stream before its capture (cuBLAS, allocator, autotune)
ARENA_SHARE = 0.5         # the KV arena may take this share of the device's free memory
COMPILE_BACKEND = "inductor"   # what compiles the graphs' compiled forward (=compiled, and auto's probe)
FORWARDS = ("auto", "eager", "compiled")
PROBE_ROUNDS, PROBE_REPLAYS = 5, 10    # auto: rounds of back-to-back replays a forward, taken in turns
RECOMPILE_LIMIT = 16      # Dynamo's entries a code object may hold, process-wide: its default 8 is tight for one grid
COUNTED = ("captures", "compiles", "captures_after_warmup", "compiles_after_warmup", "replays", "eager_passes",
           "block_tokens", "padded_tokens", "spills")


@dataclass(frozen=True)
class GraphStats:
    """What the graph path did, for counters and benchmarks (a snapshot; sums over a pair's models)."""

    kind: str = ""                   # "cuda" (CUDA graphs) or "cpu" (the rehearsal, no CUDA graphs)
    forward: str = "eager"           # what the graphs run: the compact forward, or it compiled
    choice: str = ""                 # how auto chose: both one-token replays in ms, or why compiling failed
    graphs: int = 0                  # shapes captured
    captures: int = 0
    compiles: int = 0                # graphs the compiler built (auto's probe too; a graph break makes two)
    captures_after_warmup: int = 0   # must stay 0
    compiles_after_warmup: int = 0   # must stay 0
    replays: int = 0
    eager_passes: int = 0            # passes outside every bucket (prefills, long blocks): uncompiled
    block_tokens: int = 0            # rows × tokens the replayed passes were given
    padded_tokens: int = 0           # rows × tokens they computed (their buckets)
    spills: int = 0                  # a cache's rows copied out of the arena (another took it, or it outgrew it)
    warmup_s: float = 0.0
    arena_bytes: int = 0
    max_rows: int = 0
    max_tokens: int = 0              # the widest one-row block a graph serves
    max_slots: int = 0

    def __add__(self, other: "GraphStats") -> "GraphStats":
        out = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name in ("kind", "forward"):
                out[f.name] = a or b
            elif f.name == "choice":
                out[f.name] = "; ".join(dict.fromkeys(x for x in (a, b) if x))
            elif f.name.startswith("max_"):
                out[f.name] = max(a, b)
            else:
                out[f.name] = a + b
        return GraphStats(**out)

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One line for the CLI: what ran, and that nothing was captured or compiled after warm-up."""
        what = "CUDA graphs" if self.kind == "cuda" else "bucketed shapes on a CPU (no CUDA graphs)"
        pad = f"{self.padded_tokens / self.block_tokens:.2f}×" if self.block_tokens else "-"
        forward = f"{self.forward} forward" + (f" ({self.choice})" if self.choice else "")
        return (f"{self.graphs} {what}, {forward}, warm-up {self.warmup_s:.1f} s; "
                f"{self.captures} captures and {self.compiles} compilations, {self.captures_after_warmup} and "
                f"{self.compiles_after_warmup} after warm-up; {self.replays} replays, {self.eager_passes} passes "
                f"outside the buckets; padding {pad} the tokens given ({self.padded_tokens} for "
                f"{self.block_tokens}); {self.spills} spills; KV arena {self.arena_bytes / 2**30:.2f} GiB")


class CudaCapture:
    """CUDA graphs sharing one memory pool: bodies warm up on a side stream, then are captured there."""

    kind = "cuda"
    probes = True             # auto's forward is chosen by timing replays here

    def __init__(self, device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: list[torch.cuda.CUDAGraph] = []     # kept alive: a graph is freed with its object

    def begin(self) -> None:
        """Before the first capture: garbage out and cached blocks back, once (torch.cuda.graph does this
        for every capture, which for hundreds of shapes costs more than capturing them)."""
        gc.collect()
        torch.cuda.empty_cache()

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        torch.cuda.synchronize(self.device)           # nothing else in flight while we capture
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            for _ in range(WARM_RUNS):
                body()
            torch.cuda.synchronize(self.device)
            # the same stream for every capture: the pool is shared, and its reuse is per stream.
            # Thread-local capture mode: the device gate keeps other passes out, but a scheduler thread
            # may still allocate or free between its steps, which the global mode would turn into a
            # failed capture
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                body()
            except BaseException:
                # the body's own error is the one to see: ending a broken capture raises one of its own
                try:
                    graph.capture_end()
                except Exception:           # noqa: BLE001
                    log.debug("graph path: ending a failed capture failed too", exc_info=True)
                raise
            graph.capture_end()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        torch.cuda.synchronize(self.device)
        self._graphs.append(graph)
        return graph.replay

    def fresh(self) -> "CudaCapture":
        """A backend with a pool of its own: a probe's graphs, freed with it."""
        return CudaCapture(self.device)

    def time_ms(self, replay: Callable[[], None], n: int) -> float:
        """Milliseconds a replay over `n` back to back, by the device's own clock (CUDA events)."""
        return 1e3 * device_seconds(replay, self.device, n)


class CpuRehearsal:
    """The CPU stand-in for CudaCapture: the same static buffers and shapes, the body simply run."""

    kind = "cpu"
    probes = False            # a CPU's timings say nothing of a GPU's: auto keeps the eager forward

    def begin(self) -> None:
        pass

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        body()
        return body

    def fresh(self) -> "CpuRehearsal":
        return CpuRehearsal()

    def time_ms(self, replay: Callable[[], None], n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            replay()
        return 1e3 * (time.perf_counter() - t0) / n


class GraphRunner:
    """One model's arena, static buffers and captured shapes; shared by every cache of the model."""

    def __init__(self, compact: CompactLlama, buckets: Buckets, forward: str = "auto"):
        if forward not in FORWARDS:
            raise ValueError(f"SPECVIZ_GRAPH_FORWARD must be one of {', '.join(FORWARDS)}, not {forward!r}")
        self.compact, self.device, self.dtype = compact, compact.device, compact.dtype
        self.lock = threading.RLock()
        self.backend = CudaCapture(self.device) if self.device.type == "cuda" else CpuRehearsal()
        d = compact.dims
        self.slot_bytes = 2 * compact.n_layers * d.n_kv * d.head_dim * torch.finfo(self.dtype).bits // 8
        self.buckets = buckets.within(_arena_budget(self.device), self.slot_bytes)
        if self.buckets != buckets:
            log.warning("graph path: the KV arena for %s would not fit; using rows %s, slots %s",
                        buckets, self.buckets.rows, self.buckets.slots)
        self.tenant: weakref.ref | None = None       # the cache whose rows the arena holds (graphcache)
        self._counts = dict.fromkeys(COUNTED, 0)
        self._warm, self._inside, self.max_inside = False, 0, 0
        self._replays: dict[Shape, Callable[[], None]] = {}
        self._allocate()
        t0 = time.perf_counter()
        self.forward_kind, self._forward, self.choice = self._choose_forward(forward)
        self.warmup_s = time.perf_counter() - t0 + self._capture_all()

    # --- buffers ------------------------------------------------------------------------------------
    def _allocate(self) -> None:
        b, d, m = self.buckets, self.compact.dims, self.compact
        R, S = b.max_rows, b.max_slots
        flat = max(sh.rows * sh.tokens for sh in b.shapes())
        dev = self.device
        with torch.inference_mode(False), torch.no_grad():     # normal tensors: written in any mode
            # a spare slot no shape reaches: every shape's view of the arena is strided alike (none is the
            # whole, contiguous arena), so a compiled layer needs no variant for it
            shape = (R, d.n_kv, S + 1, d.head_dim)
            self.keys = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in range(m.n_layers)]
            self.values = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in range(m.n_layers)]
            self.tok = torch.zeros(flat, dtype=torch.long, device=dev)          # viewed [R, T] per shape
            self.pos = torch.zeros(flat, dtype=torch.long, device=dev)
            self.vis = torch.zeros(R * S, dtype=torch.bool, device=dev)          # viewed [R, S]
            self.slots = torch.zeros(b.max_tokens, dtype=torch.long, device=dev)
            self.out = torch.zeros(flat, m.embed.shape[1], dtype=self.dtype, device=dev)   # viewed [R, T, d]
            self.arange = torch.arange(S, device=dev)

    def _views(self, sh: Shape):
        R, T, S = sh
        return (self.tok[:R * T].view(R, T), self.pos[:R * T].view(R, T), self.vis[:R * S].view(R, S),
                self.slots[:T], self.out[:R * T].view(R, T, -1))

    # --- warm-up --------------------------------------------------------------------------------------
    def _body(self, sh: Shape, fwd: Callable | None = None) -> Callable[[], None]:
        tok, pos, vis, slots, out = self._views(sh)
        keys = [k[:sh.rows, :, :sh.slots] for k in self.keys]
        values = [v[:sh.rows, :, :sh.slots] for v in self.values]
        seen, fwd = self.arange[:sh.slots], fwd or self._forward

        def body() -> None:
            # query t of a row sees the visible slots up to its own (slots[t]) and its own; a padding row
            # only its own, so no kernel returns NaN into the arena
            out.copy_(fwd(tok, pos, attention_bias(vis, slots, self.dtype, seen), slots, keys, values))
        return body

    def _capture_all(self) -> float:
        t0 = time.perf_counter()
        shapes = self.buckets.shapes()
        with self.lock, torch.inference_mode():
            self.backend.begin()
            for i, sh in enumerate(shapes):
                if time.perf_counter() - t0 > self.buckets.budget_s:
                    log.warning("graph path: warm-up passed %.0f s; %d of %d shapes left uncaptured (they run "
                                "eagerly)", self.buckets.budget_s, len(shapes) - i, len(shapes))
                    break
                self._replays[sh] = self.backend.capture(self._body(sh))
                self._counts["captures"] += 1
        self._warm = True
        secs = time.perf_counter() - t0
        log.info("graph path (%s, %s forward): %d shapes captured in %.1f s, %.0f ms a shape (rows %s, tokens %s "
                 "+ one-row %s, slots %s); KV arena %.2f GiB", self.backend.kind, self.forward_kind,
                 len(self._replays), secs, 1e3 * secs / max(1, len(self._replays)),
                 self.buckets.rows, self.buckets.tokens, self.buckets.wide, self.buckets.slots,
                 self.arena_bytes / 2**30)
        return secs

    def _choose_forward(self, forward: str) -> tuple[str, Callable, str]:
        """(kind, forward, how auto chose it). auto: the one-token decode shape captured with each forward
        on a probe pool of its own (freed after), replays timed in turns, the faster kept."""
        if forward != "auto":
            return forward, self._compiled_forward() if forward == "compiled" else self.compact.hidden, ""
        if not self.backend.probes:
            return "eager", self.compact.hidden, ""
        sh = self.buckets.pick(1, 1, 0)
        where = forwardchoice.key(self.device, self.dtype, self._shape_key(sh), COMPILE_BACKEND)
        got = forwardchoice.kept(where)
        if got is not None:                           # eager won here before: no compile to learn it again
            log.info("graph path: %s; keeping eager", forwardchoice.sentence(got))
            return "eager", self.compact.hidden, forwardchoice.sentence(got)
        probe = self.backend.fresh()
        with self.lock, torch.inference_mode():
            replays = {"eager": (self.compact.hidden, probe.capture(self._body(sh, self.compact.hidden)))}
            try:
                fwd = self._compiled_forward()
                replays["compiled"] = (fwd, probe.capture(self._body(sh, fwd)))
            except Exception as exc:                  # noqa: BLE001 — any failure to compile leaves eager
                log.warning("graph path, auto: the compiled forward failed (%s: %s); keeping eager",
                            type(exc).__name__, exc, exc_info=True)
                return "eager", self.compact.hidden, f"auto: the compiled forward failed ({type(exc).__name__})"
            ms = {k: [] for k in replays}
            for _ in range(PROBE_ROUNDS):
                for k, (_, replay) in replays.items():
                    ms[k].append(probe.time_ms(replay, PROBE_REPLAYS))
        fastest = {k: min(v) for k, v in ms.items()}             # anything else on the device only slows a round
        best = min(fastest, key=fastest.get)
        forwardchoice.store(where, best, fastest)
        choice = "auto, one-token replay: " + ", ".join(f"{k} {v:.3f} ms" for k, v in fastest.items())
        log.info("graph path: %s; keeping %s", choice, best)
        return best, replays[best][0], choice

    def _shape_key(self, sh: Shape) -> str:
        """The model's shape and the probe's, as far as a forward's speed depends on them."""
        d, m = self.compact.dims, self.compact
        return (f"{m.n_layers} layers, vocab x d {tuple(m.embed.shape)}, heads {d.n_heads}/{d.n_kv} x {d.head_dim}"
                f", probe {sh.rows}x{sh.tokens} over {sh.slots} slots")

    def _compiled_forward(self):
        """The compact forward with each decoder layer compiled: one small graph serves every layer (the
        weights are arguments), where the whole unrolled stack would take minutes per compilation.
        Inductor's default mode: no CUDA graph trees of its own (ours capture its kernels)."""
        me = weakref.ref(self)          # Dynamo's cache keeps the backend alive; it must not keep the arena
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)

        def counting(gm, example_inputs):
            runner = me()
            if runner is not None:
                runner._counts["compiles"] += 1
                runner._counts["compiles_after_warmup"] += runner._warm
            return torch._dynamo.lookup_backend(COMPILE_BACKEND)(gm, example_inputs)
        layer = torch.compile(_own_copy(decoder_layer), dynamic=True, backend=counting)
        return functools.partial(self.compact.hidden, layer_fn=layer)

    # --- passes ---------------------------------------------------------------------------------------
    def pick(self, rows: int, tokens: int, length: int) -> Shape | None:
        """The captured shape a block runs in, or None (it runs eagerly)."""
        sh = self.buckets.pick(rows, tokens, length)
        return sh if sh in self._replays else None

    def replay(self, sh: Shape, tokens: torch.Tensor, pos: torch.Tensor, visible: torch.Tensor,
               length: int) -> torch.Tensor:
        """Run the block tokens, pos [B, T] (visible [B, L + T]: which slots its rows may see) appended at
        slot `length`, in shape `sh`. Returns hidden states [B, T, d]: a view of the output buffer, valid
        until the next replay (read it under the lock)."""
        B, T = tokens.shape
        tok, p, vis, slots, out = self._views(sh)
        with self.lock:
            self._inside += 1
            self.max_inside = max(self.max_inside, self._inside)
            try:
                # padding is zeroed; a block that fills its shape overwrites it whole (a launch fewer each)
                for dst, src in ((tok, tokens), (p, pos), (vis, visible)):
                    if src.shape != dst.shape:
                        dst.zero_()
                    dst[:src.shape[0], :src.shape[1]].copy_(src)
                slots.copy_(self.arange[length:length + sh.tokens])
                self._replays[sh]()
                self._counts["replays"] += 1
                self._counts["block_tokens"] += B * T
                self._counts["padded_tokens"] += sh.rows * sh.tokens
                return out[:B, :T]
            finally:
                self._inside -= 1

    def count(self, name: str) -> None:
        with self.lock:
            self._counts[name] += 1

    @property
    def arena_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @property
    def graphs(self) -> int:
        return len(self._replays)

    def stats(self) -> GraphStats:
        with self.lock:
            c = dict(self._counts)
        c.update(kind=self.backend.kind, forward=self.forward_kind, choice=self.choice, graphs=self.graphs,
                 warmup_s=self.warmup_s,
                 arena_bytes=self.arena_bytes, max_rows=self.buckets.max_rows,
                 max_tokens=max((sh.tokens for sh in self._replays if sh.rows == 1), default=0),
                 max_slots=self.buckets.max_slots)
        return GraphStats(**c)

    def new_cache(self, batch: int) -> GraphCache:
        """A cache of `batch` rows on this runner (the factory the engine and the drafters call)."""
        return GraphCache(self, batch)


def _own_copy(fn):
    """`fn` over a code object of its own. Dynamo keeps its compiled entries, a limited number of them, on
    the code object, and one runner's grid alone fills several (sizes of 1 are specialised): runners
    sharing one would crowd each other out and run eagerly, silently."""
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__ = fn.__kwdefaults__
    return own


def _arena_budget(device) -> int:
    """Bytes the KV arena may take on `device` (unbounded on a CPU: the rehearsal's buckets are small)."""
    if torch.device(device).type != "cuda":
        return 1 << 62
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * ARENA_SHARE)


def env_buckets() -> Buckets | None:
    """SPECVIZ_GRAPH_BUCKETS ("rows=1,2;tokens=1,2,3;slots=64,128;wide=8"), or None when unset."""
    text = os.environ.get("SPECVIZ_GRAPH_BUCKETS", "").strip()
    return parse(text) if text else None


def buckets_for(device, override: Buckets | None = None) -> Buckets:
    """The buckets a model on `device` captures: `override`, else SPECVIZ_GRAPH_BUCKETS, else the defaults
    (on a CPU a smaller grid: the rehearsal checks the machinery, it does not serve a class)."""
    if override is not None:
        return override
    if env_buckets() is not None:
        return env_buckets()
    if torch.device(device).type == "cuda":
        return Buckets()
    return Buckets(rows=(1, 2, 4, 8), slots=(128, 256, 512), wide=(32, 64))


# one runner per model (and configuration): its arena and graphs serve every engine of the model
_RUNNERS: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()
_RUNNERS_LOCK = threading.Lock()


def runner_for(model, make_compact: Callable[[], CompactLlama], buckets: Buckets | None = None,
               forward: str | None = None) -> GraphRunner:
    """The model's graph runner, captured on first use (under a lock: one capture at a time)."""
    forward = forward or os.environ.get("SPECVIZ_GRAPH_FORWARD", "auto").strip().lower() or "auto"
    with _RUNNERS_LOCK:
        mine = _RUNNERS.setdefault(model, {})
        device = next(model.parameters()).device
        key = (buckets_for(device, buckets), forward)
        if key not in mine:
            mine[key] = GraphRunner(make_compact(), key[0], forward)
        return mine[key]
