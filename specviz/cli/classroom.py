"""`python -m specviz bench-classroom`: N users at once, one shared batch vs one engine per Run.

Both modes run in this process with the same pair, prompts and settings; only who owns the engine
differs:
- `shared`: every user submits a request to one `Scheduler` (continuous batching, as the app does now);
- `separate`: every user runs its own engine in its own thread, at most `--separate-concurrency` at a
  time (as an app without a shared scheduler serves a class: with 4, the fifth user waits).
Reported per mode: total tokens/s (all users' tokens ÷ wall time from the first submit to the last
finish), p50/p95 wait (submit → first tokens) and completion time, the largest shared batch; and the
ratio shared ÷ separate. Greedy outputs are checked identical between the modes; `outputs` holds the
shared mode's (a row per user), `prompt_ids` the users' prompts.

With `--draft synthetic:A` (specviz.cli.dial) the class's reference comes first: one untimed depth-0 class
of the same users through a shared scheduler (`serve.workload.class_reference`), reported apart in
`synthetic` (`reference_s`, and the drafters' `realigned` / `unreferenced` over both modes). Every user's
request has its own seed (its index), so both modes draw the same coins.

With `--url http://127.0.0.1:7860/` it instead loads a running app the way a class does: N Gradio API
clients press Run at once (loopback only), and it reports how many finished or heard "busy", p50/p95
wait (Run → first streamed tokens) and completion, and the largest shared batch.
"""
from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from urllib.parse import urlparse

from specviz.cli.common import add_pair_args, add_policy_args, knobs_for, policy_args
from specviz.cli.dial import Dial
from specviz.engine.request import Request
from specviz.lessons import Said
from specviz.limits import LimitError, Limits, RunArgs
from specviz.pairs.models import parse_draft_ref
from specviz.serve.door import check_count, check_run

POOL = ["Rewrite this sentence in the passive voice: the students measured the knee of the curve.",
        "Summarise in one sentence: speculative decoding drafts tokens with a small model and checks them "
        "with a big one.", "List five prime numbers.", "Explain what a KV cache is.",
        "Write the numbers from 1 to 20, separated by commas.", "Translate to French: good morning, class.",
        "Name three planets.", "def add(a, b):\n    return a + b\n# rewrite add with type hints"]


def add_parser(sub) -> None:
    p = sub.add_parser("bench-classroom", help="N concurrent users: shared batch vs one engine per Run")
    add_pair_args(p)
    p.add_argument("--users", type=int, default=16, help="users pressing Run at once, one row each")
    p.add_argument("--depth", type=int, default=4, help="each user's draft tokens per step (0 = plain decoding)")
    add_policy_args(p)                                      # each user's depth policy
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens each user's answer decodes")
    p.add_argument("--separate-concurrency", type=int, default=4,
                   help="the other mode: this many users' engines run at once, each on its own")
    p.add_argument("--repeats", type=int, default=1, help="rounds per mode, interleaved (medians reported)")
    p.add_argument("--url", default=None, help="load a running app on this machine instead (loopback only)")
    p.set_defaults(func=run)


# --url loads a running app, whose own door and queue answer each client: more clients than its shared
# batch holds is the point (some hear "busy"); this caps the threads one command starts
MAX_CLIENTS = 200
MAX_REPEATS = 20         # rounds of both modes; a median needs far fewer


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _shared(pair, prompts, user: RunArgs, refs=None, dial: Dial | None = None):
    """Every user a one-row request to one shared scheduler; `refs`: a synthetic draft's reference (each
    user's own seed, its index, keys its coins), whose drafters' counters go to `dial`."""
    # on first use: transformers is slow to import
    from specviz.serve.workload import shared_scheduler, users_at_once

    engines = []
    sched = shared_scheduler(pair, built=engines.append if dial is not None and dial.on else None)
    requests = [Request([p], knobs_for(user), user.max_new, seed=i, references=refs) for i, p in enumerate(prompts)]
    wall, runs = users_at_once(sched, requests)
    sched.close()
    for eng in engines:
        dial.count(eng.drafter)
    return wall, [(r.first_s, r.done_s, r.outputs, r.totals.shared_batch_max) for r in runs]


def _separate(pair, prompts, user: RunArgs, concurrency: int, refs=None, dial: Dial | None = None):
    slots = threading.Semaphore(concurrency)
    res = [None] * len(prompts)
    drafters = [None] * len(prompts)

    def one(i, t_submit):
        with slots:
            eng = pair.engine()
            first = None
            for _ in eng.generate([prompts[i]], knobs_for(user), user.max_new, seed=i, references=refs):
                if first is None:
                    first = time.perf_counter()
            res[i] = (first - t_submit, time.perf_counter() - t_submit, eng.outputs()[0], 1)
            drafters[i] = eng.drafter
    wall = _all_at_once(one, len(prompts))
    for d in drafters if dial is not None else ():
        dial.count(d)
    return wall, res


def _class_reference(pair, prompts, user: RunArgs, dial: Dial) -> dict | None:
    """A synthetic draft's reference: one depth-0 class of these users through a shared scheduler built as
    the shared mode's (EOS as in the run), untimed."""
    # on first use: transformers is slow to import
    from specviz.serve.workload import shared_scheduler

    if not dial.on:
        return None
    sched = shared_scheduler(pair)
    try:
        return dial.class_reference(sched, prompts, user.max_new)
    finally:
        sched.close()


def _all_at_once(user, n: int) -> float:
    """Start n users together (each gets the common start time); seconds until the last one is done."""
    t0 = time.perf_counter()
    threads = [threading.Thread(target=user, args=(i, t0)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def _summary(wall: float, res) -> dict:
    waits, done = [r[0] for r in res], [r[1] for r in res]
    tokens = sum(len(r[2]) for r in res)
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "wait_p50_s": _pct(waits, 0.5),
            "wait_p95_s": _pct(waits, 0.95), "done_p50_s": _pct(done, 0.5), "done_p95_s": _pct(done, 0.95),
            "largest_shared_batch": max(r[3] for r in res)}


def _served(args, user: RunArgs, users: int) -> dict:
    """N API clients press Run on a running app at once; per client: wait, completion, outcome."""

    # on first use: gradio_client is slow to import
    from gradio_client import Client

    try:
        probe = Client(args.url, verbose=False)
    except Exception as exc:   # noqa: BLE001 — httpx's and gradio_client's errors alike: nothing answered there
        raise LimitError(f"--url {args.url}: no SpecViz app answered there ({type(exc).__name__}: "
                         f"{str(exc).strip().splitlines()[0][:120] if str(exc).strip() else 'no reply'})") from None
    params = probe.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]["parameters"]
    label = next(p for p in params if p["parameter_name"] == "pair_label")["parameter_default"]
    barrier, res = threading.Barrier(users), [None] * users
    # the page's threshold box always holds a number; a policy without a threshold does not read it
    threshold = 8 if user.policy.threshold is None else user.policy.threshold

    def client(i):
        c = Client(args.url, verbose=False)
        barrier.wait(120)
        t0, first = time.perf_counter(), None
        try:
            job = c.submit(POOL[i % len(POOL)], label, 1, user.depth, user.policy.name, threshold, 0,
                           user.max_new, True, api_name="/generate")
            for out in job:
                if first is None and isinstance(out[0], str) and "tok-" in out[0]:
                    first = time.perf_counter() - t0
            final = job.result()[-1]          # raises the app's message if the Run was refused
            res[i] = ("done", first, time.perf_counter() - t0, final.get("shared_batch_max", 0))
        except Exception as exc:
            res[i] = ("busy" if "busy" in str(exc) else "error: " + str(exc)[:80], None, time.perf_counter() - t0, 0)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(users)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    done = [r for r in res if r and r[0] == "done"]
    waits, ends = [r[1] for r in done if r[1] is not None], [r[2] for r in done]
    return {"done": True, "url": args.url, "users": users, "finished": len(done),
            "busy": sum(1 for r in res if r and r[0] == "busy"),
            "errors": [r[0] for r in res if r and r[0] not in ("done", "busy")][:5],
            "wall_s": time.perf_counter() - t0,
            "wait_p50_s": _pct(waits, 0.5) if waits else None, "wait_p95_s": _pct(waits, 0.95) if waits else None,
            "done_p50_s": _pct(ends, 0.5) if ends else None, "done_p95_s": _pct(ends, 0.95) if ends else None,
            "largest_shared_batch": max([r[3] for r in done] + [0])}


def _checked(args) -> tuple[RunArgs, int, int, int]:
    """At the door, before any model loads: one user's request (a row each), the class size, the separate
    engines at once, the rounds."""
    if args.url and urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise LimitError(Said("errors.url_not_local"))
    if args.url and parse_draft_ref(args.draft).kind == "synthetic":
        raise LimitError(Said("errors.synthetic_url"))
    user = check_run(1, args.depth, 0.0, args.max_new_tokens, **policy_args(args))
    # in this process every user is one row of the shared batch
    users = check_count(args.users, "errors.what_users", MAX_CLIENTS if args.url else Limits().max_shared_rows)
    concurrency = check_count(args.separate_concurrency, "errors.what_concurrency", Limits().max_shared_rows)
    return user, users, concurrency, check_count(args.repeats, "errors.what_repeats", MAX_REPEATS)


def run(args) -> int:
    user, users, concurrency, repeats = _checked(args)
    if args.url:
        print(json.dumps(_served(args, user, users)), flush=True)
        return 0
    # on first use: transformers is slow to import
    from specviz.hardware.threads import own_thread
    from specviz.pairs.pipeline import encode_prompt, load_pair
    from specviz.serve.heap import freeze_long_lived

    # loaded in a thread that ends: the shared runs step in the scheduler's (hardware/threads.py)
    pair = own_thread(load_pair, args.target, args.draft, args.device)
    prompts = [encode_prompt(pair.tokenizer, POOL[i % len(POOL)]) for i in range(users)]
    dial = Dial.of(pair)
    refs = _class_reference(pair, prompts, user, dial)      # before anything is timed
    if dial.on:
        print(dial.as_dict()["note"], file=sys.stderr, flush=True)
    _separate(pair, prompts[:2], user, concurrency, refs)    # warm-up
    freeze_long_lived()                                      # as the app, once its pair is warm
    rounds = {"shared": [], "separate": []}
    outputs = {}
    for _ in range(repeats):
        for mode, fn in (("separate", lambda: _separate(pair, prompts, user, concurrency, refs, dial)),
                         ("shared", lambda: _shared(pair, prompts, user, refs, dial))):
            wall, res = fn()
            rounds[mode].append(_summary(wall, res))
            outputs[mode] = [r[2] for r in res]
            print(json.dumps({"mode": mode, **rounds[mode][-1]}), flush=True)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in rounds.items()}
    print(json.dumps({"done": True, "users": users, "depth": user.depth, "policy": user.policy.name,
                      "draft": args.draft, "max_new_tokens": user.max_new,
                      "shared": med["shared"], "separate": med["separate"],
                      "speedup": med["shared"]["tokens_per_s"] / med["separate"]["tokens_per_s"],
                      "identical": outputs["shared"] == outputs["separate"], "synthetic": dial.as_dict(),
                      "prompt_ids": prompts, "outputs": outputs["shared"]}), flush=True)
    return 0
