"""The batched speculative decoding loop: draft, verify, accept/reject, KV bookkeeping, step events.

One step, for B rows at once:
  1. the policy picks a depth k (a row may get less: near its token limit, or when the confidence
     policy stops its drafting early);
  2. the drafter proposes up to k tokens per row;
  3. the target verifies [last token, d_1..d_k] for every row in ONE forward pass;
  4. each row keeps its longest agreeing prefix (greedy) or applies the Leviathan/Chen rule
     (sampling), then appends the target's own next token — the correction after a rejection, or the
     bonus token when every draft was kept;
  5. both caches turn the rejected slots into holes (see `specviz.kvcache`), and rows that finished
     leave the batch.

k = 0 is plain decoding through the same code: the verify pass is then a one-token decode step.

Live knobs: `Knobs` is read once at the top of every step, so a depth, batch size or policy set from
another thread (a UI slider) applies at the next step. Batch size counts *slots*: raising B opens new
slots that admit new rows (prompts reused in order); lowering B closes slots, retiring the newest
rows. Without `refill`, a slot whose row finished stays spent; with it, a new row takes its place.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from specviz.kvcache import RaggedCache, prefill, timed_forward
from specviz.policies import MAX_DEPTH, FixedPolicy, PlanContext, StepObservation
from specviz.roofline import ModelSpec, pass_cost, plain_token_flops
from specviz.sampling import greedy_accept, probabilities, speculative_accept

MAX_BATCH = 64


class EngineError(ValueError):
    """Bad generation arguments; the message is meant for a human."""


@dataclass(frozen=True)
class KnobState:
    depth: int
    batch_size: int
    policy: object
    version: int


class Knobs:
    """Depth, batch size and policy, safe to change from another thread while the engine runs."""

    def __init__(self, depth: int = 4, batch_size: int = 1, policy=None):
        check_depth(depth)
        check_batch(batch_size)
        self._lock = threading.Lock()
        self._state = KnobState(depth, batch_size, policy or FixedPolicy(), 0)
        self.stop = threading.Event()

    def set(self, depth: int | None = None, batch_size: int | None = None, policy=None) -> None:
        if depth is not None:
            check_depth(depth)
        if batch_size is not None:
            check_batch(batch_size)
        with self._lock:
            s = self._state
            self._state = KnobState(s.depth if depth is None else int(depth),
                                    s.batch_size if batch_size is None else int(batch_size),
                                    s.policy if policy is None else policy, s.version + 1)

    def snapshot(self) -> KnobState:
        with self._lock:
            return self._state


def check_depth(depth: int) -> None:
    if not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH:
        raise EngineError(f"depth must be a whole number from 0 to {MAX_DEPTH}, got {depth!r}")


def check_batch(batch: int) -> None:
    if not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise EngineError(f"batch size must be a whole number from 1 to {MAX_BATCH}, got {batch!r}")


@dataclass
class RowStep:
    """What one row did in one step."""

    row: int                # row id (stable over the run; admission order)
    drafted: list[int]      # draft token ids proposed this step
    accepted: int           # how many of them the target kept
    emitted: list[int]      # accepted drafts + the target's own token (cut at EOS / the token limit)
    last_kind: str          # "plain" (nothing drafted), "correction" (after a rejection) or "bonus"
    done: bool = False
    finish: str = ""        # "eos" | "length" | "" (still running)


@dataclass
class StepEvent:
    """One record per step; the UI and the CLI draw everything from these."""

    step: int
    batch_size: int                 # rows in this step
    depth: int                      # the policy's depth this step
    policy: str
    rows: list[RowStep]
    draft_s: float                  # time inside draft forwards
    verify_s: float                 # time inside the target's verify forward
    overhead_s: float               # everything else in the step (masks, sampling, bookkeeping)
    wall_s: float                   # the whole step
    prefill_s: float                # prefill of rows admitted before this step (not in wall_s)
    tokens_per_pass: int            # slots the verify pass processed: rows × (k + 1)
    context: int                    # target cache length (slots) the verify pass attended over
    draft_flops: float
    draft_bytes: float
    target_flops: float
    target_bytes: float
    plain_flops: float              # what plain decoding would spend on the emitted tokens
    changes: list[str] = field(default_factory=list)   # knob changes applied at this step
    retired: list[int] = field(default_factory=list)   # rows retired by a lower batch size

    @property
    def emitted(self) -> int:
        return sum(len(r.emitted) for r in self.rows)

    @property
    def drafted(self) -> int:
        return sum(len(r.drafted) for r in self.rows)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rows)


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
        self.spent_flops += ev.draft_flops + ev.target_flops
        self.plain_flops += ev.plain_flops

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: emitted tokens ÷ step time (prefill excluded, reported apart)."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

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
                "acceptance_rate": self.acceptance_rate, "mean_accepted_length": self.mean_accepted_length,
                "flops_ratio": self.flops_ratio, "decode_s": self.wall_s, "prefill_s": self.prefill_s,
                "draft_s": self.draft_s, "verify_s": self.verify_s, "overhead_share": self.overhead_share}


@dataclass
class Row:
    id: int
    prompt: list[int]
    out: list[int] = field(default_factory=list)
    done: bool = False
    finish: str = ""


class SpeculativeEngine:
    """Runs a target model and a drafter over a live batch. One engine serves one run at a time."""

    def __init__(self, target, target_spec: ModelSpec, drafter, eos_ids: list[int], vocab: int,
                 device, dtype):
        self.target, self.spec, self.drafter = target, target_spec, drafter
        self.eos = set(int(e) for e in eos_ids)
        self.vocab, self.device, self.dtype = vocab, device, dtype
        self.rows: list[Row] = []
        self.finished: dict[int, Row] = {}
        self.totals = RunTotals()

    # --- public -------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], knobs: Knobs, max_new_tokens: int,
                 temperature: float = 0.0, seed: int = 0, refill: bool = False) -> Iterator[StepEvent]:
        """Yield one StepEvent per step until every row is done (or `knobs.stop` is set)."""
        self._check_args(prompts, max_new_tokens, temperature)
        self.prompts, self.max_new, self.temperature = prompts, max_new_tokens, temperature
        self.refill = refill
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.cache = RaggedCache(0, self.device, self.dtype)
        self.rows, self.finished, self.totals = [], {}, RunTotals()
        with torch.inference_mode():
            self.drafter.retire([])
        self._next_id, self._spent = 0, 0
        last = None
        step = 0
        while not knobs.stop.is_set():
            ks = knobs.snapshot()
            changes = _describe_changes(last, ks)
            last = ks
            # inference mode is thread-local: the UI runs each step in whichever worker thread
            # pulls the generator, so it is entered here, per step, not once at load time
            with torch.inference_mode():
                retired = self._fit_batch(ks.batch_size)
                prefill_s = self._admit(ks.batch_size)
                if not self.rows:
                    break
                ev = self._step(step, ks, prefill_s, changes, retired)
            self.totals.add(ev)
            ks.policy.observe(StepObservation(ev.batch_size, ev.depth, ev.drafted, ev.accepted, ev.draft_s,
                                              self._last_draft_passes, ev.verify_s, ev.tokens_per_pass))
            step += 1
            yield ev
        for r in self.rows:          # stopped early: what was produced so far still counts
            self.finished[r.id] = r

    def outputs(self) -> dict[int, list[int]]:
        """Generated ids per row id (prompt excluded, EOS included if produced)."""
        rows = {**self.finished, **{r.id: r for r in self.rows}}
        return {i: rows[i].out for i in sorted(rows)}

    def prompt_of(self, row_id: int) -> list[int]:
        return self.prompts[row_id % len(self.prompts)]

    # --- batch membership ---------------------------------------------------------------------
    def _check_args(self, prompts, max_new_tokens, temperature) -> None:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise EngineError("every prompt needs at least one token")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise EngineError(f"max new tokens must be a whole number ≥ 1, got {max_new_tokens!r}")
        if not 0.0 <= temperature <= 10.0:
            raise EngineError(f"temperature must be between 0 and 10, got {temperature}")

    def _fit_batch(self, batch: int) -> list[int]:
        """Close slots above `batch`: spent slots first, then the newest running rows."""
        self._drop_done()
        extra = len(self.rows) + self._spent - batch
        if extra <= 0:
            return []
        spent = min(self._spent, extra)
        self._spent -= spent
        extra -= spent
        retired = [r.id for r in self.rows[len(self.rows) - extra:]] if extra else []
        for r in self.rows[len(self.rows) - extra:] if extra else []:
            r.done, r.finish = True, "retired"
        self._drop_done()
        return retired

    def _drop_done(self) -> None:
        keep = [i for i, r in enumerate(self.rows) if not r.done]
        if len(keep) == len(self.rows):
            return
        for r in self.rows:
            if r.done:
                self.finished[r.id] = r
                if r.finish in ("eos", "length"):
                    self._spent += 0 if self.refill else 1
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.cache.select(idx)
        self.drafter.retire(keep)
        self.rows = [self.rows[i] for i in keep]

    def _admit(self, batch: int) -> float:
        """Open slots up to `batch` with new rows; prefill them in both models. Returns seconds."""
        n = batch - len(self.rows) - self._spent
        if n <= 0:
            return 0.0
        new = [Row(self._next_id + i, list(self.prompt_of(self._next_id + i))) for i in range(n)]
        self._next_id += n
        cache, secs, _ = prefill(self.target, [r.prompt for r in new], self.device, self.dtype)
        self.cache.merge(cache)
        d_secs, _ = self.drafter.admit([r.prompt for r in new])
        self.rows += new
        return secs + d_secs

    # --- one step -----------------------------------------------------------------------------
    def _step(self, step: int, ks: KnobState, prefill_s: float, changes, retired) -> StepEvent:
        t0 = time.perf_counter()
        B = len(self.rows)
        plan = ks.policy.plan(PlanContext(B, ks.depth))
        seqs = [r.prompt + r.out for r in self.rows]
        # a row never drafts past its token limit: the step emits at most k + 1 tokens
        depths = [max(0, min(plan.depth, self.max_new - len(r.out) - 1)) for r in self.rows]
        prop = self.drafter.propose(seqs, depths, plan.confidence, self.temperature, self.gen)
        self._last_draft_passes = prop.passes
        K = prop.tokens.shape[1]

        # verify: [last token, d_1..d_K] per row; slots past a row's drafts are holes   # [B, K+1]
        last = torch.tensor([s[-1] for s in seqs], dtype=torch.long, device=self.device)
        vin = torch.cat([last[:, None], prop.tokens], dim=1)
        j = torch.arange(K + 1, device=self.device)[None, :]
        vvalid = j <= prop.lengths[:, None]
        L0 = self.cache.length
        logits, verify_s = timed_forward(self.cache, self.target, vin, vvalid)
        logits = logits[..., : self.vocab]
        if self.temperature > 0:
            p = probabilities(logits, self.temperature)
            n, nxt = speculative_accept(p, prop.q, prop.tokens, prop.lengths, self.gen)
        else:
            n, nxt = greedy_accept(logits.argmax(dim=-1), prop.tokens, prop.lengths)

        # rejected drafts become holes in both caches
        rej = (j >= 1) & (j <= prop.lengths[:, None]) & (j > n[:, None])
        r_idx, j_idx = rej.nonzero(as_tuple=True)
        self.cache.invalidate(r_idx, L0 + j_idx)
        self.drafter.commit(n, prop.lengths)
        self.cache.compact()

        rows_out, plain = self._apply(prop, n, nxt, seqs)
        wall = time.perf_counter() - t0
        verify_cost = pass_cost(self.spec, B, K + 1, L0)
        return StepEvent(
            step=step, batch_size=B, depth=plan.depth, policy=getattr(ks.policy, "name", "?"),
            rows=rows_out, draft_s=prop.seconds, verify_s=verify_s,
            overhead_s=max(0.0, wall - prop.seconds - verify_s), wall_s=wall, prefill_s=prefill_s,
            tokens_per_pass=B * (K + 1), context=L0,
            draft_flops=prop.cost.flops, draft_bytes=prop.cost.bytes,
            target_flops=verify_cost.flops, target_bytes=verify_cost.bytes, plain_flops=plain,
            changes=changes, retired=retired)

    def _apply(self, prop, n, nxt, seqs):
        """Append each row's accepted drafts and the target's token; mark rows that finished."""
        out: list[RowStep] = []
        plain = 0.0
        drafts, lengths, n_l, nxt_l = prop.tokens.tolist(), prop.lengths.tolist(), n.tolist(), nxt.tolist()
        for i, r in enumerate(self.rows):
            k, a = lengths[i], n_l[i]
            emitted = drafts[i][:a] + [nxt_l[i]]
            emitted = emitted[: self.max_new - len(r.out)]
            for pos, t in enumerate(emitted):
                if t in self.eos:
                    emitted = emitted[: pos + 1]
                    r.done, r.finish = True, "eos"
                    break
            r.out += emitted
            if not r.done and len(r.out) >= self.max_new:
                r.done, r.finish = True, "length"
            kind = "plain" if k == 0 else ("bonus" if a == k else "correction")
            out.append(RowStep(r.id, drafts[i][:k], a, emitted, kind, r.done, r.finish))
            # plain decoding would run one pass per emitted token, at growing context (linear in it)
            ctx = len(seqs[i]) - 1 + (len(emitted) - 1) / 2
            plain += len(emitted) * plain_token_flops(self.spec, ctx)
        return out, plain


def _describe_changes(old: KnobState | None, new: KnobState) -> list[str]:
    if old is None or old.version == new.version:
        return []
    ch = []
    if old.depth != new.depth:
        ch.append(f"depth {old.depth}→{new.depth}")
    if old.batch_size != new.batch_size:
        ch.append(f"batch {old.batch_size}→{new.batch_size}")
    if old.policy is not new.policy:
        ch.append(f"policy {getattr(old.policy, 'name', '?')}→{getattr(new.policy, 'name', '?')}")
    return ch
