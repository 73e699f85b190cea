"""The playground's counters as text in the student's language: what was measured, how it compares with
plain decoding, and whether the device was shared while it was measured. Pure functions of numbers,
except `NoiseBands`: the verdict's noise band, measured from the server's repeated baselines (locked)."""
from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass

from specviz import lessons
from specviz.hardware.device import UNKNOWN_REGIMES
from specviz.ui.i18n import t


def device_md(lang: str, sample) -> str:
    """The sampler's latest memory and power reading, or what is unavailable (never a made-up 0)."""
    if sample is None or sample.source == "none":
        return t(lang, "playground.memory_unavailable")
    na = t(lang, "playground.unavailable")
    where = t(lang, "playground.gpu_memory" if sample.source == "nvml" else "playground.process_memory")
    mem = na if sample.memory is None else f"{sample.memory / 2**30:.2f} GiB"
    power = na if sample.power is None else f"{sample.power:.0f} W"
    return t(lang, "playground.memory", where=where, memory=mem, power=power, source=sample.source)


def sharing_md(lang: str, totals, zero_gpu: bool) -> str:
    """Whether the figures were measured while others shared the batch (honest timing)."""
    if zero_gpu:
        return t(lang, "playground.shared_zerogpu")
    if totals.users_max > 1:
        return t(lang, "playground.shared_with", users=totals.users_max, rows=totals.shared_batch_max)
    return t(lang, "playground.shared_alone")


# The race chapter's noise band: on the 2-core machine the same run measured twice differs by up to
# ±5 %, so a ratio inside it names no winner (one run each side cannot tell 0.97× from 1.03×)
NOISE_BAND = 0.05


def verdict(speed: float | None, band: float = NOISE_BAND) -> str:
    """ "faster", "slower" or "same" (inside the noise band) for speculation ÷ plain tokens/s."""
    if speed is None:
        return "none"
    return "faster" if speed > 1 + band else "slower" if speed < 1 - band else "same"


@dataclass(frozen=True)
class Band:
    """The noise band a verdict uses: ± `width`, measured from `samples` plain baselines of the same
    request on this server (0: none yet, the race chapter's band borrowed)."""
    width: float = NOISE_BAND
    samples: int = 0
    outliers: int = 0               # baselines left out of the spread, far from the rest (see _band)


class NoiseBands:
    """The band measured here: every plain baseline of a request (pair, prompts, batch, tokens) is kept
    (the last KEEP), and once a request has two, its band is their spread, (max − min) ÷ median — how
    much the same run measured twice differed on this machine (see _band) — never narrower than NOISE_BAND. A short
    Run on a 2-core machine spread ±20 % and more between presses, four times the borrowed band.
    Shared by every session of the server: guarded by a lock."""
    KEEP, MAX_KEYS = 8, 512

    def __init__(self):
        self._lock = threading.Lock()
        self._seen: dict[tuple, list[float]] = {}

    def add(self, key: tuple, plain_tps: float) -> Band:
        """Record one baseline; the band for a verdict that uses it."""
        with self._lock:
            if key not in self._seen and len(self._seen) >= self.MAX_KEYS:
                self._seen.pop(next(iter(self._seen)))          # the oldest request shape goes
            got = self._seen.setdefault(key, [])
            got.append(plain_tps)
            del got[:-self.KEEP]
            return _band(list(got))

    def band(self, key: tuple) -> Band:
        """The band measured so far for this request, recording nothing."""
        with self._lock:
            return _band(list(self._seen.get(key, [])))


# a baseline this many robust deviations from the median is left out of the spread: far enough that
# normal noise (simulated, 10 % spread) almost never is, so the verdict's false alarms barely move
OUTLIER_MADS = 8.0


def _band(samples: list[float]) -> Band:
    """The spread of the baselines, less any far outlier: one baseline taken while the machine was busy
    would widen the band of every later verdict until it aged out. Ordinary noise is not trimmed (dropping
    the fastest and slowest of five would halve the band and double the false verdicts)."""
    if len(samples) < 2:
        return Band(NOISE_BAND, 0)
    kept = _without_outliers(samples)
    spread = (max(kept) - min(kept)) / statistics.median(samples)
    return Band(max(NOISE_BAND, spread), len(samples), len(samples) - len(kept))


def _without_outliers(samples: list[float]) -> list[float]:
    """Samples within OUTLIER_MADS × 1.4826 median absolute deviations of the median (1.4826 MAD is σ
    for normal noise), from four samples on (fewer cannot tell an outlier from the rest)."""
    if len(samples) < 4:
        return samples
    med = statistics.median(samples)
    mad = statistics.median(abs(x - med) for x in samples)
    if mad <= 0:
        return samples
    return [x for x in samples if abs(x - med) <= OUTLIER_MADS * 1.4826 * mad]


def unlike(run_users: int, plain_users: int) -> bool:
    """A Run and its baseline measured one alone and one sharing the batch: another user's Run that began
    or ended between them slowed one side only, so their ratio is no verdict."""
    return (run_users > 1) != (plain_users > 1)


def baseline_md(lang: str, totals, plain_tps: float | None, during_warmup: bool = False,
                band: Band = Band(), recorded: bool = False, plain_users: int = 1) -> str:
    """Speculation against plain decoding of the same prompts and batch (measured right after, streamed
    to the page like the run); no verdict for a run measured during the app's own warm-up, for one whose
    baseline shared the batch where the run did not (or the other way round), nor for a replay (a
    recording keeps the run, not a baseline on its machine). `plain_users`: the baseline's most users."""
    if during_warmup:
        return t(lang, "playground.baseline_during_warmup")
    if recorded:
        return t(lang, "playground.baseline_recorded")
    if not plain_tps or not totals.tokens_per_s:
        return t(lang, "playground.baseline_missing")
    if unlike(totals.users_max, plain_users):
        key = "playground.baseline_unlike_alone" if totals.users_max <= 1 else "playground.baseline_unlike_shared"
        return t(lang, key, users=plain_users)
    speed = totals.tokens_per_s / plain_tps
    key = {"faster": "playground.baseline_faster", "slower": "playground.baseline_slower",
           "same": "playground.baseline_same"}[verdict(speed, band.width)]
    source = (t(lang, "playground.band_measured" + ("_outliers" if band.outliers else ""), n=band.samples,
                outliers=band.outliers) if band.samples
              else t(lang, "playground.band_borrowed"))
    said = t(lang, key, flops=totals.flops_ratio, speed=speed, plain=plain_tps, band=band.width, source=source)
    shared = t(lang, "playground.baseline_shared_too", users=plain_users, run_users=totals.users_max)
    return said + (" " + shared if plain_users > 1 else "")


def path_md(lang: str, path: str, fast) -> str:
    """Which forward path ran the latest step, and where the fast path stands (`fast`: a FastStatus or None)."""
    if not path:
        return ""
    text = t(lang, "playground.path", path=path)
    if fast is not None and fast.state == "warming":
        text += t(lang, "playground.path_warming")
    return text


def counters_md(lang: str, totals, regime: str = "", sample=None, pass_md: str = "", path_md: str = "") -> str:
    """The counters' line; `regime`, `pass_md` and `path_md` are their parts, already said (regime_md…)."""
    # kept ÷ verified drafts (vLLM's ratio) is named "drafts kept", not "acceptance": it reads below the
    # dial's A at depth > 1 (the drafts after a rejection count), and beside the dial looked like it failing
    kept = t(lang, "playground.acceptance_none") if totals.acceptance_rate is None else \
        t(lang, "playground.acceptance", value=f"{totals.acceptance_rate:.0%}")
    parts = [t(lang, "playground.tokens_per_s", value=totals.tokens_per_s), kept,
             t(lang, "playground.per_pass", value=totals.mean_accepted_length),
             t(lang, "playground.flops", value=totals.flops_ratio)]
    proposed = getattr(totals, "proposed", 0)
    if proposed > totals.drafted:          # adaptive verification checked only part of the drafts
        parts.append(t(lang, "playground.verified_slots", verified=totals.drafted, proposed=proposed))
    if pass_md:
        parts.append(pass_md)
    if regime:
        parts.append(regime)
    if path_md:
        parts.append(path_md)
    parts.append(device_md(lang, sample))
    if lessons.direction(lang) == "rtl":
        # each part its own right-to-left island: a part ending in a Latin word ("… target") ran into the
        # next one's ("FLOP") as one left-to-right block, and the Persian between them read out of order
        parts = [lessons.RLI + p + lessons.PDI for p in parts]
    return " · ".join(parts)


def pass_md(lang: str, last_pass, knee: int | None, measured: bool = False) -> str:
    """Tokens the latest verify pass carried (rows + verified drafts, as the pass-time chart counts them),
    what its path computed where that differs, beside the knee: the one the pass-time chart measured, else
    the roofline's estimate for this target here. `last_pass`: a serve.live.PassShape."""
    if last_pass is None:
        return ""
    n, rows = last_pass.real, last_pass.rows
    text = t(lang, "playground.pass_tokens", n=n, rows=lessons.Said("app.n_rows", n=rows),
             drafts=lessons.Said("app.n_drafts_verified", n=max(n - rows, 0)))
    if last_pass.computed != n:
        text += t(lang, "playground.pass_computed", computed=last_pass.computed)
    if knee is not None:
        side = "below" if n < knee else "at" if n == knee else "past"
        text += t(lang, f"playground.pass_{side}_knee" + ("_measured" if measured else ""), knee=knee)
    return text


def regime_md(lang: str, regime: str, last_pass=None, knee: int | None = None, measured: bool = False,
              estimate: int | None = None) -> str:
    """The latest step's regime by the roofline (`regime`, a code value such as "memory-bound"). Where the
    chart's measured knee puts the pass on the other side, the two knees differ and the pass lies between
    them: the line says so instead of contradicting the knee named beside it. Where even the roofline's own
    one-row knee disagrees, the step's rows and contexts are why, and the line says that."""
    if not regime:
        return ""
    name = lessons.Key(f"playground.regime_name.{regime}")
    shown = name if lessons.template("en", name) != name else regime
    if regime in UNKNOWN_REGIMES:
        return t(lang, "playground.regime_unknown", regime=shown)
    n = None if last_pass is None else last_pass.real

    def contradicts(k: int | None) -> bool:
        return k is not None and n is not None and (regime, n < k) in (("compute-bound", True), ("memory-bound", False))

    if not contradicts(knee):
        return t(lang, "playground.regime", regime=shown)
    if measured and estimate is not None and not contradicts(estimate):
        return t(lang, "playground.regime_between", regime=shown, estimate=estimate, knee=knee)
    # the regime prices the step as it ran (every row's context, the draft's pass); the knee beside it is
    # one row's at one context: with long prompts in the batch the two part, and the line says why
    if last_pass.rows == 1:       # one row: the knee is priced at its context, so the draft's passes part them
        return t(lang, "playground.regime_step_one", regime=shown)
    return t(lang, "playground.regime_step", regime=shown, rows=lessons.Said("app.n_rows", n=last_pass.rows))


def batch_md(lang: str, rows: int, users: int, waiting: int = 0) -> str:
    """ "Batch now: N rows from M users" for the selected pair (the chart timer's line)."""
    if rows == 0 and waiting == 0:
        return t(lang, "playground.batch_empty")
    return t(lang, "playground.batch_waiting" if waiting else "app.batch_now", waiting=waiting,
             rows=lessons.Said("app.n_rows", n=rows), users=lessons.Said("app.n_users", n=users))
