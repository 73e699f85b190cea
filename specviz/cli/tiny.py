"""`python -m specviz tiny-draft`: write a tiny random-weight draft that shares the target's tokenizer.

Its guesses are (almost) never accepted, which makes it the honest lower bracket of acceptance for
benchmarks and a vivid "all red" demo; the target itself as draft is the upper bracket (all accepted)."""
from __future__ import annotations

import argparse
from pathlib import Path

from specviz.cli.args import int_in, model_ref, new_folder
from specviz.pairs.models import load_model

HEADS = 4          # attention heads (2 key/value heads): a head's width is hidden / 4, and rotary halves it


def _hidden(value: str) -> int:
    n = int_in(HEADS * 2, 4096)(value)
    if n % (HEADS * 2):
        raise argparse.ArgumentTypeError(f"must be a multiple of {HEADS * 2} (4 heads of even width), not {n}")
    return n


def add_parser(sub) -> None:
    p = sub.add_parser("tiny-draft", help="write a tiny random draft with the target's tokenizer")
    p.add_argument("--target", default="smollm2-135m-offline", type=model_ref(),
                   help="the model whose tokenizer and vocabulary the draft takes")
    p.add_argument("--out", required=True, type=new_folder, help="a new or empty folder to write the model into")
    p.add_argument("--layers", type=int_in(1, 32), default=1, help="decoder layers (1-32)")
    p.add_argument("--hidden", type=_hidden, default=64, help=f"hidden width, a multiple of {HEADS * 2} up to 4096")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0, help="seed of the random weights")
    p.set_defaults(func=run)


def run(args) -> int:
    # on first use: torch is slow to import
    import torch
    # on first use: transformers is slow to import
    from transformers import LlamaConfig, LlamaForCausalLM


    target = load_model(args.target, "cpu")
    tc = target.model.config
    torch.manual_seed(args.seed)
    cfg = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=HEADS, num_key_value_heads=HEADS // 2,
                      max_position_embeddings=tc.max_position_embeddings, tie_word_embeddings=True,
                      bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id)
    out = Path(args.out)
    LlamaForCausalLM(cfg).save_pretrained(out)
    target.tokenizer.save_pretrained(out)
    print(f"wrote a {args.layers}-layer, {args.hidden}-wide random draft to {out}")
    return 0
