"""A pass-time curve: seconds of one target forward pass by tokens per pass, measured on this machine.

The knee chapter's curve, short: measured at the app's warm-up (`specviz.serve.catalog`), by a chapter
before its runs, or read from a profile recorded under `assets/profiles/` on the same kind of machine. The
Playground draws the current step on it, and the theory of the acceptance dial prices passes with it:
a speculative step of k drafts costs t(k + 1), a plain one t(1). Plain data, no torch.
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

from specviz.hardware.device import device_name, find_knee, measure_latency


@dataclass(frozen=True)
class PassCurve:
    """Seconds of one pass by tokens per pass (sizes increasing, times never falling)."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    device: str                 # hardware.device.device_name() of the machine that measured it
    path: str                   # the forward path the passes ran (specviz.fastpath labels)
    context: int                # tokens already in the cache under each timed pass
    recorded: str = ""          # "": measured by this app now; else the recorded profile's name

    def __post_init__(self):
        if len(self.tokens) < 2 or len(self.tokens) != len(self.seconds):
            raise ValueError("a pass-time curve needs two sizes or more, one time each")
        # a bigger pass never costs less: timing noise is not allowed to say otherwise
        fixed, best = [], 0.0
        for s in self.seconds:
            best = max(best, float(s))
            fixed.append(best)
        object.__setattr__(self, "seconds", tuple(fixed))
        object.__setattr__(self, "tokens", tuple(int(n) for n in self.tokens))

    def at(self, n: float) -> float:
        """Seconds of a pass of `n` tokens: interpolated between measured sizes, flat below the smallest,
        along the last measured slope above the largest."""
        xs, ys = self.tokens, self.seconds
        if n <= xs[0]:
            return ys[0]
        i = bisect.bisect_left(xs, n)
        if i >= len(xs):
            i = len(xs) - 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)

    @property
    def knee(self) -> float:
        """The measured knee, in tokens per pass (where the flat part ends)."""
        return find_knee(list(self.tokens), list(self.seconds))

    def as_dict(self) -> dict:
        # "forward_path", not "path": a JSON object with a "path" key reads as a file to gradio's client
        return {"tokens_per_pass": list(self.tokens), "seconds": list(self.seconds), "device": self.device,
                "forward_path": self.path, "context": self.context, "recorded": self.recorded, "knee": self.knee}


SEEN_FASTER = 1.4          # a curve this many times slower than a Run's own passes was timed under load
MIN_SEEN = 5               # passes of one width a Run needs before its median speaks for that width


def curve_beaten(curve: PassCurve, seen: list[tuple[int, float]], factor: float = SEEN_FASTER,
                 min_seen: int = MIN_SEEN) -> bool:
    """Whether a Run's own passes, (tokens computed, seconds) each, ran `factor` times faster than `curve`
    at some width (the median of `min_seen` passes or more of it). A pass cannot beat the machine, and a
    shorter context than the curve's saves far less than that: such a curve was timed while something
    else ran."""
    by_width: dict[int, list[float]] = {}
    for n, secs in seen:
        if n >= 1 and secs > 0:
            by_width.setdefault(int(n), []).append(secs)
    return any(len(ts) >= min_seen and factor * statistics.median(ts) < curve.at(n)
               for n, ts in by_width.items())


def curve_from_profile(prof) -> PassCurve:
    """A recorded profile (`specviz.hardware.profiles.Profile`) as a curve, named after its file."""
    return PassCurve(tuple(prof.tokens_per_pass), tuple(prof.latency_s), prof.where, prof.path, prof.context,
                     recorded=prof.name)


CURVE_SIZES = (1, 2, 4, 8, 16, 32, 64)     # the knee chapter's sizes up to 64; larger passes follow the last slope


def measure_curve(model, device, dtype, new_cache=None, context: int = 64, sizes: tuple[int, ...] = CURVE_SIZES,
                  path: str = "", rounds: int = 3) -> PassCurve:
    """Time one target pass at each size on this machine: `rounds` sweeps over every size, each pass
    after a warm-up pass of its shape, and each size's median over the sweeps, so a burst of other load
    on the machine lands on one sample of every size rather than on every sample of one (about a second
    and a half for a 135M model on two cores). The caller holds the device to itself meanwhile.
    `new_cache`: the forward path the engine runs."""
    sweeps = [measure_latency(model, list(sizes), context, device, dtype, 1, new_cache, one_cache=True)
              for _ in range(rounds)]
    secs = [statistics.median(s[i] for s in sweeps) for i in range(len(sizes))]
    return PassCurve(tuple(sizes), tuple(secs), device_name(device), path, context)
