"""One user's generation, and the records a step leaves behind.

Ownership (why this module exists): a `Request` is everything mutable that belongs to one user's run —
its prompts, live knobs, rows, random streams, policy state, outputs and totals. The engine that batches
many requests owns the KV caches and the batch; a request owns the rest. Other threads (a slider, a
Stop button) touch only `Request.knobs`, which is thread-safe; everything else is read and written by the
single thread that steps the engine.

Batch size counts *slots* per request: raising it opens slots that admit new rows (prompts reused in
order); lowering it closes slots, retiring the request's newest rows. Without `refill` a slot whose row
finished stays spent; with it, a new row takes its place.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field, replace

import torch

from specviz.engine.policies import FixedPolicy, PlanContext, Policy, StepPlan
from specviz.lessons import DEFAULT_LANG, Key, Said, template
from specviz.limits import ENGINE_MAX_NEW, MAX_DEPTH, Limits

MAX_BATCH = Limits().max_rows_per_user
_request_ids = itertools.count(1)


class EngineError(ValueError):
    """A value reached the engine unchecked: a bug in the caller, not a student's mistake. Users' values are
    checked at the door (`specviz.serve.door`, `specviz.limits`) with sentences a student understands; the
    engine only asserts the invariants it needs to run at all."""


def _whole_in(value, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise EngineError(f"{what} must be an int in {lo}..{hi}, got {value!r}")
    return value


@dataclass(frozen=True)
class KnobState:
    depth: int
    batch_size: int
    policy: Policy
    version: int


def check_depth(depth) -> int:
    """The engine's invariant: a whole depth the draft loop can run (user limits: `Limits.max_depth`)."""
    return _whole_in(depth, "depth", 0, MAX_DEPTH)


def check_batch(batch, limit: int = MAX_BATCH) -> int:
    return _whole_in(batch, "batch size", 1, limit)


class Knobs:
    """Depth, batch size and policy, safe to change from another thread while the engine runs."""

    def __init__(self, depth: int = 4, batch_size: int = 1, policy: Policy | None = None,
                 max_batch: int = MAX_BATCH):
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._state = KnobState(check_depth(depth), check_batch(batch_size, max_batch),
                                policy or FixedPolicy(), 0)
        self.stop = threading.Event()

    def set(self, depth: int | None = None, batch_size: int | None = None, policy: Policy | None = None) -> None:
        d = None if depth is None else check_depth(depth)
        b = None if batch_size is None else check_batch(batch_size, self.max_batch)
        with self._lock:
            s = self._state
            self._state = KnobState(s.depth if d is None else d, s.batch_size if b is None else b,
                                    s.policy if policy is None else policy, s.version + 1)

    def snapshot(self) -> KnobState:
        with self._lock:
            return self._state


@dataclass
class RowStep:
    """What one row did in one step."""

    row: int                # row id within its request (stable over the run; admission order)
    drafted: list[int]      # draft token ids proposed this step
    accepted: int           # how many of them the target kept
    emitted: list[int]      # accepted drafts + the target's own token (cut at EOS / the token limit)
    last_kind: str          # "plain" (nothing drafted), "correction" (after a rejection) or "bonus"
    done: bool = False
    finish: str = ""        # "eos" | "length" | "" (still running)
    proposed: int = 0       # drafts the drafter made for this row; `drafted` are those verified


@dataclass
class StepEvent:
    """One record per step and request; the UI and the CLI draw everything from these.

    `rows` are this request's rows; the timings, `batch_size`, `tokens_per_pass` and the FLOPs/bytes are
    those of the shared passes (what the hardware did); `draft_part` and `target_part` are this request's
    part of their FLOPs."""

    step: int                       # this request's step count
    batch_size: int                 # rows in this step, all requests together
    depth: int                      # this request's policy depth this step
    policy: str
    rows: list[RowStep]
    draft_s: float                  # time inside draft forwards
    verify_s: float                 # time inside the target's verify forward
    overhead_s: float               # everything else in the step (masks, sampling, bookkeeping)
    wall_s: float                   # the whole step
    prefill_s: float                # prefill of this request's rows admitted before this step
    tokens_per_pass: int            # slots the verify pass processed: rows × (k + 1)
    context: int                    # target cache length (slots) the verify pass attended over
    draft_flops: float
    draft_bytes: float
    target_flops: float
    target_bytes: float
    plain_flops: float              # what plain decoding would spend on this request's emitted tokens
    changes: list[str] = field(default_factory=list)   # knob changes applied at this step
    retired: list[int] = field(default_factory=list)   # rows retired by a lower batch size
    users: int = 1                  # distinct requests in this step
    shared_emitted: int = 0         # tokens all rows of the step emitted
    share: float = 1.0              # this request's rows ÷ rows in the step
    path: str = ""                  # the forward path that ran the passes (specviz.fastpath labels)
    slots_drafted: int = 0          # draft slots proposed this step, all rows of the batch together
    slots_verified: int = 0         # of which the verify pass checked (fewer under adaptive verification)
    budget: int | None = None       # adaptive verification's B* this step (None: no row under it)
    real_tokens: int = 0            # tokens the verify pass carried: rows + verified drafts
    padded_tokens: int = 0          # tokens it computed: the path's padded shape (≥ real_tokens)

    @property
    def emitted(self) -> int:
        return sum(len(r.emitted) for r in self.rows)

    @property
    def drafted(self) -> int:
        return sum(len(r.drafted) for r in self.rows)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rows)

    @property
    def reached(self) -> int:
        """Verified drafts the target came to: those kept, and each row's first rejection (α's denominator)."""
        return sum(min(len(r.drafted), r.accepted + 1) for r in self.rows)

    @property
    def width(self) -> int:
        """Verify slots this request's rows are charged. Alone, the pass's width. Beside others, 1 + the
        most drafts one of its rows had verified: a wider request widens the pass, and that padding is
        charged to no one (the compact forward does not compute it; the stock modules do), so in a shared
        step the requests' parts may add up to less than the pass."""
        pass_width = self.tokens_per_pass // self.batch_size if self.batch_size else 1
        if self.users <= 1:
            return pass_width
        return min(pass_width, 1 + max((len(r.drafted) for r in self.rows), default=0))

    @property
    def target_part(self) -> float:
        """This request's FLOPs of the verify pass: its rows at its width, at the pass's cost a slot."""
        per_slot = self.target_flops / self.tokens_per_pass if self.tokens_per_pass else 0.0
        return per_slot * len(self.rows) * self.width

    @property
    def draft_part(self) -> float:
        """This request's FLOPs of the draft passes: by the drafts its rows proposed (a row that drafted
        nothing cost the drafter nothing), by rows where the step's proposals were not recorded."""
        if self.slots_drafted:
            return self.draft_flops * sum(r.proposed for r in self.rows) / self.slots_drafted
        return self.draft_flops * self.share


@dataclass
class RunTotals:
    steps: int = 0
    tokens: int = 0
    row_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    wall_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    spent_flops: float = 0.0
    plain_flops: float = 0.0
    shared_batch_max: int = 0       # the most rows in any step this request took part in
    users_max: int = 0              # the most distinct requests in such a step
    proposed: int = 0               # drafts this request's rows proposed (drafted = those verified)
    reached: int = 0                # verified drafts the target came to: those kept, and each first rejection

    def copy(self) -> "RunTotals":
        """A snapshot to hand to another thread (these totals keep changing in the engine's thread)."""
        return replace(self)

    def add(self, ev: StepEvent) -> None:
        self.steps += 1
        self.tokens += ev.emitted
        self.row_steps += len(ev.rows)
        self.drafted += ev.drafted
        self.accepted += ev.accepted
        self.wall_s += ev.wall_s
        self.prefill_s += ev.prefill_s
        self.draft_s += ev.draft_s
        self.verify_s += ev.verify_s
        self.spent_flops += ev.draft_part + ev.target_part
        self.plain_flops += ev.plain_flops
        self.shared_batch_max = max(self.shared_batch_max, ev.batch_size)
        self.users_max = max(self.users_max, ev.users)
        self.proposed += sum(r.proposed for r in ev.rows)
        self.reached += ev.reached

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: emitted tokens ÷ step time (prefill excluded, reported apart)."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def per_step_ms(self) -> dict[str, float | None]:
        """Milliseconds a decode step, and its parts: draft passes, the verify pass (with its reads and
        writes of the cache), and the rest (acceptance, bookkeeping: on a GPU, host work the step waits for)."""
        if not self.steps:
            return dict.fromkeys(("step_ms", "draft_ms", "verify_ms", "other_ms"))
        ms = 1e3 / self.steps
        return {"step_ms": self.wall_s * ms, "draft_ms": self.draft_s * ms, "verify_ms": self.verify_s * ms,
                "other_ms": max(0.0, self.wall_s - self.draft_s - self.verify_s) * ms}

    @property
    def acceptance_rate(self) -> float | None:
        """Kept ÷ verified drafts (vLLM's draft acceptance rate): a descriptive figure, not Leviathan's α."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def alpha(self) -> float | None:
        """Leviathan's α as measured: kept ÷ the drafts the target reached (its maximum-likelihood estimate
        under the i.i.d. model). A draft after a row's first rejection is never judged; counting it, as
        `acceptance_rate` does, reads α low at depth > 1 (0.30 where the dial's A was 0.5)."""
        return self.accepted / self.reached if self.reached else None

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a row gains per target pass (accepted drafts + 1)."""
        return self.tokens / self.row_steps if self.row_steps else 0.0

    @property
    def flops_ratio(self) -> float:
        return self.spent_flops / self.plain_flops if self.plain_flops else 0.0

    @property
    def overhead_share(self) -> float:
        """Share of step time spent outside model forwards."""
        return 1 - (self.draft_s + self.verify_s) / self.wall_s if self.wall_s else 0.0

    def as_dict(self) -> dict:
        return {"steps": self.steps, "tokens": self.tokens, "tokens_per_s": self.tokens_per_s,
                "acceptance_rate": self.acceptance_rate, "alpha": self.alpha, "mean_accepted_length": self.mean_accepted_length,
                "flops_ratio": self.flops_ratio, "decode_s": self.wall_s, "prefill_s": self.prefill_s,
                "draft_s": self.draft_s, "verify_s": self.verify_s, "overhead_share": self.overhead_share,
                "shared_batch_max": self.shared_batch_max, "users_max": self.users_max,
                "proposed": self.proposed}


@dataclass(frozen=True)
class RowTag:
    """Who a row is, for drafters that need it: its request's seed, its id there, its prompt's length, and
    (a synthetic draft) the target's own continuation of its prompt."""

    seed: int
    row: int
    prompt_len: int
    reference: tuple[int, ...] | None = None


@dataclass
class Row:
    id: int                          # row id within its request
    owner: "Request"
    prompt: list[int]
    gen: torch.Generator | None      # this row's own random stream (sampling only)
    out: list[int] = field(default_factory=list)
    done: bool = False
    finish: str = ""                 # "eos" | "length" | "retired" | "stopped" | "error"

    @property
    def seq(self) -> list[int]:
        return self.prompt + self.out

    @property
    def tag(self) -> RowTag:
        ref = self.owner.references.get(tuple(self.prompt)) if self.owner.references else None
        return RowTag(self.owner.seed, self.id, len(self.prompt), ref)


class Request:
    """One user's generation (see the module docstring for who may touch what)."""

    def __init__(self, prompts: list[list[int]], knobs: Knobs, max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0, refill: bool = False, device=None,
                 references: dict[tuple[int, ...], tuple[int, ...]] | None = None):
        """`references`: prompt → the target's own greedy continuation of it (a synthetic draft's)."""
        # invariants only: the door (specviz.serve.door) has checked the user's values against Limits
        if not prompts or any(len(p) == 0 for p in prompts):
            raise EngineError("every prompt needs at least one token")
        self.max_new = _whole_in(max_new_tokens, "max new tokens", 1, ENGINE_MAX_NEW)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not 0.0 <= temperature < float("inf"):
            raise EngineError(f"temperature must be a finite number ≥ 0, got {temperature!r}")
        self.temperature = float(temperature)
        self.id = next(_request_ids)
        self.prompts = [list(p) for p in prompts]
        self.knobs, self.seed, self.refill, self.device = knobs, int(seed), refill, device
        self.references = dict(references or {})
        self.rows: list[Row] = []            # running rows, in their batch order
        self.finished: dict[int, Row] = {}
        self.totals = RunTotals()
        self.steps = 0
        self.spent = 0                       # slots whose row finished (without refill)
        self.next_row = 0
        self.state: KnobState = knobs.snapshot()
        self._last_state: KnobState | None = None
        self.done = False
        self.error: str | None = None        # why the engine ended this request early, for a human

    # --- knobs, read once per step --------------------------------------------------------------
    def begin_step(self) -> list[str]:
        """Take this step's knob snapshot; returns the changes since the last step, described."""
        self._last_state, self.state = self.state if self.steps else None, self.knobs.snapshot()
        return _describe_changes(self._last_state, self.state)

    def plan(self, shared_batch: int) -> StepPlan:
        """This step's depth for this request's rows, from its own policy at the *shared* batch size."""
        return self.state.policy.plan(PlanContext(shared_batch, self.state.depth))

    # --- rows ------------------------------------------------------------------------------------
    def wanted(self) -> int:
        """Rows this request would add now: open slots minus running and spent ones."""
        if self.stopped or self.done:
            return 0
        return max(0, self.state.batch_size - len(self.rows) - self.spent)

    def new_rows(self, n: int) -> list[Row]:
        rows = []
        for _ in range(n):
            i = self.next_row
            gen = None
            if self.temperature > 0:
                # one stream per row, fixed by (seed, row): independent of whoever shares the batch
                gen = torch.Generator(device=self.device or "cpu").manual_seed(self.seed * 1_000_003 + i)
            rows.append(Row(i, self, list(self.prompt_of(i)), gen))
            self.next_row += 1
        self.rows += rows
        return rows

    def prompt_of(self, row_id: int) -> list[int]:
        return self.prompts[row_id % len(self.prompts)]

    def close_slots(self) -> list[int]:
        """Close slots above the batch size: spent slots first, then the newest running rows.
        Returns the ids of rows retired (they leave the batch at this step)."""
        extra = len(self.rows) + self.spent - self.state.batch_size
        if extra <= 0:
            return []
        spent = min(self.spent, extra)
        self.spent -= spent
        extra -= spent
        retired = self.rows[len(self.rows) - extra:] if extra else []
        for r in retired:
            r.done, r.finish = True, "retired"
        return [r.id for r in retired]

    def end_rows(self, finish: str) -> None:
        for r in self.rows:
            if not r.done:
                r.done, r.finish = True, finish

    def settle(self) -> None:
        """Move finished rows out of `rows`; count spent slots."""
        for r in self.rows:
            if r.done:
                self.finished[r.id] = r
                if r.finish in ("eos", "length") and not self.refill:
                    self.spent += 1
        self.rows = [r for r in self.rows if not r.done]

    def outputs(self) -> dict[int, list[int]]:
        """Generated ids per row id (prompt excluded, EOS included if produced)."""
        rows = {**self.finished, **{r.id: r for r in self.rows}}
        return {i: rows[i].out for i in sorted(rows)}

    @property
    def stopped(self) -> bool:
        return self.knobs.stop.is_set()


def _describe_changes(old: KnobState | None, new: KnobState) -> list[str]:
    # Saids: "depth 4→6" in logs and the CLI, the chart's marker in its reader's language
    if old is None or old.version == new.version:
        return []
    ch = []
    if old.depth != new.depth:
        ch.append(Said("playground.chart.change_depth", old=old.depth, new=new.depth))
    if old.batch_size != new.batch_size:
        ch.append(Said("playground.chart.change_batch", old=old.batch_size, new=new.batch_size))
    if old.policy is not new.policy:
        ch.append(Said("playground.chart.change_policy", old=_policy_word(old.policy.name),
                       new=_policy_word(new.policy.name)))
    return ch


def _policy_word(name: str):
    """The policy's name as pages show it ([policy_label]); one without a label by its name."""
    key = f"policy_label.{name}"
    return Key(key) if template(DEFAULT_LANG, key) != key else name
