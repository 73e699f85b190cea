#!/usr/bin/env python3
"""The steps of scripts/gpu-check that are not a SpecViz command, each run in its own process like the others:

    python scripts/gpu_check_steps.py build --out DIR --shape NAME [--dry] [--tokenizer TOKDIR]
    python scripts/gpu_check_steps.py scheduler --target DIR --draft REF --device D --compile C [--users 8]
    python scripts/gpu_check_steps.py device

Each prints one JSON line. `build` saves a random-weight Llama with a preset's shape (tiny shapes with
--dry, plus a second one standing in for the 27B) and a tokenizer as model folders; `scheduler` sends
--users requests at once through the shared scheduler, each user reading in its own thread, and checks
every output against the target decoding its prompt alone; `device` names the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CORPUS = ["the quick brown fox jumps over the lazy dog", "speculative decoding spends more flops but finishes sooner",
          "a small draft model guesses and the big target model checks", "write the numbers from 1 to 20"] * 25


def train_tokenizer(out: Path):
    """A small byte-level BPE trained here, for runs without a tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")
    fast.save_pretrained(out)
    return fast


def build(out: Path, shape: str, dry: bool, tokenizer: str | None) -> dict:
    """The models the pair steps load: a random-weight Llama with the preset's shape (tiny shapes in a
    dry run, plus a second one standing in for the 27B) saved with a tokenizer, as a model folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from specviz.hardware.presets import MODELS

    dev = "cuda" if torch.cuda.is_available() and not dry else "cpu"
    made = {}
    preset = MODELS[shape]
    for name, dims in (("big", (64, 2, 4, 2, 16, 128)), ("huge", (96, 3, 4, 4, 24, 192))) if dry else (("big", None),):
        folder = out / name
        tok = AutoTokenizer.from_pretrained(tokenizer) if tokenizer else train_tokenizer(folder)
        if dims is None:
            dims = (preset.d_model, preset.n_layers, preset.n_heads, preset.n_kv_heads, preset.head_dim, preset.d_ff)
        vocab = preset.vocab if tokenizer or not dry else len(tok)
        cfg = LlamaConfig(vocab_size=max(vocab, len(tok)), hidden_size=dims[0], num_hidden_layers=dims[1],
                          num_attention_heads=dims[2], num_key_value_heads=dims[3], head_dim=dims[4],
                          intermediate_size=dims[5], tie_word_embeddings=True, max_position_embeddings=8192,
                          initializer_range=0.02 if not dry else 0.15, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        with torch.device(dev):
            model = LlamaForCausalLM(cfg).to(torch.bfloat16 if dev == "cuda" else torch.float32)
        model.generation_config.eos_token_id = model.generation_config.pad_token_id = tok.eos_token_id
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        made[name] = {"folder": str(folder), "params": sum(p.numel() for p in model.parameters()),
                      "tokenizer": tokenizer or "byte-level BPE trained here", "vocab": cfg.vocab_size}
        del model
    return {"models": made, "summary": ", ".join(f"{k} {v['params'] / 1e6:.1f} M" for k, v in made.items())}


def scheduler_run(a) -> int:
    """`users` requests at once through the shared scheduler, each user reading in its own thread (as the
    app's classroom does), then every output against the target decoding its prompt alone."""
    from specviz.cli.classroom import POOL
    from specviz.cli.common import graphs_of
    from specviz.engine.divergence import check_against_target
    from specviz.engine.request import Knobs, Request
    from specviz.hardware.threads import own_thread
    from specviz.pairs.pipeline import encode_prompt, load_pair
    from specviz.serve.workload import class_reference, shared_scheduler, users_at_once

    pair = own_thread(load_pair, a.target, a.draft, a.device, compile=a.compile)
    prompts = [encode_prompt(pair.tokenizer, POOL[i % len(POOL)]) for i in range(a.users)]
    sched = shared_scheduler(pair)
    try:
        # a synthetic draft's references first: one depth-0 class through the same scheduler, untimed
        refs = class_reference(sched, prompts, a.max_new_tokens)[0] if pair.synthetic is not None else None
        wall, runs = users_at_once(sched, [Request([p], Knobs(4, 1), a.max_new_tokens, seed=i, references=refs)
                                           for i, p in enumerate(prompts)])
    finally:
        sched.close()
    errors = [str(r.error) for r in runs if r.error]
    report = check_against_target(pair.target.model, pair.target.device, pair.target.eos_ids, prompts,
                                  [r.outputs for r in runs])
    tokens = sum(len(r.outputs) for r in runs)
    print(json.dumps({"users": a.users, "done": len(runs) - len(errors), "errors": errors[:4], "wall_s": wall,
                      "tokens_per_s": tokens / wall if wall else None, "path": str(pair.fast.label),
                      "shared_batch_max": max((r.totals.shared_batch_max for r in runs if r.totals), default=0),
                      "graphs": graphs_of(pair.fast),
                      "lossless": report.lossless, "divergence": report.as_dict()}), flush=True)
    return 0 if not errors and report.lossless else 1


def device_info() -> dict:
    import platform

    import torch
    import transformers

    info = {"kind": "cuda" if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "cpus": os.cpu_count()}
    from specviz.machine import cpu_model

    info["cpu"] = cpu_model()
    if info["kind"] == "cuda":
        info.update(name=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                    memory_gib=torch.cuda.get_device_properties(0).total_memory / 2**30)
        try:
            import pynvml
            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception as exc:          # the driver's version is a nicety: say why it is missing
            info["driver"] = f"unknown ({type(exc).__name__})"
    else:
        info["name"] = f"CPU: {info['cpu']}"
    return info


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check_steps.py")
    p.add_argument("what", choices=("build", "scheduler", "device"))
    p.add_argument("--out", type=Path)
    p.add_argument("--shape", default="SmolLM2-1.7B")
    p.add_argument("--dry", action="store_true")
    p.add_argument("--tokenizer")
    for name in ("--target", "--draft", "--device", "--compile"):
        p.add_argument(name)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    a = p.parse_args(argv)
    if a.what == "scheduler":
        return scheduler_run(a)
    print(json.dumps(build(a.out, a.shape, a.dry, a.tokenizer) if a.what == "build" else device_info()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
