"""Shared fixtures: tiny random Llama pairs written to disk and loaded through specviz.pairs.models."""
from __future__ import annotations

import os
import sys
from pathlib import Path

# Never let a stray hub call hang a test: fail fast instead.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# apps under test serve the eager path unless a test asks for the fast one (tests/test_fastpath.py does;
# tests/test_served_auto.py serves the default auto): a warm-up in the background takes CPU from the tests
# beside it
os.environ.setdefault("SPECVIZ_COMPILE", "off")
# measurements taken under the tests' load (peaks, layouts, auto verdicts) stay out of the cache the app
# reads; kept between runs, so the offline model is converted once
os.environ.setdefault("SPECVIZ_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "specviz-tests"))
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import build_pair  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    """No server started by the tests outlives them (a forked ZeroGPU worker once did)."""
    from apphelp import stop_all

    stop_all()


@pytest.fixture(scope="module")
def one_model_thread():
    """One model thread for a module, as the app runs on two cores (every core but one): tiny models gain
    nothing from two, and on a busy machine a second thread's spin-waits cost more than its work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory) -> dict[str, str]:
    return build_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def loaded(tiny_paths):
    """Loaded models by name, shared across tests (loading is the slow part)."""
    from specviz.pairs.models import load_model

    return {name: load_model(path, "cpu") for name, path in tiny_paths.items()}


@pytest.fixture(scope="session")
def make_pair(tiny_paths, loaded):
    from specviz.pairs.pipeline import load_pair

    def make(draft: str, compile: str = "off"):
        """compile: "off" (stock modules), "static" (fast path, eager) or "on" (fast path, compiled)."""
        if draft in ("draft", "target"):
            return load_pair(tiny_paths["target"], tiny_paths[draft], target=loaded["target"],
                             draft=loaded[draft], compile=compile)
        return load_pair(tiny_paths["target"], draft, target=loaded["target"], compile=compile)
    return make


PROMPTS = ["the quick brown", "a small draft model guesses and the", "memory", "speculative decoding spends"]


@pytest.fixture(scope="session")
def prompts(loaded):
    from specviz.pairs.pipeline import encode_prompt

    return [encode_prompt(loaded["target"].tokenizer, t, raw=True) for t in PROMPTS]


def greedy_reference(model, prompt: list[int], max_new: int, eos: int | None = None) -> list[int]:
    """The target's own greedy output for one row, no padding: the ground truth for exactness."""
    kw = {} if eos is None else {"eos_token_id": eos}
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new,
                         pad_token_id=0, temperature=None, top_p=None, top_k=None, **kw)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="session")
def reference(loaded, prompts):
    """Greedy outputs per prompt index, cached."""
    cache: dict[tuple, list[int]] = {}

    def ref(i: int, max_new: int, eos: int | None = None) -> list[int]:
        key = (i % len(prompts), max_new, eos)
        if key not in cache:
            cache[key] = greedy_reference(loaded["target"].model, prompts[key[0]], max_new, eos)
        return cache[key]
    return ref


ROWS_CAP = 4     # rows per user in the classroom app (SPECVIZ_MAX_ROWS_PER_USER)


@pytest.fixture(scope="session")
def classroom(tiny_paths, tmp_path_factory):
    """The served app (python app.py) as a class uses it: tiny pair, layer-skip draft, typed pairs
    allowed, a small per-user row cap. Yields (process, url, log path)."""
    from apphelp import start_app, stop_app

    log = tmp_path_factory.mktemp("classroom") / "app.log"
    env = {"SPECVIZ_ALLOW_CUSTOM": "1", "SPECVIZ_MAX_ROWS_PER_USER": str(ROWS_CAP)}
    proc, url = start_app(tiny_paths["target"], "layerskip:1-2", log, env)
    yield proc, url, log
    stop_app(proc)


@pytest.fixture(scope="session")
def greedy(loaded):
    """The target's own greedy output for any prompt ids (rows may come from the prompt pool)."""
    cache: dict[tuple, list[int]] = {}

    def ref(ids: list[int], max_new: int) -> list[int]:
        key = (tuple(ids), max_new)
        if key not in cache:
            cache[key] = greedy_reference(loaded["target"].model, list(ids), max_new)
        return cache[key]
    return ref
