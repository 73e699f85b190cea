"""The class is the batch: one engine per loaded pair, serving every user at once (continuous batching).

A Run no longer builds its own engine. It submits a `Request` and gets a `Ticket`; a background thread
owns the engine — the batch and both KV caches — and steps it. New requests join the running batch at
the next step, finished, stopped or abandoned ones leave it; each request's rows follow its own policy,
evaluated at the *shared* batch size, so disable-by-batch-size reacts to the whole class. Nothing but
this thread touches the engine; other threads talk to it through the ticket's queue and the request's
thread-safe knobs.

Admission: a request enters the batch when its rows fit under `Limits.max_shared_rows` and the memory
guard (KV cache and activations for rows × (k + 1) × context on this device); otherwise it waits in a
bounded queue and sees its position; beyond the queue, `Busy` says when to try again.

Faults: an out-of-memory step ends only the request(s) that caused it (the one being admitted, else the
one putting the most tokens into the pass), with a sentence naming the knob to lower; both caches are
dropped and the other rows are prefilled again from their tokens, so they go on. Any other exception
ends the running requests with a sentence (the traceback goes to the log) and the engine is rebuilt.

Timing stays honest through the device's gate (`specviz.serve.gate`): the scheduler holds it for one
step at a time. This file reads top to bottom in the order a request lives: the ticket, then the
scheduler's admit → step → finish loop.
"""
from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from specviz.engine.loop import SpeculativeEngine
from specviz.engine.request import Request, RunTotals, StepEvent
from specviz.hardware.roofline import ModelSpec
from specviz.lessons import Key, Said
from specviz.limits import LimitError, Limits
from specviz.serve.gate import POLL_S, DeviceGate, Pauses
from specviz.serve.heap import trim_heap

log = logging.getLogger("specviz.serve.scheduler")

ABANDON_S = 30.0      # a ticket nobody has read for this long is cancelled (its tab is gone)
IDLE_S = 5.0          # a scheduler thread with nothing to do for this long (caches given back) ends


def unexpected(kind) -> Said:
    """The sentence for a generation that failed unexpectedly (`kind`: an exception's class name)."""
    return Said("errors.generation_failed", kind=kind)


class Busy(LimitError):
    """The shared batch and its waiting queue are full."""


# --- what a consumer receives -------------------------------------------------------------------------
@dataclass
class Update:
    events: list[StepEvent] = field(default_factory=list)
    totals: RunTotals | None = None
    position: int | None = None        # waiting for room: place in the queue (1 = next)
    final: bool = False
    stopped: bool = False
    outputs: dict | None = None        # row id → generated ids (final update)
    error: str | None = None           # the request ended early, for this reason (a sentence)
    device_wait: int = 0               # no step came: timed experiments hold the device or wait for it


@dataclass(frozen=True)
class BatchInfo:
    rows: int          # rows in the shared batch now, or joining it at the next step
    users: int         # requests with such rows
    waiting: int       # requests queued for room


class Ticket:
    """A submitted request, as its consumer sees it. Only the consumer reads `updates()`."""

    def __init__(self, request: Request, scheduler: "Scheduler"):
        self.request, self.scheduler = request, scheduler
        self._q: queue.Queue[Update] = queue.Queue()
        self.last_pull = time.monotonic()
        self.closed = False
        self.position = 0                 # last queue position sent (0: not waiting for room)

    def put(self, upd: Update) -> None:
        self._q.put(upd)

    def updates(self, flush_s: float = 0.05) -> Iterator[Update]:
        """Updates until the final one; events that arrive within `flush_s` are merged."""
        pauses = Pauses(self.scheduler.gate)
        while True:
            self.last_pull = time.monotonic()
            try:
                upd = self._q.get(timeout=POLL_S)
            except queue.Empty:
                if not self.scheduler.alive() and self._q.empty():
                    yield Update(final=True, error=unexpected(Key("errors.kind_scheduler_stopped")))
                    return
                # why nothing comes, unless it waits for room (its queue line says so) and was not stopped
                n = pauses.idle() if not self.position or self.request.stopped else None
                if n:
                    yield Update(device_wait=n)
                continue
            pauses.progressed()
            upd = self._merge(upd, flush_s)
            yield upd
            if upd.final:
                return

    def _merge(self, upd: Update, flush_s: float) -> Update:
        deadline = time.monotonic() + flush_s
        while not upd.final and upd.position is None:
            try:
                nxt = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if nxt.position is not None:
                self._q.put(nxt)   # keep order simple: a position update goes out on its own
                break
            upd = Update(upd.events + nxt.events, nxt.totals or upd.totals, None, nxt.final, nxt.stopped,
                         nxt.outputs, nxt.error)
        return upd

    def cancel(self) -> None:
        """Stop (or a closed tab): the rows leave the batch at the next step."""
        self.closed = True
        self.request.knobs.stop.set()
        self.scheduler.wake()


# --- memory guard --------------------------------------------------------------------------------------
def bytes_needed(target: ModelSpec, draft: ModelSpec | None, rows: int, context: int, depth: int) -> float:
    """KV cache of both models for `rows` rows of `context` tokens, plus one verify pass's activations
    (hidden states and fp32 logits for rows × (k + 1) tokens; attention scores over the context)."""
    kv = rows * context * (target.kv_bytes_per_token() + (draft.kv_bytes_per_token() if draft else 0))
    tokens = rows * (depth + 1)
    logits = tokens * target.vocab * 4 * 2                    # logits and their softmax in fp32
    hidden = tokens * max(target.d_ff, target.d_model) * 4 * 4
    scores = tokens * target.n_heads * context * 4
    return float(kv + logits + hidden + scores)


# --- the scheduler -------------------------------------------------------------------------------------
class Scheduler:
    """Owns one engine (one loaded pair) in a background thread and serves many tickets with it."""

    def __init__(self, make_engine: Callable[[], SpeculativeEngine], limits: Limits, gate: DeviceGate,
                 target_spec: ModelSpec, draft_spec: ModelSpec | None = None,
                 free_memory: Callable[[], float | None] = lambda: None, name: str = "pair"):
        self.make_engine, self.limits, self.gate = make_engine, limits, gate
        self.specs, self.free_memory, self.name = (target_spec, draft_spec), free_memory, name
        self._cond = threading.Condition()
        self._pending: list[Ticket] = []
        self._active: dict[int, Ticket] = {}     # request id → ticket (requests in the engine)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._info = BatchInfo(0, 0, 0)
        self._step_s = 0.1                        # recent step time, for "try again in about N s"
        self._swap: Callable[[], SpeculativeEngine] | None = None   # a new forward path, taken between steps
        self.engine: SpeculativeEngine | None = None
        self._used = False                        # steps ran since the caches were last given back

    # --- called from consumer threads ----------------------------------------------------------------
    def submit(self, request: Request) -> Ticket:
        return self.submit_all([request])[0]

    def submit_all(self, requests: list[Request]) -> list[Ticket]:
        """Submit several requests in one moment: the loop sees all of them pending at its next admission
        (a class benchmark's users arrive together; one by one, the loop could admit the first few, run a
        prefill, then the rest, and that second prefill cost a 64-user cell ~6 % at random). All or none:
        if the queue has no room for every one, `Busy` and nothing was submitted."""
        with self._cond:
            if self._closed:
                raise LimitError(Said("errors.shutting_down"))
            # requests that would wait even once everyone pending whom the batch has room for is in
            # (about one row each): only those count against the queue
            pending = len(self._pending) + len(requests) - 1
            beyond_room = pending - max(0, self.limits.max_shared_rows - self._info.rows)
            if beyond_room >= self.limits.max_queue:
                raise Busy(Said("errors.busy", seconds=self._retry_after()))
            tickets = [Ticket(r, self) for r in requests]
            self._pending.extend(tickets)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=f"specviz-scheduler-{self.name}",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return tickets

    def info(self) -> BatchInfo:
        with self._cond:
            return self._info

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def swap(self, make_engine: Callable[[], SpeculativeEngine]) -> None:
        """Serve from an engine made by `make_engine` from the next step on (the same pair on a faster
        forward path, once it has warmed up). Running requests move over; their rows are prefilled again."""
        with self._cond:
            self.make_engine = make_engine
            self._swap = make_engine
            self._cond.notify_all()

    def close(self, timeout: float = 60.0) -> None:
        """Stop serving and wait for the loop to end its step: a daemon thread still inside torch when the
        interpreter exits is killed mid-call, and the C++ runtime aborts ("terminate called without an
        active exception")."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _retry_after(self) -> float:
        # a copy: the loop's thread changes the table without this lock (between steps and in a pause)
        left = [t.request.max_new for t in list(self._active.values())]
        return max(5.0, min(600.0, self._step_s * (max(left) if left else 50)))

    # --- the loop (the only thread that touches the engine) ---------------------------------------------
    def _loop(self) -> None:
        if self.engine is None:
            self.engine = self.make_engine()
        while True:
            with self._cond:
                work = self._cond.wait_for(lambda: self._closed or self._pending or self._active, timeout=IDLE_S)
                if self._closed:
                    break
                if not work:
                    # quiet for IDLE_S: the caches go back, and this thread ends with its OpenMP workers,
                    # so a timed experiment meanwhile does not run beside an idle pool (hardware/threads.py);
                    # the next submit starts a thread that serves this engine (its budget's tables kept)
                    if self._used:
                        self._release_memory()
                    self._thread = None
                    return
                pending = list(self._pending)
            try:
                self._take_swap()
                self._reap()
                self._admit(pending)
                if not self.engine.requests:
                    # the caches stay until IDLE_S of quiet (above): the next batch reuses them instead
                    # of faulting fresh pages in (StaticCache.emptied)
                    with self._cond:
                        self._cond.wait(0.05)    # only queued requests that cannot start yet
                    continue
                with self.gate.step(idle=self._end_stopped):
                    self._step_once()
                self._used = True
            except Exception as exc:          # never let the loop die: end what runs, keep serving
                log.exception("scheduler loop failed")
                if not self._fail_outside_step(unexpected(type(exc).__name__)):
                    break
        for t in list(self._active.values()) + self._pending:
            t.put(Update(final=True, stopped=True, error=Said("errors.shut_down")))

    def _release_memory(self) -> None:
        """The class has been quiet for IDLE_S: give back the KV caches the last batch grew (a 16 × 512
        batch of the 135M model holds ~450 MB of them), and the freed heap to the system."""
        self.engine.drop_caches()
        self._used = False
        trim_heap()

    def _take_swap(self) -> None:
        with self._cond:
            make, self._swap = self._swap, None
        if make is not None:
            new = make()
            new.take_over(self.engine)
            self.engine = new

    def _step_once(self) -> None:
        t0 = time.perf_counter()
        try:
            with self._cond:
                queued = len(self._pending)     # adaptive verification's budget plans for them
            results = self.engine.step(room=self.limits.max_shared_rows, queued=queued)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            self._out_of_memory(exc)
            return
        except Exception as exc:  # keep serving: end the running requests with a sentence, log the rest
            log.exception("scheduler step failed")
            self._fail_all(unexpected(type(exc).__name__))
            return
        if results:
            self._step_s = 0.8 * self._step_s + 0.2 * (time.perf_counter() - t0)
        for req, ev in results:
            t = self._active.get(req.id)
            if t is not None:
                t.put(Update([ev], req.totals.copy()))
        self._finish_done()
        self._publish_info()

    def _finish_done(self) -> None:
        live = {r.id for r in self.engine.requests}
        for rid, t in list(self._active.items()):
            if rid not in live:
                req = t.request
                t.put(Update([], req.totals.copy(), None, True, req.stopped, req.outputs(), req.error))
                del self._active[rid]

    def _end_stopped(self) -> None:
        """While the next step waits for the device (a timed experiment holds it), stopped requests end
        now, with their tokens so far: their rows leave the batch at that step, which needs the device."""
        with self._cond:
            waiting = [t for t in self._pending if t.request.stopped]
            for t in waiting:
                self._pending.remove(t)
        for t in waiting:
            t.put(Update([], RunTotals(), None, True, True, {}, None))
        for rid, t in list(self._active.items()):
            req = t.request
            if req.stopped:
                t.put(Update([], req.totals.copy(), None, True, True, req.outputs(), req.error))
                del self._active[rid]
        if waiting:
            self._publish_info()     # "batch now" stops counting them in the queue

    def _reap(self) -> None:
        """Drop requests whose consumer is gone (a closed tab whose generator was never closed)."""
        now = time.monotonic()
        for t in list(self._active.values()) + list(self._pending):
            if now - t.last_pull > ABANDON_S:
                t.request.knobs.stop.set()

    def _admit(self, pending: list[Ticket]) -> None:
        """Move waiting requests into the batch, first come first served, while their rows fit."""
        rows = sum(map(_rows, self.engine.requests))
        still: list[Ticket] = []
        for t in pending:
            req = t.request
            if req.stopped:
                t.put(Update([], RunTotals(), None, True, True, {}, None))
                continue
            want = req.knobs.snapshot().batch_size
            refusal = self._memory_refusal(req, rows + want)
            if still or rows + want > self.limits.max_shared_rows or refusal == "wait":
                still.append(t)
                continue
            if refusal:
                t.put(Update(final=True, error=refusal))
                continue
            self.engine.add(req)
            self._active[req.id] = t
            t.position = 0
            rows += want
        with self._cond:
            for t in pending:
                if t not in still:
                    self._pending.remove(t)
        for i, t in enumerate(still):
            if t.position != i + 1:       # only when it moved: a waiting tab needs no flood
                t.position = i + 1
                t.put(Update(position=i + 1))
        self._publish_info()

    def _memory_refusal(self, req: Request, rows: int) -> str | None:
        """None if `rows` rows (this request's included) fit in free memory; "wait" if they would once
        others finish; else a sentence."""
        free = self.free_memory()
        if free is None:
            return None
        state = req.knobs.snapshot()
        context = max(len(p) for p in req.prompts) + req.max_new + state.depth + 1
        need = bytes_needed(self.specs[0], self.specs[1], rows, context, state.depth)
        if need <= free:
            return None
        alone = bytes_needed(self.specs[0], self.specs[1], state.batch_size, context, state.depth)
        if alone <= free and self.engine.requests:
            return "wait"
        return Said("errors.not_enough_memory", rows=state.batch_size, context=context, need=alone / 2**30,
                    free=free / 2**30)

    def _out_of_memory(self, exc: BaseException) -> None:
        eng = self.engine
        culprits = set(eng.admitting) or ({max(eng.pressure, key=eng.pressure.get)} if eng.pressure else set())
        if not culprits:
            culprits = {r.id for r in eng.requests}
        log.warning("out of memory in a step (%s); ending request(s) %s", exc, sorted(culprits))
        eng.drop_caches()
        for req in list(eng.requests):
            if req.id in culprits:
                s = req.knobs.snapshot()
                req.error = Said("errors.step_out_of_memory", rows=s.batch_size, depth=s.depth)
                eng.remove(req, "error")
        _free_cached_memory()
        self._finish_done()

    def _fail_all(self, message: str) -> None:
        """In a step (the gate held): end what runs with `message`, and start on a clean engine (caches may
        be half-written)."""
        self._end_all(message)
        self.engine = self.make_engine()
        _free_cached_memory()

    def _end_all(self, message: str) -> None:
        """End every running request with `message` now, on the host: the engine and its caches are
        about to be replaced, so no row needs to leave them."""
        for req in self.engine.requests:
            req.error = message
            req.end_rows("error")
            req.done = True
        self.engine.requests = []
        self._finish_done()

    def _fail_outside_step(self, message: str) -> bool:
        """A failure outside a step (admitting, reaping): what runs ends now with `message`, on the host (its
        engine is replaced, caches and all); the new engine is built and device memory freed under the gate,
        as in a step, so neither races a timed experiment or a graph capture. Stop and closing are heard
        while it waits. False if the scheduler closed meanwhile."""
        self._end_all(message)
        try:
            with self.gate.step(idle=self._idle_unless_closed):
                self.engine = self.make_engine()
                _free_cached_memory()
        except _Closed:
            return False
        self._publish_info()
        return True

    def _idle_unless_closed(self) -> None:
        if self._closed:
            raise _Closed
        try:
            self._end_stopped()
        except Exception:              # the loop is already in its error path: keep waiting, keep serving
            log.exception("ending stopped requests failed")

    def _publish_info(self) -> None:
        # admitted requests count before their first step gives them rows (it may wait for the device)
        rows = [_rows(r) for r in self.engine.requests]
        info = BatchInfo(sum(rows), sum(map(bool, rows)), len(self._pending))
        with self._cond:
            self._info = info


class _Closed(Exception):
    """The scheduler closed while its loop waited for the device."""


def _rows(req: Request) -> int:
    """A request's rows in the batch, and those it opens at the next step."""
    return len(req.rows) + req.wanted()


def _free_cached_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
