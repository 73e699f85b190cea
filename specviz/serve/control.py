"""How slider changes reach a running generation: straight into the engine's `Knobs` when it runs in
this process (`LocalControl`), or through a small JSON file that a ZeroGPU worker polls between steps
(`ControlFile`; a forked worker shares no memory with the app)."""
from __future__ import annotations

import json
import os
import tempfile
import uuid

from specviz.engine.loop import Knobs
from specviz.engine.policies import make_policy


def policy_from(name: str | None, threshold):
    """A policy object from the UI's name and threshold field. The field means a batch size for
    disable-by-batch-size and a probability (0-1) for confidence; a value that does not fit the chosen
    policy is refused with a sentence (`PolicyError`), never silently replaced."""
    name = "fixed" if name is None else name
    if name in ("disable-by-batch-size", "confidence"):
        return make_policy(name, threshold=threshold)
    return make_policy(name)


class LocalControl:
    """Slider changes for a request in this process's shared batch: straight into its Knobs."""

    def __init__(self, knobs: Knobs):
        self.knobs = knobs
        self.ticket = None              # the scheduler's ticket, once submitted

    def set(self, depth=None, batch=None, policy=None) -> None:
        if policy is not None:
            self.knobs.set(policy=policy_from(*policy))
        self.knobs.set(depth=depth, batch_size=batch)

    def stop(self) -> None:
        if self.ticket is not None:
            self.ticket.cancel()
        self.knobs.stop.set()

    def close(self) -> None:
        """The Run's handler ended (finished, failed, or the tab closed): its rows leave the batch."""
        self.stop()


class ControlFile:
    """Slider changes for an engine in another process, through a JSON file written atomically.

    The main process validates each change (by applying it to a local shadow `Knobs`), then rewrites
    the file; the worker compares the file's sequence number between steps and applies what changed."""

    def __init__(self, path: str, knobs: Knobs | None = None, policy=("fixed", None)):
        self.path = path
        self.shadow = knobs              # main side: validates values before they are sent
        self.policy = list(policy)
        self.seq = 0
        self.seen = -1                   # worker side: the last sequence number applied

    @classmethod
    def create(cls, knobs: Knobs, policy) -> "ControlFile":
        folder = os.path.join(tempfile.gettempdir(), "specviz-control")
        os.makedirs(folder, exist_ok=True)
        ctl = cls(os.path.join(folder, f"{uuid.uuid4().hex}.json"), knobs, policy)
        ctl._write(False)
        return ctl

    # --- main process ----------------------------------------------------------------------------
    def set(self, depth=None, batch=None, policy=None) -> None:
        if policy is not None:
            self.shadow.set(policy=policy_from(*policy))     # raises PolicyError on a bad threshold
            self.policy = list(policy)
        self.shadow.set(depth=depth, batch_size=batch)       # raises EngineError when out of range
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
        data = {"seq": self.seq, "depth": s.depth, "batch": s.batch_size, "policy": self.policy, "stop": stop}
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
        policy = tuple(data["policy"])
        knobs.set(depth=data["depth"], batch_size=data["batch"],
                  policy=policy_from(*policy) if policy != tuple(self.policy) else None)
        self.policy = list(policy)
