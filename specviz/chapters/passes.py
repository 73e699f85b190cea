"""Target passes of given shapes, ready to time again and again: rows × tokens new tokens on rows that all
hold the same context, through the forward path the pair's engine runs (the fast path once the app has
switched to it, else transformers' own modules), each with its undo so every repeat meets that context.
The context is prefilled twice at most (a prefill costs more than the passes of a small shape)."""
from __future__ import annotations

import copy

import torch

from specviz.hardware.paired import Pass


class Contexts:
    """One prefilled context (`context_ids`, [1, context]) as a one-row cache, which every one-row pass
    shares (each undoes itself before the next runs), and a wide cache of its copies for passes of more
    rows: a wide pass is good until the next wide one is made."""

    def __init__(self, pair, context_ids: torch.Tensor):
        self.model, self.device = pair.target.model, pair.target.device
        self.new_cache = getattr(pair, "target_cache", None)
        self.ids, self.context = context_ids, context_ids.shape[1]
        self.vocab = self.model.get_input_embeddings().weight.shape[0]
        self.one, self.wide = self._prefilled(), None

    def shaped(self, rows: int, tokens: int) -> Pass:
        # the same new tokens on every row: the cost does not depend on which, and each row then
        # computes what one row alone computes (a test checks it)
        ids = torch.randint(0, self.vocab, (1, tokens), device=self.device).expand(rows, -1).contiguous()
        cache = self.one if rows == 1 else self._widened(rows)
        if self.new_cache is not None:
            ones = torch.ones_like(ids, dtype=torch.bool)
            return (lambda: cache.forward(self.model, ids, ones)), (lambda: cache.truncate(self.context))
        # a negative count means "remove this many" in every transformers 5.x (a positive one meant an
        # absolute length in older releases and is refused by newer ones)
        return ((lambda: self.model(input_ids=ids, past_key_values=cache, use_cache=True)),
                (lambda: cache.crop(-(cache.get_seq_length() - self.context))))

    def _prefilled(self):
        if self.new_cache is not None:
            cache = self.new_cache(1)
            cache.forward(self.model, self.ids, torch.ones_like(self.ids, dtype=torch.bool), 1)
            return cache
        # on first use: transformers is slow to import
        from transformers import DynamicCache
        cache = DynamicCache()
        self.model(input_ids=self.ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache

    def _widened(self, rows: int):
        if self.new_cache is None:
            self.wide = copy.deepcopy(self.one)
            self.wide.batch_repeat_interleave(rows)          # rows caches to read, each the context
            return self.wide
        if self.wide is None:
            self.wide = self._prefilled()
        # every row holds the context, so row 0 copied `rows` times widens or narrows it alike
        self.wide.select(torch.zeros(rows, dtype=torch.long, device=self.device))
        return self.wide
