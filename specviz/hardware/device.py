"""What the hardware is doing: calibrated peaks, a live utilisation sampler, and per-step derived metrics.

- `calibrate()` measures this device's copy bandwidth and matmul FLOP/s in a given dtype (a second or
  two), so MBU and MFU are fractions of what *this* machine reaches, not of a datasheet;
  `cached_peaks()` keeps the result per machine in the user cache.
- `Sampler` is a daemon thread sampling GPU utilisation/memory/power via NVML, or CPU utilisation and
  RSS via psutil when there is no GPU. A reading that cannot be had (no NVML, a MIG slice, ZeroGPU's
  main process) is `None` — shown as "unavailable", never as 0.
- `step_metrics()` turns a step's bytes, FLOPs and time into achieved bandwidth / FLOP/s, MBU, MFU and
  a regime label.
"""
from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from specviz.machine import cache_root

FLAT = 1.25          # a pass within 25 % of the one-token pass counts as "flat" (the memory-bound test)

# a pass over this many times its roofline time is explained by neither memory nor compute: fixed costs
# (kernel launches, Python, bookkeeping) fill it. The lesson's knee chapter and the What-if use the same rule.
OVERHEAD_FACTOR = 2.0


@dataclass(frozen=True)
class Peaks:
    device: str
    bandwidth: float     # bytes/s, measured with a large device-to-device copy
    flops: float         # FLOP/s, measured with a large square matmul in `dtype`
    dtype: str

    @property
    def ridge(self) -> float:
        """FLOPs per byte at which compute time equals streaming time."""
        return self.flops / self.bandwidth


def sync(device) -> None:
    """Wait for the device's queued work (a CUDA kernel returns before it has run; a CPU op has run)."""
    if device.type == "cuda":
        # on first use: torch is slow to import
        import torch

        torch.cuda.synchronize(device)


def timed_once(fn, device) -> float:
    """Seconds one call of `fn` keeps the device busy, from a quiet device to a quiet device."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


# calibrate's operations back to back on a GPU, timed as one by the device's clock: a launch and a wait
# around one short copy would lengthen it by a tenth on the host's clock, reading the bandwidth low and
# MBU high; eight calls queue far more device work than one launch's latency
CUDA_CALLS = 8


def device_seconds(fn, device, calls: int = CUDA_CALLS) -> float:
    """Seconds one call of `fn` keeps the device busy: on CUDA by the device's own clock (events around
    `calls` calls back to back), elsewhere one call by the host's (`timed_once`)."""
    if device.type != "cuda":
        return timed_once(fn, device)
    import torch

    with torch.cuda.device(device):
        sync(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls


def _timed(fn, device, repeats: int, best: bool = False) -> float:
    """The median of `repeats` timed calls after a warm-up; `best`: the fastest (a peak is the most the
    machine did: other work on the cores only ever slows a call)."""
    fn()  # warm-up
    times = sorted(device_seconds(fn, device) for _ in range(repeats))
    return times[0] if best else times[len(times) // 2]


def _device_and_dtype(device, dtype):
    """The device and dtype models run in here by default: CUDA in bf16 when present, else CPU in fp32."""
    # on first use: torch is slow to import
    import torch

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return device, dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)


def calibrate(device=None, dtype=None, size_mb: int = 256, matmul_n: int = 1024, repeats: int = 5) -> Peaks:
    """Measure copy bandwidth and matmul throughput on `device` (the fastest of `repeats`: a peak)."""
    # on first use: torch is slow to import
    import torch

    device, dtype = _device_and_dtype(device, dtype)
    n = size_mb * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t_copy = _timed(lambda: dst.copy_(src), device, repeats, best=True)
    bandwidth = 2 * src.numel() * 4 / t_copy           # a copy reads and writes every byte
    if device.type == "cuda":
        matmul_n = max(matmul_n, 8192)
    a = torch.randn(matmul_n, matmul_n, dtype=dtype, device=device)
    b = torch.randn(matmul_n, matmul_n, dtype=dtype, device=device)
    t_mm = _timed(lambda: a @ b, device, repeats, best=True)
    return Peaks(device.type, bandwidth, 2 * matmul_n**3 / t_mm, str(dtype).replace("torch.", ""))


def copy_bandwidth(device, size_mb: int = 256, repeats: int = 3) -> float:
    """Bytes/s of a `size_mb` copy (read + write), median of `repeats`: calibrate's bandwidth alone."""
    # on first use: torch is slow to import
    import torch

    src = torch.empty(size_mb * 2**20 // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _timed(lambda: dst.copy_(src), device, repeats)


def paired_roofline(model, context: int, device, dtype, nbytes: float, repeats: int = 5, new_cache=None) -> list[float]:
    """A one-token pass ÷ its roofline time (`nbytes` ÷ bandwidth), measured in pairs — the bandwidth,
    then the pass, `repeats` times — so each ratio compares two figures taken a second apart. On a
    shared machine the bandwidth drifts by half again within hours: a ratio of a calibration and a
    pass measured minutes apart mostly measures the drift."""
    out = []
    for _ in range(repeats):
        bw = copy_bandwidth(device)
        secs = measure_latency(model, [1], context, device, dtype, 1, new_cache)[0]
        out.append(secs / (nbytes / bw))
    return out


def device_name(device) -> str:
    """A readable name for a profile: "cuda: NVIDIA H200", "cpu: 2 cores"."""
    # on first use: torch is slow to import
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {os.cpu_count()} cores"


def cpu_name() -> str:
    """The CPU's model name as lscpu shows it, and its cores: "AMD EPYC (2 cores)" (every CPU figure
    carries it: the machines here have been both AMD and Intel)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"cpu ({os.cpu_count()} cores)"


def machine_name(kind: str) -> str:
    """Where a run ran, for a recording or a page: the CPU's model and cores, or the GPU's name where this
    process drives it (a ZeroGPU page's process does not: there it stays "cuda")."""
    if kind == "cpu":
        return cpu_name()
    # on first use: torch is slow to import
    import torch

    if kind == "cuda" and torch.cuda.is_initialized():
        return torch.cuda.get_device_name()
    return kind


def free_memory(device) -> float | None:
    """Bytes a new request may still use on `device`: free GPU memory, or half of the machine's
    available RAM on CPU (the OS, the browser and the other students' runs need the rest). None when it
    cannot be read; the memory guard then admits by the row limits alone."""
    try:
        import torch

        if getattr(device, "type", str(device)) == "cuda":
            return float(torch.cuda.mem_get_info(device)[0]) * 0.9
        import psutil

        return float(psutil.virtual_memory().available) * 0.5
    except Exception:
        return None


def machine_key(device, dtype) -> str:
    """What a calibration is valid for: this host, this device, this dtype, this torch."""

    # on first use: torch is slow to import
    import torch

    return f"{platform.node()} | {device_name(device)} | {str(dtype).replace('torch.', '')} | torch {torch.__version__}"


# A measurement taken while the machine was busy is not kept for good: a calibration beside a running
# `pip` reads a third of the quiet bandwidth, and a cached figure is shown to the class for ever. So every
# cached measurement carries the load it was taken under, and is taken again at the next use when that
# load was high or the entry is old.
BUSY_LOAD_PER_CPU = 0.75      # 1-minute load average per CPU at or above which the machine counts as busy
MAX_AGE_S = 7 * 24 * 3600     # a week: drivers, BIOS settings and neighbours change


def _this_process() -> int:
    return os.getpid()


class OthersMeter:
    """The share of this machine's CPU time that other programs took while something ran here: the
    machine's busy time less this process's own, over wall time × CPUs. None where psutil cannot say.
    (A timed experiment holds the device against SpecViz's own work; other programs it cannot stop.)"""

    def __init__(self):
        self._start = self._read()

    @staticmethod
    def _read():
        try:
            import psutil

            total, own = psutil.cpu_times(), psutil.Process().cpu_times()
        except Exception:                  # noqa: BLE001 — no psutil, or no /proc to read
            return None
        busy = sum(total) - total.idle - getattr(total, "iowait", 0.0)
        return time.monotonic(), busy, own.user + own.system, psutil.cpu_count() or 1

    def share(self) -> float | None:
        end = self._read()
        if self._start is None or end is None:
            return None
        (t0, busy0, own0, cpus), (t1, busy1, own1, _) = self._start, end
        wall = (t1 - t0) * cpus
        return min(1.0, max(0.0, ((busy1 - busy0) - (own1 - own0)) / wall)) if wall > 0 else None


def load_now() -> dict:
    """The machine's load right now, as stored beside a measurement: 1-minute load average, CPUs, time."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):          # Windows: no load average
        load = -1.0
    return {"load": round(load, 2), "cpus": os.cpu_count() or 1, "at": round(time.time()), "pid": _this_process()}


def is_busy(record) -> bool:
    """True when `record` (from load_now) says others were using the CPUs (unknown load: not busy)."""
    try:
        return float(record["load"]) / max(1, int(record["cpus"])) >= BUSY_LOAD_PER_CPU
    except (TypeError, KeyError, ValueError):
        return False


def remeasure_reason(record, now: float | None = None) -> str:
    """Why a cached measurement should be taken again ("" when it may be kept): it has no load record
    (an older version's entry), a pass beat it (`distrust`), was taken on a busy machine, or is older than
    MAX_AGE_S. The process that measured it keeps it whatever the reason."""
    if not isinstance(record, dict):
        return "stored without the machine's load"
    if record.get("pid") == _this_process():
        return ""              # taken by this very process: kept until the next start, busy or not
    if record.get("beaten"):
        return f"beaten by a measured pass ({record['beaten']} of the peak)"
    if is_busy(record):
        return f"measured on a busy machine (load {record['load']:.2f} on {record['cpus']} CPUs)"
    try:
        age = (now or time.time()) - float(record["at"])
    except (KeyError, TypeError, ValueError):
        return "stored without a date"
    return f"{age / 86400:.0f} days old" if age > MAX_AGE_S else ""


BEATEN = 1.10                 # a pass this far past a calibrated peak (MBU or MFU) proves the peak was measured low
_distrusted: set[str] = set()    # devices a pass beat here, each marked once (under _distrust_lock)
_distrust_lock = threading.Lock()  # two watching pages' steps may both beat the peak at once


def distrust(peaks: Peaks, what: str) -> bool:
    """Mark the cached entry of `peaks` so that the next start measures them again: a pass ran past them
    (`what` says how far), so they were measured low, beside other work. Once per process and machine;
    False where nothing was marked (another entry by now, no cache, a device this process cannot name)."""
    import logging

    # on first use: torch is slow to import
    import torch

    seen = f"{peaks.device} {peaks.dtype}"        # tried once, even where no key can be made here
    with _distrust_lock:
        if seen in _distrusted:
            return False
        _distrusted.add(seen)
    try:
        key = machine_key(torch.device(peaks.device), getattr(torch, peaks.dtype))
    except Exception:                  # noqa: BLE001 — e.g. a GPU worker's peaks in a process without CUDA
        return False
    path = cache_root() / "peaks.json"
    table = read_table(path)
    entry = table.get(key)
    same = isinstance(entry, dict) and (entry.get("bandwidth"), entry.get("flops")) == (peaks.bandwidth, peaks.flops)
    if not (same and isinstance(entry.get("measured"), dict)):
        return False
    entry["measured"]["beaten"] = what
    write_table(path, table)
    logging.getLogger("specviz").info("calibration: a pass reached %s of the calibrated peak; measured again at "
                                      "the next start", what)
    return True


def cached_peaks(device=None, dtype=None, refresh: bool = False, **calibrate_kw) -> Peaks:
    """This machine's peaks from the cache (`<cache>/peaks.json`, one entry per `machine_key`), measured
    and stored when missing, when `refresh` (what `python -m specviz calibrate` does), or when the stored
    one was taken on a busy machine or is stale (`remeasure_reason`; the log says which)."""
    import logging

    device, dtype = _device_and_dtype(device, dtype)
    key, path = machine_key(device, dtype), cache_root() / "peaks.json"
    table = read_table(path)
    entry = table.get(key)
    if not refresh and isinstance(entry, dict):
        why = remeasure_reason(entry.get("measured"))
        if not why:
            try:
                return Peaks(**{k: v for k, v in entry.items() if k != "measured"})
            except TypeError:
                pass                     # an entry from another version: measure again
        else:
            logging.getLogger("specviz").info("calibration: the cached peaks were %s; measuring again", why)
    load = load_now()
    peaks = calibrate(device, dtype, **calibrate_kw)
    table[key] = {"device": peaks.device, "bandwidth": peaks.bandwidth, "flops": peaks.flops, "dtype": peaks.dtype,
                  "measured": load}
    if is_busy(load):
        logging.getLogger("specviz").info("calibration: %.1f GB/s measured on a busy machine (load %.2f on %d "
                                          "CPUs); measured again at the next start", peaks.bandwidth / 1e9,
                                          load["load"], load["cpus"])
    write_table(path, table)
    with _distrust_lock:             # a pass that beats this new entry marks it in turn
        _distrusted.discard(f"{peaks.device} {peaks.dtype}")
    return peaks


def read_table(path) -> dict:
    """A JSON object from a cache file; {} when it is missing or unreadable (then it is measured again)."""

    try:
        table = json.loads(path.read_text())
        return table if isinstance(table, dict) else {}
    except (OSError, ValueError):
        return {}


def write_table(path, table: dict) -> None:
    """Replace a cache file atomically (two processes may calibrate at once)."""

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass                             # a read-only cache only costs a re-measurement next time


@dataclass
class Sample:
    t: float
    util: float | None          # % busy (GPU: share of time a kernel ran; CPU: all cores)
    memory: float | None        # bytes in use (GPU memory, or this process's RSS)
    power: float | None         # watts (GPU only)
    source: str                 # "nvml", "psutil" or "none"


def _nvml_reader():
    """A function returning (util %, memory bytes, power W) from NVML, or None when NVML is unusable."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceGetUtilizationRates(handle)   # fails on MIG slices and some containers
    except Exception:
        return None

    def read():
        util = mem = power = None
        try:
            util = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:
            pass
        try:
            mem = float(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:
            pass
        try:
            power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except Exception:
            pass
        return util, mem, power
    return read


def _psutil_reader():
    try:
        import psutil
    except Exception:
        return None
    proc = psutil.Process()
    psutil.cpu_percent(None)   # prime: the first call has no interval to average over

    def read():
        return float(psutil.cpu_percent(None)), float(proc.memory_info().rss), None
    return read


@dataclass
class Sampler:
    """Samples hardware at `hz` in a daemon thread; `start()`/`stop()`; `recent()` for the charts."""

    hz: float = 5.0
    keep: int = 600
    prefer_gpu: bool = True
    cpu_fallback: bool = True      # False where the work runs on a GPU: CPU load would mislead
    samples: deque = field(default_factory=deque)

    def __post_init__(self):
        self.samples = deque(self.samples, maxlen=self.keep)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._read, self.source = None, "none"
        if self.prefer_gpu:
            self._read = _nvml_reader()
            self.source = "nvml" if self._read else "none"
        if self._read is None and self.cpu_fallback:
            self._read = _psutil_reader()
            self.source = "psutil" if self._read else "none"

    def start(self) -> "Sampler":
        if self._thread is not None and self._stop.is_set():
            self._thread.join()          # told to stop: it ends within one reading, then a new one starts
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="specviz-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self, wait: float = 2.0) -> None:
        """End the thread; it sleeps on the same event, so it ends within one reading."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.read_once())
            self._stop.wait(1.0 / self.hz)

    def read_once(self) -> Sample:
        if self._read is None:
            return Sample(time.time(), None, None, None, "none")
        try:
            util, mem, power = self._read()
        except Exception:
            util = mem = power = None
        return Sample(time.time(), util, mem, power, self.source)

    def recent(self, seconds: float = 30.0) -> list[Sample]:
        cut = time.time() - seconds
        return [s for s in list(self.samples) if s.t >= cut]


@dataclass(frozen=True)
class StepMetrics:
    bandwidth: float        # achieved bytes/s
    flops: float            # achieved FLOP/s
    mbu: float | None       # bandwidth ÷ calibrated peak
    mfu: float | None       # FLOP/s ÷ calibrated peak
    regime: str             # "overhead-bound", "memory-bound", "compute-bound"; "uncalibrated" without peaks


# regimes named without peaks to hold a step against: this machine not calibrated yet, or a replay
UNKNOWN_REGIMES = ("uncalibrated", "unrecorded")


def step_metrics(flops: float, nbytes: float, seconds: float, peaks: Peaks | None) -> StepMetrics:
    """Derived metrics for one forward pass (or a sum of them) that took `seconds`.

    Regime rule: the roofline time is max(bytes/BW, FLOPs/peak). If the measured time is more than
    twice that, neither memory nor compute explains it — launch/Python overhead does
    ("overhead-bound"). Otherwise the larger of the two roofline terms names the regime.
    """
    seconds = max(seconds, 1e-9)
    bw, fl = nbytes / seconds, flops / seconds
    if peaks is None:
        return StepMetrics(bw, fl, None, None, "uncalibrated")
    t_mem, t_comp = nbytes / peaks.bandwidth, flops / peaks.flops
    if seconds > OVERHEAD_FACTOR * max(t_mem, t_comp):
        regime = "overhead-bound"
    else:
        regime = "memory-bound" if t_mem >= t_comp else "compute-bound"
    return StepMetrics(bw, fl, bw / peaks.bandwidth, fl / peaks.flops, regime)


def flat_to(tokens: list[int], seconds: list[float], tolerance: float = FLAT) -> int:
    """The largest tokens per pass up to which every pass stayed within `tolerance` × the first."""
    last = tokens[0]
    for n, t in zip(tokens, seconds):
        if t > tolerance * seconds[0]:
            break
        last = n
    return last


def find_knee(tokens: list[int], seconds: list[float]) -> float:
    """Where latency leaves its flat part, fitting t(n) ≈ max(a, b·n).

    a = the flat floor (median of the three smallest latencies), b = the slope of the compute-bound
    tail (median of t/n over the largest third of n). The knee is a / b, in tokens per pass."""
    pts = sorted(zip(tokens, seconds))
    floor = sorted(t for _, t in pts)[: max(1, min(3, len(pts)))]
    a = floor[len(floor) // 2]
    tail = pts[-max(2, len(pts) // 3):]
    slopes = sorted(t / n for n, t in tail)
    b = slopes[len(slopes) // 2]
    return a / b if b > 0 else float("inf")


def measure_latency(model, tokens_per_pass: list[int], context: int, device, dtype, repeats: int = 5,
                    new_cache=None, one_cache: bool = False):
    """Median target forward latency for n new tokens on top of a `context`-token cache: through the stock
    modules, or through the forward path the engine runs when `new_cache` (batch → KV cache with
    `forward(model, tokens, valid)`, e.g. the fast path's) is given. Each sample gets a fresh cache (the
    knee's curve); `one_cache`: the samples of a size run one after another on one cache, whose context
    grows by n a pass (a third of the passes: adaptive verification's start-up profile, which its budget
    rescales to the steps it then observes)."""
    # on first use: torch is slow to import
    import torch
    # on first use: transformers is slow to import
    from transformers import DynamicCache

    out = []
    vocab = model.get_input_embeddings().weight.shape[0]

    def pass_fn(ids):
        """A cache holding the context and one pass of this shape already run on it: the timed pass
        then meets what a decode step meets (a pass of the same shape just before it, the buffers grown),
        not the first pass after a prefill (other matrix shapes, a cache about to reallocate)."""
        if new_cache is None:
            cache = DynamicCache()
            model(input_ids=ctx_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            return lambda: model(input_ids=ids, past_key_values=cache, use_cache=True)
        cache = new_cache(1)
        cache.forward(model, ctx_ids, torch.ones_like(ctx_ids, dtype=torch.bool), 1)
        cache.forward(model, ids, torch.ones_like(ids, dtype=torch.bool))
        return lambda: cache.forward(model, ids, torch.ones_like(ids, dtype=torch.bool))

    with torch.inference_mode():
        ctx_ids = torch.randint(0, vocab, (1, context), device=device)
        for n in tokens_per_pass:
            times = []
            same = pass_fn(torch.randint(0, vocab, (1, n), device=device)) if one_cache else None
            for r in range(repeats + 1):
                run = same or pass_fn(torch.randint(0, vocab, (1, n), device=device))
                seconds = timed_once(run, device)
                if r:                   # the first pass of each size is a warm-up
                    times.append(seconds)
            out.append(sorted(times)[len(times) // 2])
    return out


KNEE_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def knee_steps(model, device, dtype, context: int = 256, repeats: int = 3, cap: int | None = None,
               new_cache=None):
    """Measure the latency curve one point at a time (log-spaced tokens per pass, up to 128 on CPU and
    512 on GPU), yielding (tokens so far, latencies so far) so a UI can draw it as it grows. `new_cache`:
    the forward path the engine runs (see measure_latency)."""
    cap = cap or (512 if getattr(device, "type", "") == "cuda" else 128)
    ns = [n for n in KNEE_TOKENS if n <= cap]
    lat: list[float] = []
    for n in ns:
        lat += measure_latency(model, [n], context, device, dtype, repeats, new_cache)
        yield ns[: len(lat)], list(lat)
