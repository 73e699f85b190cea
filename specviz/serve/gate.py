"""Honest timing: who may use the device now.

`DeviceGate` is one per device. The scheduler holds it for one step at a time, and an experiment that
times the hardware (the knee, a lesson chapter) takes it exclusively, queued first come, first served,
so its figures are never measured while anything else runs. Between two experiments the class gets a
turn: experiments back to back would otherwise pause every Run for as long as students keep pressing.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable

POLL_S = 0.5          # how often a waiting consumer wakes to show it is still there
TURN_S = 5.0          # after an experiment, waiting steps may run this long before the next one starts...
QUIET_S = 0.25        # ...or until no step has waited or run for this long (the class had nothing left)


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
    once they hold it, nothing else runs on the device until they release it. Steps wait while an
    exclusive user is queued; when one releases while steps wait, the steps get a turn (up to `turn_s`)
    before the next one starts. So a measurement waits for one step of a busy class, or for the rest of
    the class's turn after the measurement before it."""

    def __init__(self, turn_s: float = TURN_S, quiet_s: float = QUIET_S):
        self._cond = threading.Condition()
        self._busy = False
        self._queue: list[GateTicket] = []
        self.turn_s, self._quiet_s = turn_s, quiet_s
        self._stepping = 0              # steps waiting for the gate or holding it
        self._turn_until = 0.0          # monotonic time the class's turn ends
        self._last_step = 0.0           # when the last step let go

    @contextmanager
    def step(self, idle: Callable[[], None] | None = None):
        """Hold the device for one step. `idle` runs every POLL_S while the step waits, in the waiting
        thread and outside the gate's lock: a Stop pressed meanwhile need not wait for the experiment
        (it may raise, and the step is then given up)."""
        with self._cond:
            self._stepping += 1
        try:
            while True:
                with self._cond:
                    if self._cond.wait_for(self._may_step, timeout=None if idle is None else POLL_S):
                        self._busy = True
                        break
                idle()
        except BaseException:
            with self._cond:
                self._stepping -= 1
                self._cond.notify_all()
            raise
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._stepping -= 1
                self._last_step = time.monotonic()
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

    def measurements(self) -> int:
        """Timed measurements holding the device or queued for it: the lesson's experiments, the knee,
        the app's own calibration (steps wait while there are any, but for the class's turn)."""
        with self._cond:
            return len(self._queue)

    def _may_step(self) -> bool:
        return not self._busy and (not self._queue or self._class_turn())

    def _class_turn(self) -> bool:
        """Steps may run although an experiment is queued: the class's turn after the last one."""
        now = time.monotonic()
        return now < self._turn_until and (self._stepping > 0 or now - self._last_step < self._quiet_s)

    def _position(self, t: GateTicket) -> int:
        """1 = next to run once the current holder (or the class's turn) is done; 0 = holding (or not queued)."""
        with self._cond:
            if t not in self._queue or t.held:
                return 0
            return sum(1 for other in self._queue[: self._queue.index(t)] if not other.held) + 1

    def _may_take(self, t: GateTicket) -> bool:
        return not self._busy and bool(self._queue) and self._queue[0] is t and not self._class_turn()

    def _acquire(self, t: GateTicket, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._may_take(t):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # the turn ends by the clock too, with no one to notify: wake for it
                self._cond.wait(min(left, self._quiet_s))
            self._busy, t.held = True, True
            return True

    def _release(self, t: GateTicket) -> None:
        with self._cond:
            if t.held:
                self._busy, t.held = False, False
                if self._stepping:
                    self._turn_until = time.monotonic() + self.turn_s
            if t in self._queue:
                self._queue.remove(t)
            self._cond.notify_all()


class Pauses:
    """Why a consumer got nothing for a while, said once a change: `idle()` → the timed measurements that
    hold up its steps now (0: the pause it was told of is over), or None when there is nothing new to say."""

    def __init__(self, gate: DeviceGate):
        self.gate, self._said = gate, 0

    def idle(self) -> int | None:
        now, said = self.gate.measurements(), self._said
        self._said = now
        return None if now == said else now

    def progressed(self) -> None:
        self._said = 0
