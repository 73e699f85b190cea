"""The served app as a class uses it: many clients at once through the Gradio API, on loopback only.

Regression first: two students pressing Run at the same moment used to crash both runs (their rows
landed in one shared draft cache)."""
import threading
import time

import psutil
import pytest
from apphelp import client, pair_label, unexpected_tracebacks


def run_clients(url, calls, timeout=240):
    """Each call: (args for /generate); all submitted at once from their own clients. Returns, per call,
    ("ok", final result) or ("error", message)."""
    out = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def one(i):
        try:
            # a browser waits as long as the server takes; gradio_client's httpx gives up on one request
            # after 20 s, which 50 connections at once on two cores sometimes exceeded (the whole call
            # stays bounded by `timeout` below)
            c = client(url, timeout=120)
            start.wait(60)
            out[i] = ("ok", c.predict(*calls[i], api_name="/generate")[-1])
        except Exception as exc:        # AppError carries the sentence shown to the student
            out[i] = ("error", str(exc))
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(calls))]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, timeout - (time.time() - t0)))
    assert not any(t.is_alive() for t in threads), "a client hung past the bound"
    return out


def test_two_students_press_run_at_once(classroom, tiny_paths, greedy):
    """Both finish, both exact — with the layer-skip draft and with a small-model draft."""
    _, url, log = classroom
    label = pair_label(client(url))
    typed = f"{tiny_paths['draft']} → {tiny_paths['target']}"
    for pair in (label, typed):
        calls = [("the quick brown", pair, 2, 4, "fixed", 8, 0, 40)] * 2
        results = run_clients(url, calls)
        for kind, res in results:
            assert kind == "ok", res
            assert all(o == greedy(ids, 40) for ids, o in zip(res["prompt_ids"], res["outputs"]))
        assert max(r["shared_batch_max"] for _, r in results) == 4     # both users' rows in one step
        assert max(r["users_max"] for _, r in results) == 2
    assert not unexpected_tracebacks(log.read_text())


def test_eight_clients_share_steps_and_stay_exact(classroom, prompts, greedy):
    """Eight clients with every policy join one batch: a ninth client's long Run holds the batch open
    (depth 0, 512 tokens: one token a step, the most steps a Run can take), so each of the eight shares
    its steps with it whatever the machine's speed; every output is the target's own."""
    _, url, _ = classroom
    label = pair_label(client(url))
    texts = ["the quick brown", "a small draft model guesses and the", "memory", "speculative decoding spends"]
    policies = [("fixed", 8), ("disable-by-batch-size", 3), ("batch-table", 8), ("adaptive", 8), ("confidence", 0.05)]
    calls = [(texts[i % 4], label, 1 + i % 2, i % 6, *policies[i % 5], 0, 32) for i in range(8)]
    clients = [client(url, timeout=120) for _ in calls]          # ready before the holder starts
    holder = client(url)
    hold = holder.submit("the quick brown", label, 1, 0, "fixed", 8, 0, 512, api_name="/generate")
    next(iter(hold))                                              # the holder's row is in the batch
    jobs = [c.submit(*call, api_name="/generate") for c, call in zip(clients, calls)]
    results = [job.result(240)[-1] for job in jobs]
    holder.predict(api_name="/stop")                              # (it may have finished already)
    held = hold.result(60)[-1]
    for i, res in enumerate(results):
        assert res["prompt_ids"][0] == prompts[i % 4]
        assert all(o == greedy(ids, 32) for ids, o in zip(res["prompt_ids"], res["outputs"])), \
            f"client {i} differs from target.generate"
        assert res["users_max"] >= 2 and res["shared_batch_max"] > calls[i][2], (i, res["users_max"])
    assert held["outputs"][0] == greedy(held["prompt_ids"][0], 512)[:len(held["outputs"][0])]


def test_fifty_clients_all_finish_exact(classroom, greedy):
    """50 students at once, one row each: the shared batch holds 64 rows, so every one is served (none
    hears "busy") and each gets the target's own tokens."""
    _, url, _ = classroom
    label = pair_label(client(url))
    t0 = time.time()
    results = run_clients(url, [("the quick", label, 1, 2, "fixed", 8, 0, 8)] * 50, timeout=300)
    elapsed = time.time() - t0
    refused = [r for kind, r in results if kind != "ok"]
    assert not refused, refused[:3]
    for _, res in results:
        assert res["done"] and not res["stopped"]
        assert res["outputs"][0] == greedy(res["prompt_ids"][0], 8)
    largest = max(r["shared_batch_max"] for _, r in results)
    print(f"50 clients: all done, {elapsed:.1f} s, largest shared batch {largest}")


def _batch_rows(counters: str) -> int | None:
    import re

    m = re.search(r"tokens? per target pass \((\d+) rows? \+", counters or "")
    return int(m.group(1)) if m else None


@pytest.mark.parametrize("how", ["stop", "drop"])
def test_stop_or_dropped_connection_frees_the_rows(classroom, how, tiny_paths):
    """A's rows leave the shared batch soon after Stop or a closed connection; B goes on."""
    import subprocess
    import sys

    _, url, _ = classroom
    label = pair_label(client(url))
    # A first, streaming before B starts: then they share the batch whatever the load
    if how == "stop":
        a = client(url)
        job_a = a.submit("the quick brown", label, 3, 2, "fixed", 8, 0, 512, api_name="/generate")
        next(iter(job_a))
    else:   # a student's tab: a separate process that is killed mid-stream
        script = ("import sys; from gradio_client import Client; c = Client(sys.argv[1], verbose=False); "
                  "j = c.submit('the quick brown', sys.argv[2], 3, 2, 'fixed', 8, 0, 512, api_name='/generate')\n"
                  "for i, _ in enumerate(j):\n    print('streaming', flush=True) if i == 0 else None")
        tab = subprocess.Popen([sys.executable, "-c", script, url, label], stdout=subprocess.PIPE, text=True)
        assert tab.stdout.readline().strip() == "streaming"
    b = client(url)
    job_b = b.submit("memory", label, 1, 1, "fixed", 8, 0, 512, api_name="/generate")
    seen_shared, t_end, freed_at, final_a = False, None, None, None
    for out in job_b:
        rows = _batch_rows(out[2]) if isinstance(out[2], str) else None
        if rows == 4 and t_end is None:
            seen_shared = True
            t_end = time.time()
            if how == "stop":
                a.predict(api_name="/stop")
                final_a = job_a.result(60)[-1]
            else:
                tab.kill()
                tab.wait(10)
        if t_end is not None and rows == 1:
            freed_at = time.time()
            break
    job_b.cancel()
    assert seen_shared, "the two runs never shared the batch"
    # no clock: A's rows must have left while B (512 tokens) was still streaming, and a stopped A must
    # say so and hold fewer tokens than it asked for
    assert freed_at is not None, "the other user's rows stayed in the batch"
    if how == "stop":
        assert final_a["stopped"] and all(len(o) < 512 for o in final_a["outputs"]), final_a


def test_soak_memory_stays_flat(classroom):
    proc, url, _ = classroom
    c = client(url)
    label = pair_label(c)
    mem = psutil.Process(proc.pid)
    rss = []
    for i in range(200):
        out = c.predict("the quick brown", label, 1 + i % 3, i % 4, "fixed", 8, 0, 8, api_name="/generate")
        assert out[-1]["done"]
        if i % 20 == 19:
            rss.append(mem.memory_info().rss)
    growth = (rss[-1] - rss[1]) / rss[1]          # after a warm-up of 40 runs
    print("soak RSS MiB every 20 runs:", [round(r / 2**20) for r in rss], f"growth {growth:.1%}")
    assert growth < 0.05


def test_a_plain_run_beside_a_deep_one_is_charged_its_own_flops(classroom, tiny_paths, greedy):
    """A student decoding plainly (depth 0) beside one at depth 6 read "FLOPs 3.0× plain decoding": the
    request was charged its rows at the pass's width, which the deeper request had widened."""
    _, url, _ = classroom
    label = pair_label(client(url))
    # the deep Run is the longer, so the plain one shares its steps whatever the machine's speed
    calls = [("the quick brown", label, 1, 6, "fixed", 8, 0, 160), ("the quick brown", label, 1, 0, "fixed", 8, 0, 40)]
    (kind_deep, deep), (kind_plain, plain) = run_clients(url, calls)
    assert kind_deep == "ok" and kind_plain == "ok", (deep, plain)
    assert plain["users_max"] == 2 and plain["outputs"][0] == greedy(plain["prompt_ids"][0], 40)
    assert 0.95 <= plain["flops_ratio"] <= 1.05, plain["flops_ratio"]
    assert deep["flops_ratio"] > 1.2, deep["flops_ratio"]


def _event(users: int, rows: list[int], depth: int, batch: int, width: int, slots_drafted: int = 0, share: float = 1.0):
    """A step's event for one request: its rows' verified drafts `rows`, in a pass of `batch` rows × `width`."""
    from specviz.engine.request import RowStep, StepEvent

    steps = [RowStep(i, [0] * n, 0, [0], "correction", proposed=n) for i, n in enumerate(rows)]
    return StepEvent(step=0, batch_size=batch, depth=depth, policy="fixed", rows=steps, draft_s=0, verify_s=0,
                     overhead_s=0, wall_s=0, prefill_s=0, tokens_per_pass=batch * width, context=64,
                     draft_flops=100.0, draft_bytes=0, target_flops=10.0 * batch * width, target_bytes=0,
                     plain_flops=10.0, users=users, slots_drafted=slots_drafted, share=share)


def test_a_request_is_charged_its_own_rows_at_its_own_width():
    """Alone: the whole pass, padding of its shorter drafts included. Beside a wider request: its rows at
    1 + the most drafts one of them had verified (a depth-4 request that verified 1 draft beside one that
    verified 4 is charged 2 slots a row, not 5), and the draft work its rows proposed."""
    alone = _event(1, [4, 2], depth=4, batch=2, width=5, slots_drafted=6)
    assert alone.width == 5 and alone.target_part == 100.0 and alone.draft_part == 100.0
    short = _event(2, [1], depth=4, batch=2, width=5, slots_drafted=5, share=0.5)
    assert short.width == 2 and short.target_part == 20.0 and short.draft_part == pytest.approx(20.0)
    plain = _event(2, [0], depth=0, batch=2, width=5, slots_drafted=4, share=0.5)
    assert plain.width == 1 and plain.target_part == 10.0 and plain.draft_part == 0.0
    old = _event(2, [0], depth=0, batch=2, width=5, share=0.5)          # a recording without slots_drafted
    assert old.draft_part == 50.0
    vllm = _event(1, [0], depth=0, batch=1, width=0)                    # vLLM's events: no pass priced
    vllm.target_flops = 0.0
    assert vllm.width == 0 and vllm.target_part == 0.0
