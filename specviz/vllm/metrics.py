"""vLLM's Prometheus `/metrics` → numbers SpecViz shows (running batch, waiting, tokens, acceptance…).

The text format (https://prometheus.io/docs/instrumenting/exposition_formats/): one sample per line,
`name{label="value",...} number [timestamp]`, comments start with `#`. Counters are cumulative since the
server started, so rates and acceptance over a window are differences of two snapshots.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_prometheus(text: str) -> Samples:
    """name → [(labels, value), ...] for every sample line; malformed lines are skipped."""
    out: Samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(3) or "")}
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def total(samples: Samples, name: str, model: str | None = None) -> float | None:
    """Sum of a metric over its label sets (one model's only, when `model` is given); None if absent."""
    rows = [v for labels, v in samples.get(name, []) if model is None or labels.get("model_name") in (None, model)]
    return sum(rows) if rows else None


@dataclass(frozen=True)
class Snapshot:
    """One read of /metrics. Gauges: running, waiting, kv_usage; the rest are counters."""

    t: float                                   # time.monotonic() when read
    running: float | None                      # requests in the running batch (vllm:num_requests_running)
    waiting: float | None                      # requests queued (vllm:num_requests_waiting)
    kv_usage: float | None                     # share of the KV cache in use, 0-1
    generation_tokens: float | None
    prompt_tokens: float | None
    drafts: float | None                       # verify steps that carried drafts
    draft_tokens: float | None
    accepted_tokens: float | None
    accepted_per_pos: dict[int, float] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted ÷ drafted since the server started."""
        if not self.draft_tokens:
            return None
        return (self.accepted_tokens or 0.0) / self.draft_tokens


def snapshot(text: str, model: str | None = None, t: float | None = None) -> Snapshot:
    s = parse_prometheus(text)

    def get(*names: str) -> float | None:
        for n in names:       # metric names moved between vLLM versions; the first present wins
            v = total(s, n, model)
            if v is not None:
                return v
        return None
    per_pos: dict[int, float] = {}
    for labels, v in s.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", []):
        if model is None or labels.get("model_name") in (None, model):
            if labels.get("position", "").isdigit():
                per_pos[int(labels["position"])] = per_pos.get(int(labels["position"]), 0.0) + v
    return Snapshot(
        time.monotonic() if t is None else t,
        get("vllm:num_requests_running"), get("vllm:num_requests_waiting"),
        get("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"),
        get("vllm:generation_tokens_total"), get("vllm:prompt_tokens_total"),
        get("vllm:spec_decode_num_drafts_total"), get("vllm:spec_decode_num_draft_tokens_total"),
        get("vllm:spec_decode_num_accepted_tokens_total"), per_pos)


@dataclass(frozen=True)
class Window:
    """What happened between two snapshots: the live series' one point."""

    seconds: float
    running: float | None
    waiting: float | None
    kv_usage: float | None
    tokens_per_s: float | None                 # generated tokens per second, all requests
    acceptance_rate: float | None              # accepted ÷ drafted in the window
    mean_drafted: float | None                 # draft tokens per draft (the live k, under a schedule)
    accepted_per_pos: dict[int, float] = field(default_factory=dict)   # acceptance at each draft position


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def window(old: Snapshot, new: Snapshot) -> Window:
    secs = new.t - old.t
    gen = _delta(old.generation_tokens, new.generation_tokens)
    drafts = _delta(old.drafts, new.drafts)
    drafted = _delta(old.draft_tokens, new.draft_tokens)
    acc = _delta(old.accepted_tokens, new.accepted_tokens)
    per_pos = {}
    if drafts:
        per_pos = {p: (v - old.accepted_per_pos.get(p, 0.0)) / drafts for p, v in sorted(new.accepted_per_pos.items())}
    return Window(secs, new.running, new.waiting, new.kv_usage,
                  gen / secs if gen is not None and secs > 0 else None,
                  acc / drafted if drafted and acc is not None else None,
                  drafted / drafts if drafts else None, per_pos)


def finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


# histograms of vLLM's engine, each as NAME_sum and NAME_count: engine steps (tokens scheduled per step) and
# each request's time queued, in prefill and in decode
_STEPS = "vllm:iteration_tokens_total"
_PHASES = {"queue": "vllm:request_queue_time_seconds", "prefill": "vllm:request_prefill_time_seconds",
           "decode": "vllm:request_decode_time_seconds"}


def engine_time(before: str, after: str, model: str | None = None) -> dict:
    """Where vLLM's time went between two reads of /metrics: engine steps, prompt and generated tokens
    per step, drafts verified per step, each request's mean seconds queued, in prefill and in decode,
    and the share of prompt tokens its prefix cache served (absent metrics are None)."""
    a, b = parse_prometheus(before), parse_prometheus(after)

    def d(name: str) -> float | None:
        return _delta(total(a, name, model) or 0.0, total(b, name, model))
    steps, tokens = d(_STEPS + "_count"), d(_STEPS + "_sum")
    drafts = d("vllm:spec_decode_num_draft_tokens_total")

    def per_step(x):
        return x / steps if steps and x is not None else None
    # its step histogram counts prompt tokens and generated ones, not the drafts a step verified
    out = {"steps": steps, "prompt_and_generated_per_step": per_step(tokens), "drafts_per_step": per_step(drafts)}
    for phase, name in _PHASES.items():
        n, secs = d(name + "_count"), d(name + "_sum")
        out[f"{phase}_s_per_request"] = secs / n if n and secs is not None else None
    # prompt tokens served from its prefix cache (on by default in vLLM's V1 engine; ours has none)
    queries, hits = d("vllm:prefix_cache_queries_total"), d("vllm:prefix_cache_hits_total")
    out["prefix_cache_hit_rate"] = hits / queries if queries and hits is not None else None
    return out
