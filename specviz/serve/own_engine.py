"""A synthetic Run's engine of its own (`specviz.serve.runner.run_packets` drives it): its reference is
decoded first, on the prompts the Run may use; each of its steps takes the device gate as a scheduler
step does, so no two passes run at once; and `OwnEngines` bounds how many such engines exist at once."""
from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Iterator

from specviz.engine.request import StepEvent
from specviz.lessons import Said
from specviz.limits import LimitError
from specviz.serve.gate import DeviceGate


def reference_prompts(prompts: list[list[int]], max_batch: int) -> list[list[int]]:
    """Every distinct prompt a Run's rows may take, the batch-size slider's maximum included (row i takes
    prompt i mod len(prompts)): moving the slider mid-run then opens rows whose reference is there."""
    seen = dict.fromkeys(tuple(prompts[i % len(prompts)]) for i in range(min(max_batch, len(prompts))))
    return [list(p) for p in seen]


def gated(steps: Iterator[StepEvent], gate: DeviceGate | None, stop=None) -> Iterator[StepEvent]:
    """Each step of `steps` run while holding `gate` (as a scheduler step holds it); ends early once
    `stop` (an Event) is set, also while a step waits for the device: a timed experiment may hold it for
    a minute, and the engine's rows then all leave, which copies nothing."""
    idle = None if stop is None else lambda: _raise_if_set(stop)
    while stop is None or not stop.is_set():
        try:
            with gate.step(idle) if gate is not None else nullcontext():
                try:
                    ev = next(steps)
                except StopIteration:
                    return
        except _StoppedWaiting:
            break
        yield ev
    steps.close()


class _StoppedWaiting(Exception):
    """Stop was pressed while a step waited for the device."""


def _raise_if_set(stop: threading.Event) -> None:
    if stop.is_set():
        raise _StoppedWaiting


class with_gate:      # noqa: N801 (read as a function: with_gate(engine, gate, stop))
    """`engine` whose `generate` steps hold the gate and end once `stop` is set (what `reference_run`
    drives: it generates, then reads `outputs` and `prompt_of`)."""

    def __init__(self, engine, gate: DeviceGate | None, stop: threading.Event):
        self.engine, self.gate, self.stop = engine, gate, stop

    def generate(self, *args, **kwargs) -> Iterator[StepEvent]:
        return gated(self.engine.generate(*args, **kwargs), self.gate, self.stop)

    def outputs(self) -> dict[int, list[int]]:
        return self.engine.outputs()

    def prompt_of(self, row: int) -> list[int]:
        return self.engine.prompt_of(row)


class OwnEngines:
    """Synthetic Runs at once, each with an engine and KV caches of its own: `limit` run, up to `queue`
    wait in arrival order (beyond that, a sentence), a waiting one that is stopped leaves the queue."""

    def __init__(self, limit: int, queue: int):
        self.limit, self.queue = limit, queue
        self._cond = threading.Condition()
        self._running = 0
        self._waiting: list[object] = []

    def wait(self, stop: threading.Event) -> Iterator[int]:
        """Yields this Run's place (1 = next) while it waits; ends once it holds a slot (or was stopped:
        it holds one then too). The caller `release()`s it."""
        me = object()
        with self._cond:
            if len(self._waiting) >= self.queue:
                raise LimitError(Said("errors.synthetic_busy", count=self.limit, waiting=len(self._waiting)))
            self._waiting.append(me)
        admitted, shown = False, None
        try:
            while True:
                with self._cond:
                    pos = self._waiting.index(me) + 1
                    if stop.is_set() or (pos <= self.limit - self._running):
                        self._waiting.remove(me)
                        self._running += 1
                        admitted = True
                        return
                    self._cond.wait(0.5)
                if pos != shown:
                    shown = pos
                    yield pos
        finally:
            if not admitted:
                with self._cond:
                    self._waiting.remove(me)
                    self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()
