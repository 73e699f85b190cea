"""`GraphCache`: the graph path's KV cache. The same contract as `StaticCache` (which it extends), but its
rows live in its model's KV arena (`graphs.GraphRunner`) while it runs there, so its passes can replay the
graphs captured over that arena.

One arena, many caches (the class's engine, a lesson's engine, the knee's probes, a draft's cache): the
arena holds one cache's rows at a time, its *tenant*. A cache that runs a pass takes the arena; the
previous tenant's rows are copied out into buffers of its own first (a spill) and copied back when it
runs again. Passes of two engines therefore stay exact whatever their order; only alternating engines
pay the copies, and the app's device gate lets one engine run at a time anyway.

Which passes replay a graph: a block whose (rows, tokens, cache length) fits a captured bucket. The rest
run the compact forward uncompiled — on the arena when it fits there (a prefill into the running batch,
a block too wide), else on the cache's own buffers (a fresh cache's first pass, which is a prefill to be
merged; a cache that outgrew the arena). Nothing is reallocated in the arena, ever.

Every method holds the runner's lock: the arena, the static buffers and the tenant are shared by every
thread that runs the model.
"""
from __future__ import annotations

import weakref

import torch

from specviz.fastpath.cache import CHUNK, StaticCache, _left_pad, _round_up, bucket


class GraphCache(StaticCache):
    """A StaticCache whose rows move into its runner's arena to replay captured passes."""

    def __init__(self, runner, batch: int, slots: int = 0):
        self.runner = runner
        self.attached = False        # our rows are in the arena (self.kbufs are the arena's tensors)
        # tokens the last pass computed: its bucket's rows × tokens when it replayed, else the block's own
        # (the engine's step events can report it beside tokens_per_pass)
        self.last_padded = 0
        super().__init__(runner.compact, batch, slots)

    def padded_tokens(self, rows: int, width: int, real: int) -> int:
        """A replayed pass computes its bucket's whole shape."""
        return self.last_padded or rows * width

    # --- the pass -------------------------------------------------------------------------------
    def forward(self, model, tokens: torch.Tensor, tok_valid: torch.Tensor, logits_to_keep: int = 0,
                host_valid: list[list[bool]] | None = None):
        with self.runner.lock:
            B, T = tokens.shape
            shape = self.runner.pick(B, T, self.length)
            if shape is not None and (self.attached or self.length):
                self._attach()
                self.last_padded = shape.rows * shape.tokens
                return self._replay(tokens, tok_valid, logits_to_keep, shape, host_valid)
            self.runner.count("eager_passes")
            self.last_padded = B * T
            return super().forward(model, tokens, tok_valid, logits_to_keep, host_valid=host_valid)

    def _replay(self, tokens, tok_valid, logits_to_keep: int, shape, host_valid=None) -> torch.Tensor:
        B, T = tokens.shape
        pos, after = self._positions(tok_valid, host_valid)                           # [B, T]
        all_valid = torch.cat([self.valid, tok_valid], dim=1)                         # [B, L+T]
        h = self.runner.replay(shape, tokens, pos, all_valid, self.length)            # [B, T, d]
        keep = T if logits_to_keep in (0, None) else min(logits_to_keep, T)
        logits = self.m.logits(h[:, T - keep:T])      # read before the lock lets another replay in
        self.valid = all_valid
        self._appended(tok_valid, after)
        return logits

    # --- the arena ------------------------------------------------------------------------------
    def _attach(self) -> None:
        """Take the arena: spill its tenant's rows, copy ours in."""
        r = self.runner
        if self.attached:
            return
        tenant = r.tenant() if r.tenant is not None else None
        if tenant is not None and tenant is not self:
            tenant._spill()
        B, L = self.batch, self.length
        if B:       # an emptied cache brings no rows, and its old length may exceed the arena's slots
            for arena, own in zip(r.keys + r.values, self.kbufs + self.vbufs):
                arena[:B, :, :L].copy_(own[:B, :, :L])
        self.kbufs, self.vbufs = list(r.keys), list(r.values)
        self.attached, r.tenant = True, weakref.ref(self)

    def _spill(self, rows: int = 0, slots: int = 0) -> None:
        """Leave the arena: our rows go to buffers of our own, large enough for `rows` × `slots`."""
        if not self.attached:
            return
        B, L = self.batch, self.length
        self.attached, self.runner.tenant = False, None
        if B and L:
            self.runner.count("spills")
        # _alloc keeps the first B × L of the arena's tensors, which self.kbufs still are
        StaticCache._alloc(self, bucket(max(rows, B, 1)), _round_up(max(slots, L), CHUNK), B, L)

    def _fits(self, rows: int, slots: int) -> bool:
        return rows <= self.runner.buckets.max_rows and slots <= self.runner.buckets.max_slots

    def _fit(self, rows: int, slots: int) -> None:
        if self.attached:
            if not self._fits(rows, slots):      # outgrown: on our own buffers from here (counted)
                self._spill(rows, slots)
            return
        super()._fit(rows, slots)

    def _alloc(self, rows: int, slots: int, keep_rows: int = 0, keep_slots: int = 0) -> None:
        if self.attached:                         # the arena is never reallocated
            self._spill(rows, slots)
            return
        super()._alloc(rows, slots, keep_rows, keep_slots)

    # --- bookkeeping between passes (each under the lock) --------------------------------------------
    def emptied(self, batch: int) -> bool:
        """The next batch's prefill runs straight into the arena when its rows fit there (no zeroing:
        slots nobody may see are never read, and the arena holds finite values only)."""
        with self.runner.lock:
            if self.batch or not self._fits(batch, 1):
                return super().emptied(batch)
            self._attach()
            self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)
            self.n_valid = torch.zeros(batch, dtype=torch.long, device=self.device)
            return True

    def merge(self, other: "StaticCache") -> None:
        with self.runner.lock:
            if isinstance(other, GraphCache) and other.attached:
                other._spill()
            B1, L1, B2, L2 = self.batch, self.length, other.batch, other.length
            L = max(L1, L2)
            if not self.attached or not self._fits(B1 + B2, L):
                self._spill(B1 + B2, L)
                return super().merge(other)
            self._merge_in_place(other, L)
            self.valid = torch.cat([_left_pad(self.valid, L), _left_pad(other.valid, L)], dim=0)
            self.n_valid = torch.cat([self.n_valid, other.n_valid])

    def select(self, keep: torch.Tensor) -> None:
        with self.runner.lock:
            super().select(keep)

    def truncate(self, length: int) -> None:
        with self.runner.lock:
            super().truncate(length)

    def add_rows(self, n: int) -> None:
        with self.runner.lock:
            super().add_rows(n)

    def compact(self, min_waste: float = 0.25, min_holes: int = 32) -> bool:
        with self.runner.lock:
            return super().compact(min_waste, min_holes)

    def invalidate(self, rows: torch.Tensor, slots: torch.Tensor, host_rows: list[int] | None = None) -> None:
        with self.runner.lock:
            super().invalidate(rows, slots, host_rows)
