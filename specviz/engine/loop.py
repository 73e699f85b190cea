"""The batched speculative decoding loop: draft, verify, accept/reject, KV bookkeeping, step events.

One step, for every row of every request in the batch at once:
  1. each request's policy picks its depth at the *shared* batch size (a row may get less: near its
     token limit, or when the confidence policy stops its drafting early);
  2. the drafter proposes up to k tokens per row;
  3. the target verifies [last token, d_1..d_k] for every row in ONE forward pass;
  4. each row keeps its longest agreeing prefix (greedy) or applies the Leviathan/Chen rule
     (sampling, with the row's own random stream), then appends the target's own next token — the
     correction after a rejection, or the bonus token when every draft was kept;
  5. both caches turn the rejected slots into holes (see `specviz.engine.kvcache`), and rows that finished
     leave the batch.

k = 0 is plain decoding through the same code: the verify pass is then a one-token decode step.

Ownership: the engine owns the batch — `rows`, the target's KV cache `target_kv` and the drafter with
its `draft_kv` — and is driven by exactly one thread (`generate` for one request, or the scheduler's
loop for many). Requests (`specviz.engine.request`) own everything per user. Knobs are read once at the top of
every step, so a slider moved from another thread applies at the next step.
"""
from __future__ import annotations

import time
from typing import Iterator

import torch

from specviz.engine.budget import Budget, StepContext
from specviz.engine.drafters import Drafter, Proposal
from specviz.engine.kvcache import RaggedCache, prefill, timed_forward, to_device
from specviz.engine.policies import StepObservation, StepPlan
from specviz.engine.request import Knobs, Request, Row, RowStep, RunTotals, StepEvent
from specviz.engine.sampling import greedy_accept, greedy_ids, probabilities, speculative_accept
from specviz.hardware.roofline import ModelSpec, pass_cost, plain_token_flops


class SpeculativeEngine:
    """Runs a target model and a drafter over one live batch shared by any number of requests."""

    def __init__(self, target, target_spec: ModelSpec, drafter: Drafter, eos_ids: list[int], vocab: int,
                 device, dtype, cache_factory=None, fast_label: str = "eager (transformers)",
                 budget: Budget | None = None, learnt=None):
        """`eos_ids`: tokens that end a row (empty: every row runs to its token limit, as benchmarks
        comparing engines token for token need). `budget`: adaptive verification's, when its tables
        should outlive this engine (a benchmark's arm, a warmed-up lesson); else a fresh one, starting
        from `learnt` (the pair's shared acceptance tables, `specviz.engine.learnt`)."""
        self.target, self.spec, self.drafter = target, target_spec, drafter
        # batch → KV cache; None = RaggedCache over the stock modules (the fast path's is a StaticCache)
        self.cache_factory = cache_factory
        self.fast_label = fast_label           # which forward path the passes run (shown with the timings)
        self.eos = set(int(e) for e in eos_ids)
        self.vocab, self.device, self.dtype = vocab, device, dtype
        self.target_kv = self._new_cache()
        self.rows: list[Row] = []              # batch order = row order in both caches
        self.requests: list[Request] = []      # in admission order (first come, first served)
        self.last: Request | None = None       # the request of the latest `generate` (CLI, tests)
        self.pressure: dict[int, int] = {}     # request id → tokens it put into the step being run
        self.admitting: set[int] = set()       # request ids whose rows were being prefilled
        self._readmit: list[Row] = []          # rows whose caches were dropped (after a fault)
        # adaptive verification's cost tables and calibration; the stock modules multiply padding too
        self.budget = budget if budget is not None else Budget(padded=cache_factory is None, learnt=learnt)
        # every step's shared figures, summed (benchmarks read them after the run: `frontier`)
        self.steps_run = self.slots_drafted = self.slots_verified = 0
        # … and where their time went, seconds: prefill passes, draft passes, verify passes, the rest of
        # each step (acceptance, caches, bookkeeping) — bench-vllm shows it beside vLLM's engine steps
        self.spent = dict.fromkeys(("prefill", "draft", "verify", "other"), 0.0)
        self.pass_tokens = 0                   # tokens the verify passes carried (rows + verified drafts)

    # --- one request, start to finish (CLI, benchmarks, tests) ---------------------------------------
    def generate(self, prompts: list[list[int]], knobs: Knobs, max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0, refill: bool = False, references: dict | None = None) -> Iterator[StepEvent]:
        """Yield one StepEvent per step until every row is done (or `knobs.stop` is set). `references`:
        prompt → the target's own continuation, for a synthetic draft (`specviz.engine.synthetic`)."""
        req = Request(prompts, knobs, max_new_tokens, temperature, seed, refill, self.device, references)
        self.last = req
        self.add(req)
        try:
            while not req.done:
                for owner, ev in self.step():
                    if owner is req:
                        yield ev
        finally:
            self.remove(req)

    def outputs(self) -> dict[int, list[int]]:
        return self.last.outputs() if self.last else {}

    @property
    def totals(self) -> RunTotals:
        return self.last.totals if self.last else RunTotals()

    def prompt_of(self, row_id: int) -> list[int]:
        return self.last.prompt_of(row_id)

    # --- requests joining and leaving ----------------------------------------------------------------
    def add(self, req: Request) -> None:
        if req.device is None:      # a sampled row's generator lives where the logits do (CUDA's not the CPU's)
            req.device = self.device
        self.requests.append(req)

    def remove(self, req: Request, finish: str = "stopped") -> None:
        """Take a request out now (its rows leave both caches); safe to call twice."""
        if req in self.requests:
            req.end_rows(finish)
            with torch.inference_mode():
                self._drop_done()
            self.requests.remove(req)
        req.done = True

    def step(self, room: int | None = None, queued: int = 0) -> list[tuple[Request, StepEvent]]:
        """One step for every request with rows. `room` caps the rows in the batch (admission waits
        while it is full); `queued`: requests waiting outside the engine for room (the scheduler's).
        Returns (request, its event) for each request that took part."""
        started = time.perf_counter()         # the step's wall counts all of it but the admission (prefill)
        changes, stopping = {}, set()
        for req in self.requests:
            changes[req.id] = req.begin_step()
            if req.stopped:             # read once: a Stop that lands mid-step counts at the next one
                req.end_rows("stopped")
                stopping.add(req.id)
        # inference mode is thread-local: entered per step, in whichever thread runs the step
        with torch.inference_mode():
            self._drop_done()
            retired = {req.id: req.close_slots() for req in self.requests}
            self._drop_done()
            t_admit = time.perf_counter()
            prefill_s = self._admit(room)
            started += time.perf_counter() - t_admit
            out = self._step(prefill_s, changes, retired, queued, started) if self.rows else []
        for req in list(self.requests):
            if not req.rows and (req.id in stopping or req.wanted() == 0):
                req.done = True
                self.requests.remove(req)
        return out

    def _drop_done(self) -> None:
        """Rows that finished (or were retired) leave the batch and both caches. The rows at the end of
        the batch move into the places they leave (`fill_order`), so the caches copy one row per row
        that left: keeping the order instead would move every row behind it (at 64 rows, most of the
        fast path's buffers each time a row finishes)."""
        live = [i for i, r in enumerate(self.rows) if not r.done]
        if len(live) < len(self.rows):
            keep = fill_order(live)
            self.target_kv.select(torch.tensor(keep, dtype=torch.long, device=self.device))
            self.drafter.retire(keep)
            self.rows = [self.rows[i] for i in keep]
        for req in self.requests:
            req.settle()

    def _admit(self, room: int | None) -> dict[int, float]:
        """Open slots with new rows (first come, first served, up to `room` rows in the batch) and
        prefill them. Returns seconds of prefill per request id that had rows admitted."""
        new: list[Row] = [r for r in self._readmit if not r.done]
        self._readmit = []
        free = (room if room is not None else 10**9) - len(self.rows) - len(new)
        for req in self.requests:
            n = min(req.wanted(), max(free, 0))
            if n > 0:
                new += req.new_rows(n)
                free -= n
        if not new:
            return {}
        self.admitting = {r.owner.id for r in new}
        self.pressure = {}
        for r in new:
            self.pressure[r.owner.id] = self.pressure.get(r.owner.id, 0) + len(r.seq)
        # a re-admitted row (after a fault) brings what it generated so far; its last token is fed next
        kv, secs, _ = prefill(self.target, [r.seq for r in new], self.device, self.dtype,
                              new_cache=self._prefill_cache if self.cache_factory else None)
        if kv is not self.target_kv:
            self.target_kv.merge(kv)
        d_secs, _ = self.drafter.admit([r.seq for r in new], [r.tag for r in new])
        self.spent["prefill"] += secs + d_secs
        self.rows += new
        self.admitting = set()
        return {i: secs + d_secs for i in {r.owner.id for r in new}}

    def _prefill_cache(self, batch: int):
        """The cache a prefill of `batch` new rows writes to: ours, when the batch is empty and our
        buffers hold them (the fast path keeps them between batches), else a new one to merge."""
        reuse = getattr(self.target_kv, "emptied", None)
        return self.target_kv if reuse is not None and reuse(batch) else self.cache_factory(batch)

    def take_over(self, old: "SpeculativeEngine") -> None:
        """Serve `old`'s requests from now on (the same pair on another forward path): their rows are
        prefilled again into this engine's caches at the next step, from the tokens they hold."""
        old.drop_caches()
        self.requests, self._readmit, self.last = old.requests, old._readmit, old.last
        old.requests, old._readmit = [], []

    def drop_caches(self) -> None:
        """Forget both KV caches (after an out-of-memory step left them half-written); every running
        row is prefilled again from its tokens at the next step."""
        self._readmit = [r for r in self.rows if not r.done]
        self.rows = []
        self.target_kv = self._new_cache()
        self.drafter.reset()
        self.admitting, self.pressure = set(), {}

    def _new_cache(self):
        return self.cache_factory(0) if self.cache_factory else RaggedCache(0, self.device, self.dtype)

    # --- one step -------------------------------------------------------------------------------------
    def _step(self, prefill_s: dict[int, float], changes: dict, retired: dict, queued: int,
              started: float) -> list[tuple[Request, StepEvent]]:
        t0 = time.perf_counter()
        owners = _unique(r.owner for r in self.rows)
        plans = {req.id: req.plan(len(self.rows)) for req in owners}
        ctx = self._context(plans, queued)
        # plan: how deep each row drafts (its policy, or the verify budget)
        draft = self.budget.plan_drafts(ctx, self.drafter)
        # propose                                                          # tokens: [B, K]
        full = self.drafter.propose(ctx.seqs, draft.depths, [plans[r.owner.id].confidence for r in self.rows],
                                    [r.owner.temperature for r in self.rows], [r.gen for r in self.rows],
                                    scores=draft.scores, survival=draft.floors)
        prop, selection = self.budget.trim(full, ctx)
        # verify: [last token, d_1..d_K] per row in one pass; slots past a row's drafts are holes  # [B, K+1]
        L0 = self.target_kv.length
        logits, verify_s = self._verify(ctx.seqs, prop)
        # accept: the longest agreeing prefix (greedy) or the Leviathan/Chen rule (sampling)
        n, nxt = self._accept(logits[..., : self.vocab], prop, [r.owner.temperature for r in self.rows],
                              [r.gen for r in self.rows])
        # commit: rejected drafts become holes in both caches; rows take their tokens
        self._commit(prop, n, L0)
        row_steps, plain = self._apply(prop, n, nxt, ctx.seqs, full.length_list())
        # what the budget prices: acceptance and the caches' bookkeeping, neither pass
        overhead = max(0.0, time.perf_counter() - t0 - prop.seconds - verify_s)
        self.budget.learn(ctx, full, prop, n, nxt, verify_s, overhead)
        wall = time.perf_counter() - started     # the whole step: rows leaving, planning, learning too
        shared = self._shared(ctx, full, prop, selection, L0, verify_s, overhead, wall, owners, row_steps)
        return [self._event(req, plans[req.id], prop, row_steps, plain, prefill_s, changes, retired, shared)
                for req in owners]

    def _context(self, plans: dict[int, StepPlan], queued: int) -> StepContext:
        rows = self.rows
        waiting = queued > 0 or any(req.wanted() > 0 for req in self.requests)
        return StepContext(len(rows), [plans[r.owner.id].depth for r in rows],
                           [r.owner.max_new - len(r.out) for r in rows], [plans[r.owner.id].budgeted for r in rows],
                           [r.owner.temperature > 0 for r in rows], waiting, [r.seq for r in rows])

    def _verify(self, seqs: list[list[int]], prop: Proposal) -> tuple[torch.Tensor, float]:
        lengths = prop.length_list()
        self.pressure = {}            # who put how many tokens into this pass (an out-of-memory step's culprit)
        for r, d in zip(self.rows, lengths):
            self.pressure[r.owner.id] = self.pressure.get(r.owner.id, 0) + d + 1
        # the block and its validity built on the host and copied over: on a GPU each small op building
        # them would be a launch the step waits for
        width = prop.width + 1
        block = [[s[-1], *row] for s, row in zip(seqs, prop.token_lists())]
        valid = [[j <= d for j in range(width)] for d in lengths]
        return timed_forward(self.target_kv, self.target, to_device(block, torch.long, self.device),
                             to_device(valid, torch.bool, self.device), host_valid=valid)

    def _commit(self, prop: Proposal, n: list[int], L0: int) -> None:
        rows, slots = [], []
        for i, (k, a) in enumerate(zip(prop.length_list(), n)):
            for j in range(a + 1, k + 1):         # drafts a + 1 … k were rejected: block slots L0 + j
                rows.append(i)
                slots.append(L0 + j)
        if rows:
            # every pair is a draft this step verified: a valid slot, so the counts can stay on the host
            self.target_kv.invalidate(to_device(rows, torch.long, self.device),
                                      to_device(slots, torch.long, self.device), host_rows=rows)
        self.drafter.commit(n)
        self.target_kv.compact()

    def _shared(self, ctx: StepContext, full: Proposal, prop: Proposal, selection, L0: int, verify_s: float,
                overhead: float, wall: float, owners: list[Request], row_steps: list[RowStep]) -> dict:
        """The step's figures every request's event carries, and the engine's running sums."""
        B, K = ctx.rows, prop.width
        proposed, verified = sum(full.length_list()), sum(prop.length_list())
        verify_cost = pass_cost(self.spec, B, K + 1, L0)
        self.steps_run += 1
        self.pass_tokens += B + verified
        for part, secs in (("draft", prop.seconds), ("verify", verify_s), ("other", overhead)):
            self.spent[part] += secs
        self.slots_drafted, self.slots_verified = self.slots_drafted + proposed, self.slots_verified + verified
        return dict(batch_size=B, draft_s=prop.seconds, verify_s=verify_s, overhead_s=overhead, wall_s=wall,
                    tokens_per_pass=B * (K + 1), context=L0, draft_flops=prop.cost.flops,
                    draft_bytes=prop.cost.bytes, target_flops=verify_cost.flops, target_bytes=verify_cost.bytes,
                    users=len(owners), shared_emitted=sum(len(rs.emitted) for rs in row_steps),
                    path=self.fast_label, slots_drafted=proposed, slots_verified=verified,
                    budget=None if selection is None else selection.budget, real_tokens=B + verified,
                    padded_tokens=self.target_kv.padded_tokens(B, K + 1, B + verified))

    def _event(self, req: Request, plan: StepPlan, prop: Proposal, row_steps: list[RowStep], plain: list[float],
               prefill_s: dict, changes: dict, retired: dict, shared: dict) -> tuple[Request, StepEvent]:
        # by row id: a request's rows keep their order in its events whatever the batch order
        mine = sorted((i for i, r in enumerate(self.rows) if r.owner is req), key=lambda i: self.rows[i].id)
        ev = StepEvent(step=req.steps, depth=plan.depth, policy=req.state.policy.name,
                       rows=[row_steps[i] for i in mine], prefill_s=prefill_s.get(req.id, 0.0),
                       plain_flops=sum(plain[i] for i in mine), changes=changes.get(req.id, []),
                       retired=retired.get(req.id, []), share=len(mine) / shared["batch_size"], **shared)
        self._finish_step(req, ev, plan, prop)
        return req, ev

    def _finish_step(self, req: Request, ev: StepEvent, plan: StepPlan, prop: Proposal) -> None:
        req.steps += 1
        req.totals.add(ev)
        req.state.policy.observe(StepObservation(ev.batch_size, plan.depth, ev.drafted, ev.accepted, ev.draft_s,
                                                 prop.passes, ev.verify_s, ev.tokens_per_pass, ev.reached))

    def _accept(self, logits: torch.Tensor, prop: Proposal, temps: list[float], gens: list):
        """Greedy rows keep the drafts that match the target's argmax; sampled rows apply the
        Leviathan/Chen rule, each with its own random stream. Returns (n accepted, next token) per row, as
        lists: greedy rows read the argmax back once and compare on the host (a handful of integers: on a
        GPU, a chain of small ops would cost more), sampled rows read their verdicts back once."""
        n, nxt = greedy_accept(greedy_ids(logits).tolist(), prop.token_lists(), prop.length_list())
        sampled = [i for i, t in enumerate(temps) if t > 0]
        if sampled:
            idx = to_device(sampled, torch.long, self.device)
            t = to_device([temps[i] for i in sampled], torch.float32, self.device)[:, None, None]
            p = probabilities(logits[idx], t)
            q = None if prop.q is None else prop.q[idx]
            n_s, nxt_s = speculative_accept(p, q, prop.device_tokens()[idx], prop.device_lengths()[idx],
                                              [gens[i] for i in sampled])
            for i, a, x in zip(sampled, *torch.stack((n_s, nxt_s)).tolist()):
                n[i], nxt[i] = a, x
        return n, nxt

    def _apply(self, prop, n: list[int], nxt: list[int], seqs, proposed):
        """Append each row's accepted drafts and the target's token; mark rows that finished.
        Returns the RowSteps and, per row, what plain decoding would have spent on its tokens."""
        out: list[RowStep] = []
        plain: list[float] = []
        per_ctx: dict[float, float] = {}      # rows at one context share its price (a batch of one prompt)
        drafts, lengths = prop.token_lists(), prop.length_list()
        for i, r in enumerate(self.rows):
            k, a = lengths[i], n[i]
            emitted = (drafts[i][:a] + [nxt[i]])[: r.owner.max_new - len(r.out)]
            for pos, t in enumerate(emitted):
                if t in self.eos:
                    emitted = emitted[: pos + 1]
                    r.done, r.finish = True, "eos"
                    break
            r.out += emitted
            if not r.done and len(r.out) >= r.owner.max_new:
                r.done, r.finish = True, "length"
            kind = "plain" if k == 0 else ("bonus" if a == k else "correction")
            out.append(RowStep(r.id, drafts[i][:k], a, emitted, kind, r.done, r.finish, proposed[i]))
            # plain decoding would run one pass per emitted token, at growing context (linear in it)
            ctx = len(seqs[i]) - 1 + (len(emitted) - 1) / 2
            if ctx not in per_ctx:
                per_ctx[ctx] = plain_token_flops(self.spec, ctx)
            plain.append(len(emitted) * per_ctx[ctx])
        return out, plain


def fill_order(live: list[int]) -> list[int]:
    """The rows `live` (ascending batch positions) packed into the first len(live) places, as the index
    list `select` takes: rows already there stay put, the rows beyond fill the gaps, both in ascending
    order. [0, 2, 3, 5] → [0, 5, 2, 3]."""
    n = len(live)
    movers = [i for i in live if i >= n]
    taken = set(live)
    holes = [p for p in range(n) if p not in taken]
    keep = list(range(n))
    for p, i in zip(holes, movers):
        keep[p] = i
    return keep


def _unique(items) -> list:
    seen, out = set(), []
    for x in items:
        if id(x) not in seen:
            seen.add(id(x))
            out.append(x)
    return out
