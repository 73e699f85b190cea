"""How slider changes reach a running generation: straight into the engine's `Knobs` when it runs in
this process (`LocalControl`), or through a small JSON file that a ZeroGPU worker polls between steps
(`ControlFile`; a forked worker shares no memory with the app)."""
from __future__ import annotations

import json
import os
import tempfile
import threading
import uuid

from specviz.engine.policies import FIXED, PolicyChoice
from specviz.engine.request import Knobs
from specviz.limits import Limits
from specviz.serve.door import check_knobs


class Dial:
    """A synthetic Run's acceptance dial A: the page's thread sets it, the Run's engine thread reads it
    between two steps and hands it to its drafter (`specviz.serve.runner.run_packets`)."""

    def __init__(self, rate: float):
        self._lock = threading.Lock()
        self._rate = float(rate)

    def set(self, rate: float) -> None:
        with self._lock:
            self._rate = float(rate)

    def rate(self) -> float:
        with self._lock:
            return self._rate


class LocalControl:
    """Live changes for a request in this process (the shared batch, or a synthetic Run's own engine):
    checked at the door, then straight into its Knobs (and its `dial`, for a synthetic Run). `policy` and
    `threshold` are what the page sent (the radio's name, the threshold box); a bad value is refused
    with one sentence and changes nothing."""

    def __init__(self, knobs: Knobs, limits: Limits = Limits(), dial: Dial | None = None):
        self.knobs, self.limits, self.dial = knobs, limits, dial
        self.ticket = None              # the scheduler's ticket, once submitted

    def set(self, depth=None, batch=None, policy=None, threshold=None, acceptance=None) -> None:
        change = check_knobs(depth, batch, policy, threshold, self.limits, acceptance)
        built = None if change.policy is None else change.policy.build()     # a new policy starts afresh
        self.knobs.set(depth=change.depth, batch_size=change.batch, policy=built)
        if change.acceptance is not None and self.dial is not None:        # a real draft has no dial
            self.dial.set(change.acceptance)

    def stop(self) -> None:
        if self.ticket is not None:
            self.ticket.cancel()
        self.knobs.stop.set()

    def close(self) -> None:
        """The Run's handler ended (finished, failed, or the tab closed): its rows leave the batch."""
        self.stop()


class ControlFile:
    """Slider changes for an engine in another process, through a JSON file written atomically.

    The main process checks each change at the door, as LocalControl does, keeps the current values in a
    shadow `Knobs`, then rewrites the file; the worker compares the file's sequence number between steps
    and applies what changed."""

    def __init__(self, path: str, knobs: Knobs | None = None, policy: PolicyChoice = FIXED,
                 limits: Limits = Limits(), acceptance: float | None = None):
        self.path = path
        self.shadow = knobs              # main side: the values last sent
        self.policy = policy
        self.limits = limits
        self.acceptance = acceptance     # a synthetic Run's dial: main side the value sent, worker side the one read
        self.seq = 0
        self.seen = -1                   # worker side: the last sequence number applied

    @classmethod
    def create(cls, knobs: Knobs, policy: PolicyChoice, limits: Limits = Limits(),
               acceptance: float | None = None) -> "ControlFile":
        folder = os.path.join(tempfile.gettempdir(), "specviz-control")
        os.makedirs(folder, exist_ok=True)
        ctl = cls(os.path.join(folder, f"{uuid.uuid4().hex}.json"), knobs, policy, limits, acceptance)
        ctl._write(False)
        return ctl

    # --- main process ----------------------------------------------------------------------------
    def set(self, depth=None, batch=None, policy=None, threshold=None, acceptance=None) -> None:
        change = check_knobs(depth, batch, policy, threshold, self.limits, acceptance)
        if change.policy is not None:
            self.policy = change.policy
        if change.acceptance is not None and self.acceptance is not None:
            self.acceptance = change.acceptance
        self.shadow.set(depth=change.depth, batch_size=change.batch)
        self._write(self.shadow.stop.is_set())

    def stop(self) -> None:
        self.shadow.stop.set()
        self._write(True)

    def close(self) -> None:
        try:
            os.remove(self.path)
        except OSError:
            pass

    def _write(self, stop: bool) -> None:
        s = self.shadow.snapshot()
        self.seq += 1
        policy = [self.policy.name, self.policy.threshold, self.policy.table, self.policy.max_depth]
        data = {"seq": self.seq, "depth": s.depth, "batch": s.batch_size, "policy": policy, "stop": stop,
                "acceptance": self.acceptance}
        tmp = f"{self.path}.{self.seq}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)       # readers see the old file or the new one, never half of one

    # --- worker process --------------------------------------------------------------------------
    def apply(self, knobs: Knobs) -> None:
        """Apply the latest settings to the worker's knobs (cheap when nothing changed)."""
        try:
            with open(self.path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return                       # no file yet or gone: keep the current settings
        if data.get("seq", -1) == self.seen:
            return
        self.seen = data["seq"]
        if data.get("stop"):
            knobs.stop.set()
        # written by our own main process from checked values: rebuilt as they are, not checked again
        name, threshold, table, max_depth = data["policy"]
        policy = PolicyChoice(name, threshold, tuple(map(tuple, table)) if table else None, max_depth)
        knobs.set(depth=data["depth"], batch_size=data["batch"],
                  policy=policy.build() if policy != self.policy else None)
        self.policy = policy
        if data.get("acceptance") is not None:
            self.acceptance = float(data["acceptance"])

    def rate(self) -> float | None:
        """Worker side: the dial's A last read (None: not a synthetic Run)."""
        return self.acceptance
