"""`python -m specviz tiny-draft`: write a tiny random-weight draft that shares the target's tokenizer.

Its guesses are (almost) never accepted, which makes it the honest lower bracket of acceptance for
benchmarks and a vivid "all red" demo; the target itself as draft is the upper bracket (all accepted)."""
from __future__ import annotations

from pathlib import Path

from specviz.pairs.models import load_model


def add_parser(sub) -> None:
    p = sub.add_parser("tiny-draft", help="write a tiny random draft with the target's tokenizer")
    p.add_argument("--target", default="smollm2-135m-offline")
    p.add_argument("--out", required=True, help="directory to write the model into")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
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
                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=tc.max_position_embeddings, tie_word_embeddings=True,
                      bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id)
    out = Path(args.out)
    LlamaForCausalLM(cfg).save_pretrained(out)
    target.tokenizer.save_pretrained(out)
    print(f"wrote a {args.layers}-layer, {args.hidden}-wide random draft to {out}")
    return 0
