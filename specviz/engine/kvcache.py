"""A batched KV cache in which rows advance by different amounts: `RaggedCache`.

Design (why it looks like this):
- Every row shares one cache length L (stock transformers caches are rectangular). A boolean `valid`
  [B, L] says which slots hold real tokens. Left padding at prefill, padding inside a ragged input
  block, and rejected draft tokens all become *holes*: slots with valid = False.
- We pass the model our own 4-D additive attention mask [B, 1, T, L+T]: query t of row b may see
  slot j iff j is valid for row b and j ≤ L + t (causal in slot order). Holes are invisible, so a
  row's logits equal those of its clean sequence. No slot of one row is ever visible to another row.
- Explicit `position_ids` count only valid tokens, so RoPE positions match the clean sequence.
- No query is ever fully masked: each sees its own slot too (`attention_bias`). A padding query (a
  left-pad slot at prefill, a hole) has no valid slot to see, and a fused GPU kernel returns NaN for a
  query that sees nothing; NaN in the cache poisons its row even behind a mask (0 × NaN is NaN). A real
  query already sees its own slot, and a padding query's output is never read, so no real output changes.
- Holes grow L by up to k slots a step; `compact()` gathers each row's valid slots and re-pads on the
  left, so memory and attention cost stay bounded over long runs.
- Rows leave (`select`) and join (`merge`) between steps; both are batch-dimension gathers/concats.
"""
from __future__ import annotations

import time

import torch
from transformers import DynamicCache


def attention_bias(vis: torch.Tensor, slots: torch.Tensor, dtype, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Additive mask [R, 1, T, S] for a block whose T queries sit at `slots` [T], over rows whose visible
    slots are `vis` [R, S]: query t sees the visible slots up to its own, and its own slot always (never a
    fully masked query, see above). `seen`: arange(S), when the caller keeps one (a captured graph)."""
    seen = torch.arange(vis.shape[1], device=vis.device) if seen is None else seen
    causal = seen[None, :] <= slots[:, None]                                          # [T, S]
    own = seen[None, :] == slots[:, None]
    allowed = (vis[:, None, :] & causal[None]) | own[None]                            # [R, T, S]
    bias = torch.zeros(allowed.shape[0], 1, *allowed.shape[1:], dtype=dtype, device=vis.device)
    return bias.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)


class RemappedCache(DynamicCache):
    """A DynamicCache for a model that runs only some of its layers (self-speculative drafting):
    the attention modules keep their original `layer_idx`, which is mapped to a dense index here."""

    def __init__(self, layer_map: dict[int, int]):
        super().__init__()
        self.layer_map = layer_map

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(key_states, value_states, self.layer_map[layer_idx], *args, **kwargs)


class SlotValidity:
    """The validity bookkeeping every KV cache here shares (this one and the fast path's static cache):
    `valid` [B, L] says which slots hold real tokens, `n_valid` [B] counts them per row. Subclasses
    own the key/value storage and move it where these methods say.

    The counts live on the device, on the host, or both. A verify pass whose caller knows the block's
    validity on the host (the engine built it there) keeps them on the host: positions and the compaction
    check then need no op on the device and no read back, which on a GPU is a wait each step. Assigning
    `n_valid` (a tensor) forgets the host copy; the device copy is made again when an op asks for it."""

    valid: torch.Tensor
    device: torch.device
    _n_dev: torch.Tensor | None = None
    _n_host: list[int] | None = None

    @property
    def n_valid(self) -> torch.Tensor:
        if self._n_dev is None:
            self._n_dev = to_device(self._n_host, torch.long, self.device)
        return self._n_dev

    @n_valid.setter
    def n_valid(self, value: torch.Tensor) -> None:
        self._n_dev, self._n_host = value, None

    def n_valid_list(self) -> list[int]:
        """The counts as a list (read from the device at most once while they stay known; do not modify it)."""
        if self._n_host is None:
            self._n_host = self._n_dev.tolist()
        return self._n_host

    def _count_on_host(self, counts: list[int]) -> None:
        self._n_dev, self._n_host = None, counts

    def _positions(self, tok_valid: torch.Tensor, host_valid: list[list[bool]] | None):
        """Each block token's position (the valid slots before it in its row: a padding token's is
        harmless and in range) [B, T], and the rows' counts after the block on the host, or None when
        they are not known there (then `_appended` counts on the device)."""
        if host_valid is None or self._n_host is None:
            tv = tok_valid.long()
            return self.n_valid[:, None] + torch.cumsum(tv, dim=1) - tv, None
        if len(host_valid) != len(self._n_host):
            raise ValueError(f"host_valid has {len(host_valid)} rows for a cache of {len(self._n_host)}")
        pos, after = [], []
        for n, row in zip(self._n_host, host_valid):
            mine = []
            for ok in row:
                mine.append(n)
                n += bool(ok)
            pos.append(mine)
            after.append(n)
        return to_device(pos, torch.long, self.device), after

    def _appended(self, tok_valid: torch.Tensor, after: list[int] | None) -> None:
        """Count a block's valid tokens in (`after`: `_positions`' host counts)."""
        if after is not None:
            self._count_on_host(after)
        else:
            self.n_valid = self.n_valid + tok_valid.long().sum(dim=1)

    def padded_tokens(self, rows: int, width: int, real: int) -> int:
        """Tokens the last pass computed: the stock modules compute the whole rows × width rectangle,
        holes included (a path that skips them, or pads to a bucket, says otherwise)."""
        return rows * width

    @property
    def batch(self) -> int:
        return self.valid.shape[0]

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def holes(self) -> int:
        return int(self.batch * self.length - sum(self.n_valid_list()))

    def invalidate(self, rows: torch.Tensor, slots: torch.Tensor, host_rows: list[int] | None = None) -> None:
        """Turn (row, slot) pairs into holes, e.g. rejected draft tokens. rows, slots: [N]. `host_rows`:
        `rows` as a list, from a caller that knows every pair is a valid slot now (the drafts it just
        verified): the counts then stay on the host."""
        if rows.numel() == 0:
            return
        if host_rows is not None and self._n_host is not None:
            self.valid[rows, slots] = False
            counts = list(self._n_host)
            for r in host_rows:
                counts[r] -= 1
            self._count_on_host(counts)
            return
        was = self.valid[rows, slots]
        self.valid[rows, slots] = False
        self.n_valid = self.n_valid.index_add(0, rows, -was.long())

    def compaction_order(self, min_waste: float = 0.25, min_holes: int = 32) -> torch.Tensor | None:
        """When compacting would free more than `min_waste` of the cache (and at least `min_holes`
        slots): for each row, the slots to keep, valid ones in order at the right end (left padding).
        [B, new_len]. Else None: compacting would cost more than the holes do.
        Only the slots it frees count: the cache shrinks to the longest row, so a shorter row's left
        padding stays. Counting every hole (as this once did) compacted a class of ragged prompts at
        nearly every step — a full gather of every layer's keys and values, ~8 ms of a 50 ms step at
        16 rows — for one or two freed columns."""
        if self.batch == 0 or self.length == 0:
            return None
        new_len = max(self.n_valid_list())
        L = self.length
        freed = self.batch * (L - new_len)
        if freed < min_holes or freed < min_waste * self.batch * L:
            return None
        # sort key puts holes first, valid slots after, each in slot order; keep the last new_len
        key = self.valid.long() * L + torch.arange(L, device=self.device)[None, :]
        return torch.argsort(key, dim=1)[:, L - new_len:]

    def first_used_slot(self) -> int:
        """Leading slots before this one hold no row's token (left behind when rows retire)."""
        if self.length == 0 or self.batch == 0:
            return 0
        used = self.valid.any(dim=0).nonzero()
        return int(used[0]) if used.numel() else self.length


class RaggedCache(SlotValidity):
    """KV cache + validity bookkeeping for one model over a batch of rows."""

    def __init__(self, batch: int, device, dtype, layer_map: dict[int, int] | None = None):
        self.layer_map = layer_map
        self.cache = RemappedCache(layer_map) if layer_map else DynamicCache()
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)   # [B, L]
        self.n_valid = torch.zeros(batch, dtype=torch.long, device=device)     # [B]
        self.device, self.dtype = device, dtype

    def forward(self, model, tokens: torch.Tensor, tok_valid: torch.Tensor, logits_to_keep: int = 0,
                host_valid: list[list[bool]] | None = None):
        """Append a block of tokens and return logits.

        tokens, tok_valid: [B, T]; invalid entries are padding and become holes (`host_valid`: tok_valid
        as lists, where the caller has them). Returns logits [B, T', V] for the last T' = logits_to_keep
        positions (all when 0).
        """
        B, T = tokens.shape
        L = self.length
        all_valid = torch.cat([self.valid, tok_valid], dim=1)                       # [B, L+T]
        # positions count valid tokens only; padding gets a harmless in-range position
        pos, after = self._positions(tok_valid, host_valid)
        mask = None if bool(all_valid.all()) else self._mask(all_valid, L, T)
        out = model(input_ids=tokens, attention_mask=mask, position_ids=pos,
                    past_key_values=self.cache, use_cache=True, logits_to_keep=logits_to_keep)
        self.valid = all_valid
        self._appended(tok_valid, after)
        return out.logits

    def _mask(self, all_valid: torch.Tensor, L: int, T: int) -> torch.Tensor:
        """Additive 4-D mask [B, 1, T, L+T]: causal in slot order, holes hidden.

        Only built when some slot is a hole; without holes the model's own causal path (mask None)
        computes the same thing and lets SDPA use its faster causal kernels."""
        return attention_bias(all_valid, torch.arange(L, L + T, device=self.device), self.dtype)

    def _layers(self):
        # initialised layers hold [B, heads, L, dim] tensors (B may be 0 after every row left)
        return [layer for layer in self.cache.layers if getattr(layer, "keys", None) is not None
                and layer.keys.dim() == 4]

    def compact(self, min_waste: float = 0.25, min_holes: int = 32) -> bool:
        """Drop holes when they make up more than `min_waste` of the cache (and at least `min_holes`
        slots). Each row's valid slots keep their order and move to the right end (left padding)."""
        order = self.compaction_order(min_waste, min_holes)                            # [B, new_len]
        if order is None:
            return False
        for layer in self._layers():
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = torch.gather(layer.keys, 2, idx)
            layer.values = torch.gather(layer.values, 2, idx)
        self.valid = torch.gather(self.valid, 1, order)
        return True

    def select(self, keep: torch.Tensor) -> None:
        """Keep only these rows (in this order). keep: [B'] row indices."""
        for layer in self._layers():
            layer.keys = layer.keys[keep]
            layer.values = layer.values[keep]
        self.valid = self.valid[keep]
        self.n_valid = self.n_valid[keep]
        self._trim_left()

    def _trim_left(self) -> None:
        """Drop leading slots that no row uses (left after rows retire)."""
        first = self.first_used_slot()
        if first == 0:
            return
        for layer in self._layers():
            layer.keys = layer.keys[:, :, first:]
            layer.values = layer.values[:, :, first:]
        self.valid = self.valid[:, first:]

    def add_rows(self, n: int) -> None:
        """Append n rows that hold nothing yet (every slot a hole); their tokens arrive later."""
        L = self.length
        for layer in self._layers():
            shape = list(layer.keys.shape)
            shape[0] = n
            layer.keys = torch.cat([layer.keys, layer.keys.new_zeros(shape)], dim=0)
            layer.values = torch.cat([layer.values, layer.values.new_zeros(shape)], dim=0)
        self.valid = torch.cat([self.valid, torch.zeros(n, L, dtype=torch.bool, device=self.device)])
        self.n_valid = torch.cat([self.n_valid, torch.zeros(n, dtype=torch.long, device=self.device)])

    def merge(self, other: "RaggedCache") -> None:
        """Append the rows of `other` after ours; the shorter cache is left-padded with holes."""
        if self.batch == 0:
            self.cache, self.valid, self.n_valid = other.cache, other.valid, other.n_valid
            return
        mine, theirs = self._layers(), other._layers()
        if len(mine) != len(theirs):
            raise RuntimeError("cannot merge caches with different layer counts")
        L = max(self.length, other.length)
        for a, b in zip(mine, theirs):
            a.keys = torch.cat([_left_pad(a.keys, L), _left_pad(b.keys, L)], dim=0)
            a.values = torch.cat([_left_pad(a.values, L), _left_pad(b.values, L)], dim=0)
        self.valid = torch.cat([_left_pad(self.valid, L, dim=1), _left_pad(other.valid, L, dim=1)], dim=0)
        self.n_valid = torch.cat([self.n_valid, other.n_valid])


def _left_pad(t: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    """Zero-pad tensor `t` on the left of `dim` up to `length` (zeros = False for masks)."""
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(data, dtype, device) -> torch.Tensor:
    """`torch.tensor(data, dtype=dtype)` on `device`. On CUDA through pinned memory and without waiting: a
    plain copy from host memory first waits for every kernel queued before it, as a read back does."""
    t = torch.tensor(data, dtype=dtype)
    if torch.device(device).type != "cuda" or t.numel() == 0:      # nothing to copy: nothing to pin
        return t.to(device)
    # the caching host allocator keeps the pinned block until the copy has run
    return t.pin_memory().to(device, non_blocking=True)


def timed_forward(cache: RaggedCache, model, tokens, valid, logits_to_keep=0, host_valid=None):
    """Run one forward and return (logits, seconds inside the model). `host_valid`: `valid` as lists."""
    _sync(cache.device)
    t0 = time.perf_counter()
    logits = cache.forward(model, tokens, valid, logits_to_keep, host_valid=host_valid)
    _sync(cache.device)
    return logits, time.perf_counter() - t0


def left_padded(seqs: list[list[int]], device, min_len: int = 1):
    """Stack ragged token lists, padding on the left. Returns tokens [B, T], valid [B, T]."""
    T = max([min_len] + [len(s) for s in seqs])
    tokens = torch.zeros(len(seqs), T, dtype=torch.long)
    valid = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            tokens[i, T - len(s):] = torch.tensor(s, dtype=torch.long)
            valid[i, T - len(s):] = True
    return tokens.to(device), valid.to(device)


def prefill(model, prompts: list[list[int]], device, dtype, layer_map=None, new_cache=None):
    """Build a cache holding each prompt except its last token (which the first step feeds).
    `new_cache(batch)` makes the cache (the fast path's); default a RaggedCache.
    Rows with the same tokens are computed once and copied: a class that pressed Run on the same prompt,
    or 16 users over 5 example prompts, prefills each prompt once (the prefill of a 2-core CPU is
    compute-bound, so this is time saved, not just memory). Each row's slots get the bits its twin got:
    the block is as wide as before (its longest prompt is among the distinct ones), and every product
    computes a row on its own or, through a library, at the same width.
    Returns (cache, seconds, width of the prefill block)."""
    heads = [p[:-1] for p in prompts]
    index, distinct = shared_rows(heads)
    cache = new_cache(len(distinct)) if new_cache else RaggedCache(len(distinct), device, dtype, layer_map)
    tokens, valid = left_padded(distinct, device)
    _, secs = timed_forward(cache, model, tokens, valid, logits_to_keep=1)
    if len(distinct) < len(heads):
        t0 = time.perf_counter()
        cache.select(torch.tensor(index, dtype=torch.long, device=cache.device))
        secs += time.perf_counter() - t0
    return cache, secs, tokens.shape[1]


def shared_rows(seqs: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """(per sequence, the index of its first copy among the distinct ones; the distinct ones in order)."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(s), len(first)) for s in seqs]
    return index, [list(t) for t in first]
