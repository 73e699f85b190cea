"""Built-in prompts: the playground's default and examples, and the pool that rows beyond the first take
their prompts from (so rows are different requests, with different acceptance, as in real serving).

The default is input-grounded — the answer copies the input — so the free n-gram draft guesses well on
any device: the first Run shows the claim (more FLOPs, yet faster). Measured on the 2-core CPU with the
offline SmolLM2-135M: see the README's "first Run" figures.
"""
from __future__ import annotations

# measured (bench-hf, offline SmolLM2-135M, 2-core CPU, B = 1, k = 6): 1.77× plain generate(), 27 tokens
DEFAULT_PROMPT = ("Repeat the following text word for word, then stop: Speculative decoding spends more FLOPs than "
                  "plain decoding, yet it finishes sooner, because one-token decode is memory-bound: every step "
                  "streams all the weights while the compute units idle.")
DEFAULT_DEPTH = 6

# prompts whose answer copies their input, the n-gram draft's good case: the lesson's and `frontier
# --prompts grounded`'s workload (kept as measured: the recorded figures used these five)
GROUNDED = [DEFAULT_PROMPT,
            "Rewrite this sentence with every word in capitals: the small draft model guesses and the big target "
            "model checks every guess in one pass.",
            "Repeat this list exactly, one item per line: apples, bananas, cherries, dates, elderberries, figs, grapes.",
            "Fix the typo and rewrite the code: def add(a, b):\n    retrun a + b",
            "Write the numbers from 1 to 40, separated by commas."]

# the Playground's examples: the first four copy their input; the count gives time to drag the sliders (the
# small offline model counts it out sensibly and at length, where "Write the numbers…" ran the digits together)
EXAMPLES = GROUNDED[:4] + ["Count from 1 to 100, separated by commas.",
                           "Explain in two sentences why the sky is blue.",
                           "Write a haiku about a lighthouse."]

ROW_POOL = ["Rewrite in the passive voice: the students measured the knee of the latency curve.",
            "Summarise in one sentence: a small draft model guesses tokens and a big target model checks them.",
            "Write the numbers from 1 to 30, separated by commas.",
            "List five prime numbers.",
            "Explain what a KV cache is, in two sentences.",
            "Translate to French: good morning, class.",
            "Copy this line exactly: memory bound decode streams every weight for every token.",
            "Name three planets and one fact about each."]
