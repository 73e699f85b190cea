"""Where a Run's decoding happens, and how the sliders reach it.

The playground consumes `Packet`s: a few engine step events plus the run totals, hardware samples and
peaks. Two runners produce them:

- `LocalRunner`: the app owns its device (a laptop, a CPU Space, a dedicated GPU Space), so the whole
  class shares one engine per pair: each Run is a request submitted to that pair's `Scheduler`
  (continuous batching; `specviz.serve.scheduler`). The sliders set the request's `Knobs` directly. Timed
  experiments (the knee) take the device exclusively through the app's `DeviceGate`.
  A synthetic Run (the acceptance dial) is the exception: its reference, the target's own greedy
  continuation of every prompt it may use, must be decoded before its first step, so it runs on an
  engine of its own (`run_packets`, in a thread of its own), each step taking the `DeviceGate` as a
  scheduler step does, so no two passes ever run at once and its timings stay honest.
- `ZeroGpuRunner`: on a Hugging Face ZeroGPU Space the GPU exists only inside a forked worker that the
  `spaces` package starts for each `@spaces.GPU` call, so no process can own a long-lived shared engine:
  each Run builds its own engine in its worker (nothing shared between concurrent Runs) and batches are
  not shared on that hardware. The worker loads the pair onto its GPU, samples the hardware itself (the
  main process cannot read the GPU), and streams packets back; arguments and packets cross the process
  boundary pickled, so both are plain dataclasses. Sliders reach the worker through a small JSON control
  file that the worker polls between steps (a forked process shares no memory with us).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import torch

from specviz.engine.policies import PolicyChoice
from specviz.engine.request import Knobs, Request, RunTotals, StepEvent
from specviz.engine.synthetic import reference_run
from specviz.hardware.device import Peaks, Sample, Sampler, cached_peaks, device_name, free_memory, knee_steps
from specviz.hardware.passcurve import PassCurve
from specviz.hardware.roofline import ModelSpec
from specviz.hardware.threads import own_thread_iter
from specviz.limits import Limits
from specviz.serve.catalog import PairCache, PairChoice
from specviz.serve.control import ControlFile, Dial, LocalControl
from specviz.serve.gate import POLL_S, DeviceGate, Pauses
from specviz.serve.own_engine import OwnEngines, gated, reference_prompts, with_gate
from specviz.serve.scheduler import BatchInfo, Scheduler
from specviz.serve.workload import shared_scheduler

FLUSH_S = 0.05            # a packet at most every 50 ms: tiny models on a big GPU step far faster
ZERO_GPU_MAX_S = 120      # ZeroGPU reservation ceiling we ask for (longer requests queue behind others)
KNEE_GPU_S = 60           # loading a pair + 10 points × 4 passes each fits easily
OWN_ENGINES = 4           # synthetic Runs at once, each on an engine (and KV caches) of its own; others wait


@dataclass(frozen=True)
class RunRequest:
    """Everything a run needs, picklable (it crosses into the ZeroGPU worker)."""

    target: str
    draft: str
    prompts: tuple[tuple[int, ...], ...]   # row i decodes prompts[i % len(prompts)]
    depth: int
    batch: int
    policy: PolicyChoice
    temperature: float
    max_new: int
    control: str | None = None      # path of the control file (ZeroGPU only)
    seed: int = 0
    acceptance: float | None = None  # the dial's A: a synthetic Run, on an engine of its own
    reference: bool = True           # a synthetic Run decodes its reference first (its baseline needs none)


@dataclass
class Packet:
    events: list[StepEvent]
    totals: RunTotals
    samples: list[Sample] = field(default_factory=list)   # hardware samples taken by the worker
    sampler_source: str | None = None                     # None: read the app's own sampler
    peaks: Peaks | None = None
    spec: ModelSpec | None = None                         # the target's shape (first packet)
    final: bool = False
    stopped: bool = False
    outputs: dict | None = None                           # row id → generated ids (final packet)
    worker_pid: int = 0
    position: int | None = None                           # waiting for room in the shared batch
    device_wait: int = 0                                  # paused: timed experiments hold the device or wait
    error: str | None = None                              # the run ended early, for this reason
    # a synthetic Run: the dial's A at each of `events`, its reference's seconds (None while it is decoded,
    # or for a Run that needs none) and the drafter's counters (rows that left their reference, rows with none)
    rates: list[float] | None = None
    reference_s: float | None = None
    referencing: bool = False                             # the reference is being decoded (nothing timed yet)
    realigned: int = 0
    unreferenced: int = 0


def run_packets(req: RunRequest, pair, knobs: Knobs, control: "ControlFile | None" = None,
                sampler: Sampler | None = None, peaks: Peaks | None = None,
                flush_s: float = FLUSH_S, gate: DeviceGate | None = None, dial=None) -> Iterator[Packet]:
    """Run the engine and group its step events into packets (the body of both runners, and of a
    synthetic Run). `gate`: each step (the reference's too) holds it, as a scheduler step does. `dial`:
    a synthetic Run's live A (`.rate()`), handed to its drafter between two steps."""
    engine = pair.engine()
    pending: list[StepEvent] = []
    rates: list[float] = []
    synthetic = pair.synthetic is not None
    last_flush, last_sample = time.perf_counter(), 0.0
    first = True
    reference_s = None

    def packet(final: bool = False) -> Packet:
        nonlocal last_sample, first
        samples = [] if sampler is None else [s for s in sampler.recent(5.0) if s.t > last_sample]
        if samples:
            last_sample = samples[-1].t
        drafter = engine.drafter
        p = Packet(list(pending), engine.totals.copy(), samples,
                   None if sampler is None else sampler.source, peaks if first else None,
                   pair.target_spec if first else None, final, knobs.stop.is_set(),
                   engine.outputs() if final else None, os.getpid(),
                   rates=list(rates) if synthetic else None, reference_s=reference_s,
                   realigned=getattr(drafter, "realigned", 0), unreferenced=getattr(drafter, "unreferenced", 0))
        first = False
        pending.clear()
        rates.clear()
        return p

    prompts = [list(p) for p in req.prompts]
    refs = None
    if synthetic and req.reference:
        yield Packet([], RunTotals(), worker_pid=os.getpid(), referencing=True)
        distinct = reference_prompts(prompts, knobs.max_batch)
        refs, reference_s = reference_run(with_gate(engine, gate, knobs.stop), distinct, len(distinct), req.max_new)
        if knobs.stop.is_set():     # stopped in its reference: the Run made no token (the reference's are not its)
            yield Packet([], RunTotals(), final=True, stopped=True, outputs={}, worker_pid=os.getpid(),
                         reference_s=reference_s)
            return
    steps = engine.generate(prompts, knobs, req.max_new, req.temperature, seed=req.seed, references=refs)
    for ev in gated(steps, gate, knobs.stop):
        pending.append(ev)
        if synthetic:
            rates.append(engine.drafter.rate)
        if control is not None:
            control.apply(knobs)
        now = time.perf_counter()
        if now - last_flush >= flush_s:
            last_flush = now
            yield packet()
        if dial is not None and dial.rate() is not None and dial.rate() != engine.drafter.rate:
            engine.drafter.rate = dial.rate()     # this thread owns the drafter: it changes between steps
    yield packet(final=True)


@dataclass
class KneeUpdate:
    """The latency curve measured so far on the device that runs the pair (picklable)."""

    tokens_per_pass: list[int]
    latency_s: list[float]
    device: str                 # "cpu: 2 cores", "cuda: NVIDIA H200 MIG 3g.71gb", …
    spec: ModelSpec             # the target's shape, for the roofline prediction
    peaks: Peaks | None         # that device's calibrated peaks
    done: bool = False


def knee_updates(pair, peaks: Peaks | None, context: int) -> Iterator[KneeUpdate]:
    t = pair.target
    last = None
    for ns, lat in knee_steps(t.model, t.device, t.dtype, context, new_cache=pair.target_cache):
        last = KneeUpdate(ns, lat, device_name(t.device), pair.target_spec, peaks)
        yield last
    if last is not None:
        yield replace(last, done=True)


class Schedulers:
    """One scheduler per loaded pair, made on first use (the pair is loaded then, too)."""

    def __init__(self, pairs: PairCache, limits: Limits, gate: DeviceGate):
        self.pairs, self.limits, self.gate = pairs, limits, gate
        self._lock = threading.Lock()
        self._by_pair: dict[tuple[str, str], Scheduler] = {}
        pairs.on_fast(self._to_fast_path)

    def _to_fast_path(self, key: tuple[str, str], pair) -> None:
        """A pair finished warming up its fast path: its scheduler switches engines between two steps."""
        with self._lock:
            sched = self._by_pair.get(key)
        if sched is not None:
            sched.swap(pair.engine)

    def get(self, choice: PairChoice) -> Scheduler:
        self.pairs.get(choice)                     # loads outside our lock: another pair may be served
        key = (choice.target, choice.draft)
        with self._lock:
            if key not in self._by_pair:
                pair = self.pairs.get(choice)      # again: it may have moved to its fast path meanwhile
                device = pair.target.device
                self._by_pair[key] = shared_scheduler(pair, self.limits, self.gate, name=choice.draft,
                                                      free_memory=lambda: free_memory(device))
            return self._by_pair[key]

    def peek(self, choice: PairChoice) -> Scheduler | None:
        with self._lock:
            return self._by_pair.get((choice.target, choice.draft))

    def batch_info(self, choice: PairChoice) -> BatchInfo | None:
        """The pair's shared batch now (rows, users, waiting), or None before its first Run."""
        sched = self.peek(choice)
        return sched.info() if sched is not None else None

    def close(self, timeout: float = 60.0) -> None:
        """Every scheduler's loop ends its step and stops (Scheduler.close)."""
        with self._lock:
            scheds = list(self._by_pair.values())
        for sched in scheds:
            sched.close(timeout)


class LocalRunner:
    """Runs every Run of a pair as a request in that pair's shared batch, in this process."""

    zero_gpu = False

    def __init__(self, pairs: PairCache, limits: Limits, gate: DeviceGate):
        self.pairs, self.gate, self.limits = pairs, gate, limits
        self.schedulers = Schedulers(pairs, limits, gate)
        self._own = OwnEngines(OWN_ENGINES, limits.max_queue)

    def control(self, knobs: Knobs, policy: PolicyChoice, acceptance: float | None = None) -> LocalControl:
        return LocalControl(knobs, self.limits, None if acceptance is None else Dial(acceptance))

    def close(self, timeout: float = 60.0) -> None:
        self.schedulers.close(timeout)

    def batch_info(self, choice) -> BatchInfo | None:
        """What "batch now" shows for a pair (None: nothing shared yet)."""
        return self.schedulers.batch_info(choice)

    def pass_curve(self, choice) -> PassCurve | None:
        """The pair's target's pass-time curve (measured here once, in the background, on first ask)."""
        return self.pairs.pass_curve(choice)

    def recheck_curve(self, choice, seen: list[tuple[int, float]]) -> bool:
        """A Run's passes against the measured curve: measured again where they beat it (catalog)."""
        return self.pairs.recheck_curve(choice, seen)

    def packets(self, req: RunRequest, choice, control: LocalControl) -> Iterator[Packet]:
        if req.acceptance is not None:
            return self._own_engine(req, choice, control)
        return self._shared(req, choice, control)

    def _shared(self, req: RunRequest, choice, control: LocalControl) -> Iterator[Packet]:
        request = Request([list(p) for p in req.prompts], control.knobs, req.max_new, req.temperature, req.seed)
        ticket = self.schedulers.get(choice).submit(request)
        control.ticket = ticket
        for upd in ticket.updates():
            yield Packet(upd.events, upd.totals or RunTotals(), final=upd.final, stopped=upd.stopped,
                         outputs=upd.outputs, worker_pid=os.getpid(), position=upd.position, error=upd.error,
                         device_wait=upd.device_wait)

    def _own_engine(self, req: RunRequest, choice, control: LocalControl) -> Iterator[Packet]:
        """A synthetic Run: its reference first, then its steps, on an engine of its own in a thread of
        its own; at most OWN_ENGINES at once, the others wait in turn (their place shown)."""
        pair = self.pairs.get(choice)
        for pos in self._own.wait(control.knobs.stop):
            yield Packet([], RunTotals(), worker_pid=os.getpid(), position=pos)
        try:
            if not control.knobs.stop.is_set():
                yield from self._said_paused(own_thread_iter(
                    lambda: run_packets(req, pair, control.knobs, gate=self.gate, dial=control.dial), idle_s=POLL_S),
                    Pauses(self.gate))
                return
            yield Packet([], RunTotals(), final=True, stopped=True, outputs={}, worker_pid=os.getpid())
        finally:
            self._own.release()

    @staticmethod
    def _said_paused(packets: Iterator[Packet | None], pauses: Pauses) -> Iterator[Packet]:
        """The packets, and a line's worth of why (`device_wait`) where none came for a while (None)."""
        last = None
        for packet in packets:
            if packet is not None:
                pauses.progressed()
                last = packet
                yield packet
                continue
            n = pauses.idle()
            if n:
                yield Packet([], RunTotals(), worker_pid=os.getpid(), device_wait=n)
            elif n == 0 and last is not None and last.referencing:
                yield last          # the pause is over and the reference goes on (its tokens are not shown)

    def knee(self, choice, context: int, peaks: Peaks | None) -> Iterator[KneeUpdate | Waiting]:
        """The knee, measured with the device to itself (see `exclusively`)."""
        pair = self.pairs.get(choice)
        return exclusively(self.gate, lambda: knee_updates(pair, peaks, context))


@dataclass(frozen=True)
class Waiting:
    """A timed experiment waits for the device: its place in the queue (1 = next)."""

    position: int


def exclusively(gate: DeviceGate, make: Callable[[], Iterator]) -> Iterator:
    """Run a timed experiment with the device to itself: queue for the gate (yielding `Waiting` when the
    position changes), then yield the experiment's updates while holding it. The shared batch pauses
    between two steps meanwhile, so no figure is measured while anything else runs."""
    ticket, shown = gate.enqueue(), None
    try:
        while not ticket.acquire():
            pos = ticket.position()
            if pos != shown:
                shown = pos
                yield Waiting(pos)
        # in a thread of its own that ends with it (hardware/threads.py: no OpenMP pool left behind
        # in a handler thread)
        yield from own_thread_iter(make)
    finally:
        ticket.release()


class WorkerState:
    """What a ZeroGPU worker keeps between calls (the `spaces` package reuses an idle worker): the
    pairs on its GPU, its hardware sampler and its calibrated peaks. Lives only in the worker."""

    def __init__(self, pair_cache_factory):
        self.make_cache = pair_cache_factory
        self.cache = None
        self.sampler: Sampler | None = None
        self.peaks: Peaks | None = None

    def ready(self):
        # One CPU thread in the forked worker: the GPU does the work, and OpenMP's thread pool does not
        # survive a fork (a CPU op in the child hangs if the parent ever ran a parallel CPU op).
        torch.set_num_threads(1)
        if self.cache is None:
            self.cache = self.make_cache()          # device None: CUDA inside the worker
        if self.sampler is None:
            self.sampler = Sampler(cpu_fallback=not torch.cuda.is_available()).start()
        if self.peaks is None:
            try:
                self.peaks = cached_peaks(size_mb=128, repeats=3)
            except Exception:
                self.peaks = None                   # MBU/MFU show as unavailable
        return self


def gpu_duration(req: RunRequest) -> int:
    """Seconds of GPU to reserve for one Run: a base for loading the pair and calibrating, plus about
    an eighth of a second per new token (generous for a 1.7B target), capped so the Run is not queued
    behind others for asking too much."""
    return int(min(ZERO_GPU_MAX_S, 30 + req.max_new // 8))


class ZeroGpuRunner:
    """Runs the engine inside `@spaces.GPU` workers; nothing here touches CUDA in the main process."""

    zero_gpu = True

    def __init__(self, spaces_module, pair_cache_factory, wrap_errors, limits: Limits = Limits()):
        state = WorkerState(pair_cache_factory)
        self.limits = limits

        def gpu_run(req: RunRequest):
            # runs in the forked GPU worker: its own pair cache, sampler and peaks
            with wrap_errors():
                st = state.ready()
                knobs = Knobs(depth=req.depth, batch_size=req.batch, policy=req.policy.build())
                control = ControlFile(req.control, policy=req.policy, acceptance=req.acceptance)
                choice = PairChoice(req.target, req.target, req.draft)
                yield from run_packets(req, st.cache.get(choice), knobs, control, st.sampler, st.peaks,
                                       dial=control if req.acceptance is not None else None)

        def gpu_knee(target: str, draft: str, context: int):
            with wrap_errors():
                st = state.ready()
                yield from knee_updates(st.cache.get(PairChoice(target, target, draft)), st.peaks, context)

        # decorated now, before launch: `spaces` registers GPU functions when the app starts
        self.gpu_run = spaces_module.GPU(duration=gpu_duration)(gpu_run)
        self.gpu_knee = spaces_module.GPU(duration=KNEE_GPU_S)(gpu_knee)

    def control(self, knobs: Knobs, policy: PolicyChoice, acceptance: float | None = None) -> ControlFile:
        return ControlFile.create(knobs, policy, self.limits, acceptance)

    def batch_info(self, choice) -> None:
        return None                 # each ZeroGPU Run has a worker of its own: no shared batch to show

    def pass_curve(self, choice) -> None:
        return None                 # the GPU exists only inside a worker: nothing measured it here

    def recheck_curve(self, choice, seen) -> bool:
        return False

    def packets(self, req: RunRequest, choice, control: ControlFile) -> Iterator[Packet]:
        return self.gpu_run(replace(req, control=control.path))

    def knee(self, choice, context: int, peaks: Peaks | None) -> Iterator[KneeUpdate]:
        return self.gpu_knee(choice.target, choice.draft, context)   # the worker brings its own peaks
