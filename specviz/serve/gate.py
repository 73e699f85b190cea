"""Honest timing: who may use the device now.

`DeviceGate` is one per device. The scheduler holds it for one step at a time, and an experiment that
times the hardware (the knee, a sweep) takes it exclusively, queued first come, first served, so its
figures are never measured while anything else runs.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

POLL_S = 0.5          # how often a waiting consumer wakes to show it is still there


class GateTicket:
    """A place in the queue for exclusive use of the device. `acquire(timeout)` until it returns True,
    showing `position()` meanwhile; `release()` when done (also when giving up)."""

    def __init__(self, gate: "DeviceGate"):
        self.gate, self.held = gate, False

    def position(self) -> int:
        return self.gate._position(self)

    def acquire(self, timeout: float = POLL_S) -> bool:
        return self.gate._acquire(self, timeout)

    def release(self) -> None:
        self.gate._release(self)


class DeviceGate:
    """One per device. Scheduler steps take it briefly (`step()`); exclusive users queue for it and,
    once they hold it, nothing else runs on the device until they release it. Steps wait while any
    exclusive user is queued, so a measurement is never starved by a busy class."""

    def __init__(self):
        self._cond = threading.Condition()
        self._busy = False
        self._queue: list[GateTicket] = []

    @contextmanager
    def step(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._busy and not self._queue)
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def enqueue(self) -> GateTicket:
        t = GateTicket(self)
        with self._cond:
            self._queue.append(t)
        return t

    @contextmanager
    def exclusive(self):
        """Hold the device (blocking) — for code that has no one to show a queue position to."""
        t = self.enqueue()
        try:
            while not t.acquire(POLL_S):
                pass
            yield
        finally:
            t.release()

    def waiting(self) -> int:
        with self._cond:
            return sum(1 for t in self._queue if not t.held)

    def _position(self, t: GateTicket) -> int:
        """1 = next to run once the current holder is done; 0 = holding (or not queued)."""
        with self._cond:
            if t not in self._queue or t.held:
                return 0
            return sum(1 for other in self._queue[: self._queue.index(t)] if not other.held) + 1

    def _acquire(self, t: GateTicket, timeout: float) -> bool:
        with self._cond:
            ok = self._cond.wait_for(lambda: not self._busy and self._queue and self._queue[0] is t, timeout)
            if ok:
                self._busy, t.held = True, True
            return bool(ok)

    def _release(self, t: GateTicket) -> None:
        with self._cond:
            if t.held:
                self._busy, t.held = False, False
            if t in self._queue:
                self._queue.remove(t)
            self._cond.notify_all()
