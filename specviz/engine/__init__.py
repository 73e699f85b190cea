"""The speculative engine: the batched loop (`loop`), one user's request, the ragged KV cache, the accept
rule, drafters and depth policies. No gradio, no serving: it takes already-checked values."""
