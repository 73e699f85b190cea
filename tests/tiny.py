"""Tiny random-weight Llama models and a locally trained tokenizer, saved as ordinary model directories
so the tests load them through `specviz.pairs.models` exactly like real models."""
from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "speculative decoding spends more flops but finishes sooner",
    "a small draft model guesses and the big target model checks",
    "memory bound decode streams every weight for every token",
    "<script>alert(1)</script> <img src=x onerror=alert(2)>",
] * 20


def build_tokenizer(out: Path, vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="</s>")
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, vocab: int, layers: int, seed: int, hidden: int = 64, init: float = 0.15,
                eos: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096, initializer_range=init, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=eos, pad_token_id=eos)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    model.save_pretrained(out)
    return model


def build_pair(root: Path) -> dict[str, str]:
    """target (4 layers), draft (1 layer, other weights), and a draft with a foreign tokenizer."""
    root = Path(root)
    paths = {k: root / k for k in ("target", "draft", "foreign")}
    tok = build_tokenizer(paths["target"])
    tok.save_pretrained(paths["draft"])
    build_model(paths["target"], len(tok), layers=4, seed=0)
    build_model(paths["draft"], len(tok), layers=1, seed=1)
    ftok = build_tokenizer(paths["foreign"], vocab_size=290)
    build_model(paths["foreign"], len(ftok), layers=1, seed=2)
    return {k: str(v) for k, v in paths.items()}
