"""`StaticCache`: the fast path's KV cache, with the same interface as `specviz.engine.kvcache.RaggedCache`
(forward, select, merge, add_rows, invalidate, compact, length, batch, holes) so the engine and the
drafters use either without knowing which. The graph path's cache (`graphcache.GraphCache`) builds on it.

What is static, and why:
- KV buffers are preallocated per layer as [B_cap, n_kv, S_cap, head_dim] and grown in chunks of
  `CHUNK` slots; a pass writes its block in place (`index_copy_`) instead of concatenating.
- Buffer rows are a power of two (B_cap), kept when rows leave: a pass reads only the first B rows and
  L + T used slots, so fewer rows would save memory only, and a reallocation is paid again in page
  faults by the next batch. Passes are unpadded here: padding is real arithmetic.
- Padding queries and hole slots are hidden by the validity mask. Every query attends with an additive
  mask that lets it see its own slot at least (`kvcache.attention_bias`), so no attention kernel
  returns NaN and buffers only ever receive finite keys/values.
- Logical bookkeeping (valid [B, L], n_valid [B], positions counting valid slots only) is the same as
  RaggedCache's.
"""
from __future__ import annotations

import torch

from specviz.engine.kvcache import SlotValidity, attention_bias
from specviz.fastpath.llama import CompactLlama

CHUNK = 256          # slots added when the buffers grow (fewer distinct shapes than growing by one)
# blocks up to this many tokens take the compact model's `fast_hidden` (compiled layers with --compile on
# a CPU); compiling for every prompt width would not pay, so wider blocks (prefills) run `hidden`
COMPILED_MAX_T = 16


def bucket(n: int) -> int:
    """The smallest power of two ≥ n (1 for n ≤ 1)."""
    return 1 << max(0, n - 1).bit_length()


def _round_up(n: int, chunk: int) -> int:
    return max(chunk, -(-n // chunk) * chunk)


# holes (padding after a row's drafts) that make a block worth packing: below this, the gather and
# scatter cost more than the rows they save
PACK_HOLES = 0.25


class StaticCache(SlotValidity):
    """Preallocated KV buffers + validity bookkeeping for one compact model over a batch of rows."""

    def padded_tokens(self, rows: int, width: int, real: int) -> int:
        """The compact forward computes only the real tokens (holes skipped)."""
        return real

    def __init__(self, compact: CompactLlama, batch: int, slots: int = 0):
        self.m = compact
        self.device, self.dtype = compact.device, compact.dtype
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)   # [B, L]
        self.n_valid = torch.zeros(batch, dtype=torch.long, device=self.device)     # [B]
        self.kbufs: list[torch.Tensor] = []
        self.vbufs: list[torch.Tensor] = []
        self._alloc(bucket(max(batch, 1)), _round_up(slots, CHUNK))

    # --- shape bookkeeping ---------------------------------------------------------------------
    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, slots) the buffers hold."""
        return self.kbufs[0].shape[0], self.kbufs[0].shape[2]

    def _alloc(self, rows: int, slots: int, keep_rows: int = 0, keep_slots: int = 0) -> None:
        """(Re)allocate zeroed buffers [rows, n_kv, slots, hd], keeping the first keep_rows × keep_slots."""
        d = self.m.dims
        shape = (rows, d.n_kv, slots, d.head_dim)
        old = (self.kbufs, self.vbufs)
        self.kbufs = [self._buffer(shape) for _ in range(self.m.n_layers)]
        self.vbufs = [self._buffer(shape) for _ in range(self.m.n_layers)]
        if keep_rows and keep_slots:
            for new, prev in zip(self.kbufs + self.vbufs, old[0] + old[1]):
                new[:keep_rows, :, :keep_slots] = prev[:keep_rows, :, :keep_slots]

    def _buffer(self, shape) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _fit(self, rows: int, slots: int) -> None:
        """Make the buffers hold at least `rows` rows (bucketed) and `slots` slots; they never shrink (the
        engine gives the memory back once the class is quiet)."""
        cap_r, cap_s = self.capacity
        want_r = max(bucket(max(rows, 1)), cap_r)
        want_s = cap_s if slots <= cap_s else _round_up(slots, CHUNK)
        if (want_r, want_s) != (cap_r, cap_s):
            self._alloc(want_r, want_s, min(cap_r, want_r, self.batch), min(cap_s, self.length))

    # --- the pass -------------------------------------------------------------------------------
    def forward(self, model, tokens: torch.Tensor, tok_valid: torch.Tensor, logits_to_keep: int = 0,
                host_valid: list[list[bool]] | None = None):
        """Append a block and return logits, like RaggedCache.forward (`model` is the transformers
        model this cache was built for; its weights are read through the compact view).

        tokens, tok_valid: [B, T]. Returns logits [B, T', V] for the last T' = logits_to_keep (all if 0)."""
        B, T = tokens.shape
        L = self.length
        self._fit(B, L + T)
        R, S = B, L + T          # the used slots only: attention over the whole buffer would be wasted work
        pos, after = self._positions(tok_valid, host_valid)                                    # [B, T]
        all_valid = torch.cat([self.valid, tok_valid], dim=1)                                   # [B, L+T]
        slots = torch.arange(L, L + T, device=self.device)                                      # [T]
        bias = attention_bias(all_valid, slots, self.dtype)                                     # [B, 1, T, S]
        keep = T if logits_to_keep in (0, None) else min(logits_to_keep, T)
        sel = self._packable(tok_valid, self.m.c_layers) if self.m.fast_hidden == self.m.hidden else None
        if sel is not None:          # holes are a large share of the block: compute its real tokens only
            h = self.m.hidden_packed(tokens, pos, bias, slots, *self._views(R, S), sel)
            logits = self._unpack_logits(h, sel, B, T, keep)
        else:
            run = self.m.fast_hidden if T <= COMPILED_MAX_T else self.m.hidden
            h = run(tokens, pos, bias, slots, *self._views(R, S))
            logits = self.m.logits(h[:, T - keep:T])
        self.valid = all_valid
        self._appended(tok_valid, after)
        return logits

    @staticmethod
    def _packable(tok_valid: torch.Tensor, c_layers=None) -> torch.Tensor | None:
        """The real tokens' positions in the flattened block when holes make up at least PACK_HOLES of
        it (a verify where some rows drafted less than others; a prefill of prompts of different lengths);
        None: run the block as it is. Where our C layers serve that many tokens (`c_layers(n)`, see
        CompactLlama) any hole is worth leaving out: they take the real tokens' positions directly."""
        B, T = tok_valid.shape
        if T < 2 or tok_valid.device.type != "cpu":
            return None
        flat = tok_valid.reshape(-1)
        n = int(flat.sum())
        free = c_layers is not None and c_layers(n) is not None
        if n == 0 or n == B * T or (not free and n > (1.0 - PACK_HOLES) * B * T):
            return None
        return flat.nonzero().squeeze(1)

    def _unpack_logits(self, h: torch.Tensor, sel: torch.Tensor, B: int, T: int, keep: int) -> torch.Tensor:
        """Logits [B, keep, V] of the last `keep` positions, computed for the real tokens only; a hole's
        logits are zeros (nothing reads them: a row's verdicts stop at its own drafts)."""
        pos_in_row = sel % T
        mine = pos_in_row >= T - keep
        out = h.new_zeros(B * keep, self.m.head_rows)
        rows, cols = sel[mine] // T, pos_in_row[mine] - (T - keep)
        out[rows * keep + cols] = self.m.logits(h[mine])
        return out.view(B, keep, -1)

    def _views(self, rows: int, slots: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The buffers' first `rows` rows and `slots` slots (views: writes land in the buffers)."""
        if (rows, slots) == self.capacity:
            return self.kbufs, self.vbufs
        return [b[:rows, :, :slots] for b in self.kbufs], [b[:rows, :, :slots] for b in self.vbufs]

    # --- bookkeeping between passes (same contracts as RaggedCache) -----------------------------
    def compact(self, min_waste: float = 0.25, min_holes: int = 32) -> bool:
        """Move each row's valid slots to the right end of [0, new_len) when holes waste enough."""
        order = self.compaction_order(min_waste, min_holes)                                    # [B, new_len]
        if order is None:
            return False
        B, L, new_len = self.batch, self.length, order.shape[1]
        for buf in self.kbufs + self.vbufs:
            idx = order[:, None, :, None].expand(-1, buf.shape[1], -1, buf.shape[3])
            buf[:B, :, :new_len] = torch.gather(buf[:B, :, :L], 2, idx)
        self.valid = torch.gather(self.valid, 1, order)
        return True

    def select(self, keep: torch.Tensor) -> None:
        """Keep only these rows (in this order). keep: [B'] row indices; one may repeat (a prefill that
        computed a shared prompt once hands each of its rows a copy), so B' may exceed the rows held."""
        L = self.length
        if keep.numel() > self.capacity[0]:
            self._fit(keep.numel(), L)
        # only the rows that change place (the engine fills the places of rows that left with rows from the
        # end of the batch, so a row leaving copies one row, not the batch); the right side is gathered
        # before anything is written, so any order of rows is safe
        here = torch.arange(keep.numel(), device=self.device)
        moved = (keep != here).nonzero().flatten()
        if moved.numel():
            src, dst = keep[moved], here[moved]
            for buf in self.kbufs + self.vbufs:
                buf[dst, :, :L] = buf[src, :, :L]
        self.valid = self.valid[keep]
        self.n_valid = self.n_valid[keep]
        self._trim_left()

    def _trim_left(self) -> None:
        """Drop leading slots that no row uses (left after rows retire)."""
        first = self.first_used_slot()
        if first == 0:
            return
        B, L = self.batch, self.length
        for buf in self.kbufs + self.vbufs:
            buf[:B, :, :L - first] = buf[:B, :, first:L].clone()
        self.valid = self.valid[:, first:]

    def truncate(self, length: int) -> None:
        """Forget the slots from `length` on, as if the passes that wrote them had not run (a timing loop
        meets the same context on every repeat); the buffers keep their size, the next pass writes over."""
        self.valid = self.valid[:, :length]
        self.n_valid = self.valid.sum(dim=1)

    def add_rows(self, n: int) -> None:
        """Append n rows that hold nothing yet (every slot a hole)."""
        B, L = self.batch, self.length
        self._fit(B + n, L)
        self.valid = torch.cat([self.valid, torch.zeros(n, L, dtype=torch.bool, device=self.device)])
        self.n_valid = torch.cat([self.n_valid, torch.zeros(n, dtype=torch.long, device=self.device)])

    def emptied(self, batch: int) -> bool:
        """Serve as the empty cache of `batch` new rows (a new batch's prefill) on the buffers we hold,
        zeroed as fresh ones: True if they hold that many rows. Fresh buffers would be faulted in page by
        page, which on a small CPU costs more than the prefill's arithmetic."""
        if self.batch or bucket(max(batch, 1)) > self.capacity[0]:
            return False
        for buf in self.kbufs + self.vbufs:
            buf[:batch].zero_()
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=self.device)
        self.n_valid = torch.zeros(batch, dtype=torch.long, device=self.device)
        return True

    def merge(self, other: "StaticCache") -> None:
        """Append the rows of `other` after ours; the shorter one is left-padded with holes."""
        if other.m.n_layers != self.m.n_layers:
            raise RuntimeError("cannot merge caches with different layer counts")
        B1, L1, B2, L2 = self.batch, self.length, other.batch, other.length
        if B1 == 0:                    # nothing of ours to keep: take theirs as they are
            self.kbufs, self.vbufs, self.valid, self.n_valid = other.kbufs, other.vbufs, other.valid, other.n_valid
            return
        L = max(L1, L2)
        cap_r, cap_s = self.capacity
        if B1 + B2 <= cap_r and L <= cap_s:
            self._merge_in_place(other, L)
        else:
            mine = (self.kbufs, self.vbufs)
            self._alloc(bucket(B1 + B2), _round_up(L, CHUNK))
            for new, a, b in zip(self.kbufs + self.vbufs, mine[0] + mine[1], other.kbufs + other.vbufs):
                new[:B1, :, L - L1:L] = a[:B1, :, :L1]
                new[B1:B1 + B2, :, L - L2:L] = b[:B2, :, :L2]
        self.valid = torch.cat([_left_pad(self.valid, L), _left_pad(other.valid, L)], dim=0)
        self.n_valid = torch.cat([self.n_valid, other.n_valid])

    def _merge_in_place(self, other: "StaticCache", L: int) -> None:
        """`merge` into the rows our buffers already hold (a user joining the class): no new buffers,
        so no pages to fault in. Our rows move right when the newcomer's block is longer; every slot
        left of a row's data is zeroed, as in fresh buffers."""
        B1, L1, B2, L2 = self.batch, self.length, other.batch, other.length
        for buf, b in zip(self.kbufs + self.vbufs, other.kbufs + other.vbufs):
            if L > L1 and B1:
                buf[:B1, :, L - L1:L] = buf[:B1, :, :L1].clone()
                buf[:B1, :, :L - L1].zero_()
            buf[B1:B1 + B2, :, L - L2:L] = b[:B2, :, :L2]
            buf[B1:B1 + B2, :, :L - L2].zero_()


def _left_pad(valid: torch.Tensor, length: int) -> torch.Tensor:
    """False-pad a [B, L] mask on the left to [B, length]."""
    missing = length - valid.shape[1]
    if missing <= 0:
        return valid
    return torch.cat([torch.zeros(valid.shape[0], missing, dtype=valid.dtype, device=valid.device), valid], dim=1)
