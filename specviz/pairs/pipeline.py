"""Assemble a ready-to-run speculative setup from two references: load the models (`specviz.pairs.models`),
build the drafter (`specviz.engine.drafters`) and the engine (`specviz.engine.loop`). The CLI and the UI both
start here, so a pair is built the same way everywhere."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Callable

from specviz.engine.drafters import Drafter, ModelDrafter, NgramDrafter, make_layerskip_model
from specviz.engine.learnt import Learnt
from specviz.engine.loop import SpeculativeEngine
from specviz.engine.synthetic import SyntheticDrafter
from specviz.fastpath import FastPath, cache_factory, check_compile, resolve
from specviz.hardware.roofline import ModelSpec, spec_from_config
from specviz.lessons import Said
from specviz.limits import Limits, check_prompt_ids, check_prompt_text
from specviz.pairs.models import (SHAPE_PREFIX, LoadedModel, ModelError, check_same_vocabulary, load_model,
                                  parse_draft_ref)


@dataclass(frozen=True)
class Pair:
    """Loaded weights and how to draft with them. Shared by every user of a pair, so it holds nothing
    that changes during a run: each engine gets a drafter (and its KV cache) of its own."""

    target: LoadedModel
    draft: LoadedModel | None      # None for ngram / layerskip (no separate model)
    draft_ref: str
    make_drafter: Callable[[], Drafter]
    target_spec: ModelSpec
    draft_spec: ModelSpec | None
    vocab: int
    fast: FastPath = FastPath()               # which forward path the passes run (specviz.fastpath)
    target_cache: Callable | None = None      # batch → fast-path KV cache for the target (None: eager)
    # what this pair's steps taught about its drafts' acceptance, shared by its engines (thread-safe)
    learnt: Learnt = field(default_factory=Learnt, compare=False)

    def engine(self, budget=None, eos_ids: list[int] | None = None) -> SpeculativeEngine:
        """A fresh engine with its own caches and drafter (the weights are shared, read-only). `budget`:
        adaptive verification's, kept by the caller across engines; `eos_ids`: the tokens that end a row
        (default the target's; [] for benchmarks that run every row to its token limit)."""
        t = self.target
        eos = t.eos_ids if eos_ids is None else eos_ids
        return SpeculativeEngine(t.model, self.target_spec, self.make_drafter(), eos, self.vocab,
                                 t.device, t.dtype, self.target_cache, self.fast.shown, budget, self.learnt)

    @property
    def label(self) -> str:
        return f"{self.draft_ref} → {self.target.ref}"

    def with_synthetic(self, rate: float) -> "Pair":
        """This pair's target with the synthetic draft `synthetic:rate` (the acceptance dial): the same
        weights and forward path, a free draft whose acceptance the dial sets. `rate` is checked."""
        ref = f"synthetic:{float(rate):g}"
        dref = parse_draft_ref(ref)
        width = self.vocab
        return replace(self, draft=None, draft_ref=ref, draft_spec=None, learnt=Learnt(),
                       make_drafter=lambda: SyntheticDrafter(dref.rate, width, self.target.device))

    @property
    def synthetic(self) -> float | None:
        """A synthetic draft's acceptance dial A (None for a real draft): its runs need a reference first."""
        dref = parse_draft_ref(self.draft_ref)
        return dref.rate if dref.kind == "synthetic" else None

    @property
    def tokenizer(self):
        return self.target.tokenizer


def _spec(loaded: LoadedModel, name: str) -> ModelSpec:
    bpp = 2.0 if loaded.dtype is not None and "16" in str(loaded.dtype) else 4.0
    return spec_from_config(loaded.config_dict, name=name, bytes_per_param=bpp)


def _logit_width(loaded: LoadedModel) -> int:
    return int(loaded.model.get_output_embeddings().weight.shape[0])


def load_pair(target_ref: str, draft_ref: str, device: str | None = None,
              target: LoadedModel | None = None, draft: LoadedModel | None = None,
              compile: str | None = None, dtype: str | None = None) -> Pair:
    """Load target and draft (reusing already loaded models when given) and build the drafter.
    `compile` (off / on / auto, or static for tests) picks the forward path, see specviz.fastpath;
    None reads SPECVIZ_COMPILE (what `app.py --compile` sets), default auto (as the app). `dtype`: the
    models' weights (pairs.models.DTYPES; None: auto)."""
    if compile is None:
        compile = check_compile(os.environ.get("SPECVIZ_COMPILE", "auto"), "SPECVIZ_COMPILE")
    dref = parse_draft_ref(draft_ref)
    for ref in (target_ref, dref.ref):
        # random weights accept nothing a real draft proposes: only the synthetic draft sets acceptance there
        if ref.strip().startswith(SHAPE_PREFIX) and (dref.kind != "synthetic" or "@" not in ref):
            raise ModelError(Said("errors.random_weights", ref=ref))
    target = target or load_model(target_ref, device, dtype)
    tspec = _spec(target, target_ref)
    width = _logit_width(target)
    tcache, fast = cache_factory(target.model, resolve(compile, target.device))
    if dref.kind == "ngram":
        return Pair(target, None, draft_ref, lambda: NgramDrafter(target.device), tspec, None, width, fast, tcache)
    if dref.kind == "synthetic":
        return Pair(target, None, draft_ref, lambda: SyntheticDrafter(dref.rate, width, target.device), tspec, None,
                    width, fast, tcache)
    if dref.kind == "layerskip":
        a, b = dref.skip
        try:
            view, layer_map, kept = make_layerskip_model(target.model, a, b)
        except ValueError as exc:
            raise ModelError(exc.args[0] if len(exc.args) == 1 else str(exc)) from exc      # keeps a Said
        label = f"{target_ref} without layers {a}-{b}"
        dcache, dfast = cache_factory(view, fast)
        fast = fast.joined(dfast)           # the draft's graphs are counted with the target's
        return Pair(target, None, draft_ref,
                    lambda: ModelDrafter(view, tspec, target.device, target.dtype, width, layer_map, kept, label,
                                         dcache),
                    tspec, tspec, width, fast, tcache)
    draft = draft or load_model(dref.ref, device, dtype)
    check_same_vocabulary(target, draft)
    dspec = _spec(draft, dref.ref)
    vocab = min(width, _logit_width(draft))   # Qwen2.5 sizes pad embeddings differently
    dcache, dfast = cache_factory(draft.model, fast)
    fast = fast.joined(dfast)
    return Pair(target, draft, draft_ref,
                lambda: ModelDrafter(draft.model, dspec, target.device, target.dtype, vocab, label=dref.ref,
                                     cache_factory=dcache),
                tspec, dspec, vocab, fast, tcache)


def encode_prompt(tokenizer, text: str, raw: bool = False, limits: Limits = Limits()) -> list[int]:
    """Token ids fed to the target: the chat template for instruct models, else the plain text.
    Empty, over-long or non-text prompts are refused with a sentence (`LimitError`)."""
    check_prompt_text(text, limits)
    if not raw and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
    else:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return check_prompt_ids([int(i) for i in ids], limits)
