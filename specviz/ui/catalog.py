"""Which draft/target pairs the app offers, and loading them once (shared by every session)."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from specviz.models import HUB_PRESETS, OFFLINE_ALIAS, ModelError, load_tokenizer
from specviz.pipeline import Pair, load_pair


@dataclass(frozen=True)
class PairChoice:
    label: str
    target: str
    draft: str
    note: str = ""


OFFLINE_CHOICES = [
    PairChoice("SmolLM2-135M (offline) · self-speculative draft, layers 12-17 skipped", OFFLINE_ALIAS,
               "layerskip:12-17", "Offline pair: the draft is the target itself with 6 of 30 layers skipped "
               "(measured ~59 % per-token agreement)."),
    PairChoice("SmolLM2-135M (offline) · n-gram draft (prompt lookup)", OFFLINE_ALIAS, "ngram",
               "Offline pair: drafts copy what followed the same words earlier in the text."),
    PairChoice("SmolLM2-135M (offline) · itself as draft (everything accepted)", OFFLINE_ALIAS, OFFLINE_ALIAS,
               "Upper bracket: every draft is accepted, but drafting costs as much as the target."),
]


def hub_is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def _cached(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:
        return False


def available_choices(target: str | None = None, draft: str | None = None) -> list[PairChoice]:
    """Flag/env pair first, then hub presets (when the hub is reachable or they are cached), then the
    offline pairs. Offline, a hub preset is listed only if it sits in the local cache."""
    choices = []
    if target and draft:
        choices.append(PairChoice(f"{draft} → {target}", target, draft, "Pair given on the command line."))
    for label, (d, t) in HUB_PRESETS.items():
        cached = _cached(d) and _cached(t)
        if cached or not hub_is_offline():
            note = "cached locally" if cached else "downloads on first use"
            choices.append(PairChoice(f"{label} ({note})", t, d, f"Hub pair {d} → {t}."))
    return choices + OFFLINE_CHOICES


class PairCache:
    """Loads each pair once; models are shared between pairs with the same target."""

    def __init__(self, device: str | None = None):
        self.device = device
        self._lock = threading.Lock()
        self._pairs: dict[tuple[str, str], Pair] = {}

    def loaded(self, choice: PairChoice) -> bool:
        return (choice.target, choice.draft) in self._pairs

    def get(self, choice: PairChoice) -> Pair:
        key = (choice.target, choice.draft)
        with self._lock:
            if key in self._pairs:
                return self._pairs[key]
            same_target = next((p.target for (t, _), p in self._pairs.items() if t == choice.target), None)
            draft_model = next((p.target for (t, _), p in self._pairs.items() if t == choice.draft), None)
            pair = load_pair(choice.target, choice.draft, self.device, target=same_target, draft=draft_model)
            self._pairs[key] = pair
            return pair

    def preload(self, choice: PairChoice) -> threading.Thread:
        """Load the default pair in the background so the first Run starts fast."""
        def work():
            try:
                self.get(choice)
            except ModelError:
                pass      # reported when the user presses Run
        t = threading.Thread(target=work, name="specviz-preload", daemon=True)
        t.start()
        return t


@dataclass
class TokenizerOnly:
    tokenizer: object


class TokenizerCache(PairCache):
    """What a ZeroGPU main process holds per pair: the target's tokenizer, to encode prompts and decode
    tokens. The weights are loaded by the GPU worker (`specviz.ui.runner`)."""

    def get(self, choice: PairChoice) -> TokenizerOnly:
        key = (choice.target, choice.draft)
        with self._lock:
            if key not in self._pairs:
                self._pairs[key] = TokenizerOnly(load_tokenizer(choice.target))
            return self._pairs[key]
