"""The shared batch: many requests in one engine, each exact, each free to leave; faults stay local."""
import threading
import time
from contextlib import contextmanager

import pytest
import torch

from specviz.engine.policies import make_policy, parse_table
from specviz.engine.request import Knobs, Request, RunTotals
from specviz.limits import Limits
from specviz.serve.gate import DeviceGate
from specviz.serve.scheduler import Busy, Scheduler

MAX_NEW = 24


def make_scheduler(pair, limits=Limits(), engine_hook=None, free_memory=lambda: None, gate=None):
    def make_engine():
        eng = pair.engine()
        if engine_hook:
            engine_hook(eng)
        return eng
    return Scheduler(make_engine, limits, gate or DeviceGate(), pair.target_spec, pair.draft_spec,
                     free_memory=free_memory)


def collect(ticket):
    events, last = [], None
    for upd in ticket.updates():
        events += upd.events
        last = upd
    return events, last


def run_concurrently(sched, requests, gate=None):
    """Submit every request and consume each in its own thread. With the scheduler's `gate` given, the
    submissions happen while it is held (the batch cannot step), so they share steps whatever the load."""
    if gate is not None:
        with gate.exclusive():
            tickets = [sched.submit(r) for r in requests]
    else:
        tickets = [sched.submit(r) for r in requests]
    results = [None] * len(tickets)

    def consume(i):
        results[i] = collect(tickets[i])
    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(tickets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a consumer hung"
    return tickets, results


POLICIES = [lambda: make_policy("fixed"), lambda: make_policy("disable-by-batch-size", threshold=3),
            lambda: make_policy("batch-table", table=parse_table("1:5,4:2,8:0")), lambda: make_policy("adaptive"),
            lambda: make_policy("confidence", threshold=0.05), lambda: make_policy("adaptive-verification")]


@pytest.mark.parametrize("draft", ["layerskip:1-2", "draft", "ngram"])
def test_eight_concurrent_requests_share_steps_and_stay_exact(make_pair, prompts, reference, draft):
    gate = DeviceGate()
    sched = make_scheduler(make_pair(draft), gate=gate)
    reqs = [Request([prompts[i % 4]], Knobs(depth=i % 6, batch_size=1 + i % 2, policy=POLICIES[i % len(POLICIES)]()),
                    MAX_NEW) for i in range(8)]
    _, results = run_concurrently(sched, reqs, gate)
    shared = []
    for i, (events, last) in enumerate(results):
        assert last.final and not last.error
        for row, out in last.outputs.items():
            assert out == reference(i % 4, MAX_NEW), f"request {i} row {row} differs from target.generate"
        assert len(last.outputs) == 1 + i % 2
        shared.append(last.totals.shared_batch_max)
        assert last.totals.tokens == sum(len(o) for o in last.outputs.values())
    assert max(shared) > 2, "the requests never shared a step"
    assert max(r.totals.users_max for r in reqs) > 1
    sched.close()
    assert not sched.alive()      # close() waits for the loop: no thread left inside torch at exit


def test_policy_sees_the_shared_batch(make_pair, prompts, reference):
    """disable-by-batch-size at threshold 2: alone it speculates; among others it stops."""
    sched = make_scheduler(make_pair("layerskip:1-2"))
    reqs = [Request([prompts[i]], Knobs(depth=3, batch_size=1,
                                        policy=make_policy("disable-by-batch-size", threshold=2)), 40)
            for i in range(4)]
    _, results = run_concurrently(sched, reqs)
    depths_when_crowded = {ev.depth for events, _ in results for ev in events if ev.batch_size > 2}
    assert depths_when_crowded == {0}
    for i, (_, last) in enumerate(results):
        assert last.outputs[0] == reference(i, 40)
    sched.close()


def test_seeded_sampling_does_not_depend_on_batch_mates(make_pair, prompts):
    pair = make_pair("layerskip:1-2")
    sched = make_scheduler(pair)
    alone = Request([prompts[1]], Knobs(depth=3, batch_size=2), 20, temperature=0.9, seed=11)
    _, [(_, a)] = run_concurrently(sched, [alone])
    again = Request([prompts[1]], Knobs(depth=3, batch_size=2), 20, temperature=0.9, seed=11)
    others = [Request([prompts[i]], Knobs(depth=i, batch_size=2), 30, temperature=0.5 * (i % 2), seed=i)
              for i in range(3)]
    _, results = run_concurrently(sched, [others[0], again, *others[1:]])
    b = results[1][1]
    assert b.totals.shared_batch_max > 2
    assert a.outputs == b.outputs
    # the rows' generators live on the engine's device (a CPU generator cannot sample CUDA logits)
    assert again.device == sched.engine.device and all(r.device == sched.engine.device for r in others)
    sched.close()


def test_stop_removes_only_that_users_rows(make_pair, prompts, reference):
    sched = make_scheduler(make_pair("draft"))
    keep = Request([prompts[0]], Knobs(depth=2, batch_size=2), 60)
    leave = Request([prompts[1]], Knobs(depth=2, batch_size=3), 400)
    t_keep, t_leave = sched.submit(keep), sched.submit(leave)
    got = {}
    threading.Thread(target=lambda: got.setdefault("keep", collect(t_keep))).start()
    seen = 0
    step_stopped = None
    for upd in t_leave.updates():
        seen += len(upd.events)
        if seen >= 3 and step_stopped is None:
            step_stopped = keep.steps
            t_leave.cancel()
        if upd.final:
            assert upd.stopped
            break
    # the leaving user's rows were gone within one step of the cancel
    assert leave.done and not leave.rows
    assert keep.steps - step_stopped <= 2
    for _ in range(600):
        if "keep" in got:
            break
        time.sleep(0.1)
    events, last = got["keep"]
    assert last.final and not last.stopped
    assert all(out == reference(0, 60) for out in last.outputs.values())
    assert any(ev.batch_size == 2 for ev in events[-3:])      # alone again after the other left
    sched.close()


def test_abandoned_ticket_is_reaped(make_pair, prompts, monkeypatch):
    import specviz.serve.scheduler as s

    monkeypatch.setattr(s, "ABANDON_S", 0.5)
    sched = make_scheduler(make_pair("draft"))
    req = Request([prompts[0]], Knobs(depth=1, batch_size=2), 4000)
    sched.submit(req)                 # nobody ever reads it: a tab closed before its first update
    for _ in range(100):
        if req.done:
            break
        time.sleep(0.1)
    assert req.done and req.stopped
    sched.close()


def test_out_of_memory_ends_only_the_culprit(make_pair, prompts, reference):
    """A pass over more than 12 tokens 'runs out of memory': the big request ends with a sentence, the
    small one goes on and stays exact, and the next run works."""
    def hook(eng):
        model = eng.target

        def forward(*args, **kw):
            ids = kw.get("input_ids")
            if ids is not None and ids.shape[0] * ids.shape[1] > 12 and ids.shape[1] > 1 and ids.shape[1] < 10:
                raise torch.OutOfMemoryError("CUDA out of memory (induced by the test)")
            return model(*args, **kw)
        eng.target = forward
    gate = DeviceGate()
    sched = make_scheduler(make_pair("layerskip:1-2"), engine_hook=hook, gate=gate)
    small = Request([prompts[0]], Knobs(depth=1, batch_size=1), 60)
    t_small = sched.submit(small)
    updates = t_small.updates()
    first = next(updates)
    while not first.events:          # small has run a step: it is in the batch (no clock involved)
        first = next(updates)
    big = Request([prompts[1]], Knobs(depth=4, batch_size=3), 30)
    with gate.exclusive():           # the batch pauses: small is still running when big joins it
        assert not small.done
        t_big = sched.submit(big)
    got = {}

    def rest():
        last = first
        for upd in updates:
            last = upd
        got["small"] = last
    th = threading.Thread(target=rest)
    th.start()
    _, last_big = collect(t_big)
    th.join(60)
    assert last_big.final and "out of memory" in last_big.error and "lower the batch size" in last_big.error
    last_small = got["small"]
    assert not last_small.error and last_small.outputs[0] == reference(0, 60)
    _, again = collect(sched.submit(Request([prompts[2]], Knobs(depth=1, batch_size=1), 12)))
    assert not again.error and again.outputs[0] == reference(2, 12)
    sched.close()


def test_unexpected_exception_becomes_a_sentence_and_the_scheduler_survives(make_pair, prompts, reference):
    calls = {"n": 0}

    def hook(eng):
        model = eng.target

        def forward(*args, **kw):
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("Sizes of tensors must match")
            return model(*args, **kw)
        eng.target = forward
    sched = make_scheduler(make_pair("draft"), engine_hook=hook)
    _, last = collect(sched.submit(Request([prompts[0]], Knobs(depth=1, batch_size=1), 20)))
    assert last.final and last.error.startswith("Something went wrong") and "RuntimeError" in last.error
    _, last = collect(sched.submit(Request([prompts[0]], Knobs(depth=1, batch_size=1), 20)))
    assert not last.error and last.outputs[0] == reference(0, 20)
    sched.close()


def test_a_loop_failure_starts_its_fresh_engine_only_with_the_device(make_pair, prompts, reference):
    """A failure outside a step (admitting, reaping) rebuilds the engine and frees device memory: that
    waits for the gate, as a step does, so it cannot race a timed experiment or a graph capture."""
    gate, built = DeviceGate(), []
    sched = make_scheduler(make_pair("draft"), gate=gate, engine_hook=lambda eng: built.append(eng))
    admit, failed = sched._admit, threading.Event()

    def admit_once_wrong(pending):
        if not failed.is_set():
            failed.set()
            raise RuntimeError("admission broke")
        return admit(pending)
    sched._admit = admit_once_wrong
    with gate.exclusive():
        ticket = sched.submit(Request([prompts[0]], Knobs(depth=1, batch_size=1), 12))
        assert failed.wait(30)
        time.sleep(0.3)
        assert len(built) == 1, "the engine was rebuilt while an experiment held the device"
    _, last = collect(ticket)
    assert len(built) == 2
    assert not last.error and last.outputs[0] == reference(0, 12)
    sched.close()


def test_a_loop_failure_ends_running_requests_at_once_and_hears_closing(make_pair, prompts):
    """While an experiment holds the device, a failure outside a step ends what runs at once (not when the
    experiment lets go), and the loop waiting to rebuild its engine still hears the scheduler close."""
    gate, built = DeviceGate(), []
    sched = make_scheduler(make_pair("draft"), gate=gate, engine_hook=lambda eng: built.append(eng))
    updates = sched.submit(Request([prompts[0]], Knobs(depth=1, batch_size=1), 2000)).updates()
    next(u for u in updates if u.events)                  # it runs
    end, failed = sched._end_stopped, threading.Event()

    def end_once_wrong():
        if not failed.is_set():
            failed.set()
            raise RuntimeError("idle broke")
        return end()
    sched._end_stopped = end_once_wrong
    with gate.exclusive():
        box, drained = {}, threading.Event()

        def drain():
            for upd in updates:
                box["last"] = upd
            drained.set()
        threading.Thread(target=drain, daemon=True).start()
        assert drained.wait(30), "the running request waited for the experiment to end"
        last = box["last"]
        assert last.final and last.error.startswith("Something went wrong") and failed.is_set()
        assert len(built) == 1                            # the new engine waits for the device
        thread, t0 = sched._thread, time.monotonic()
        sched.close(timeout=30)
        assert not thread.is_alive() and time.monotonic() - t0 < 10 and len(built) == 1


def test_full_batch_queues_with_positions_then_busy(make_pair, prompts, reference):
    limits = Limits(max_rows_per_user=2, max_shared_rows=2, max_queue=2)
    sched = make_scheduler(make_pair("draft"), limits)
    first = sched.submit(Request([prompts[0]], Knobs(depth=1, batch_size=2), 60))
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("first", collect(first)))
    th.start()
    for _ in range(200):
        if sched.info().rows == 2:
            break
        time.sleep(0.01)
    waiting = [sched.submit(Request([prompts[i]], Knobs(depth=1, batch_size=1), 8)) for i in (1, 2)]
    with pytest.raises(Busy, match="try again in about"):
        sched.submit(Request([prompts[3]], Knobs(depth=1, batch_size=1), 8))
    positions = []
    for upd in waiting[1].updates():
        if upd.position:
            positions.append(upd.position)
        if upd.final:
            assert upd.outputs[0] == reference(2, 8)
    assert positions and positions[0] >= 1
    th.join(60)
    assert got["first"][1].outputs[0] == reference(0, 60)
    sched.close()


def test_submit_all_admits_the_class_in_one_wave_or_refuses_it_whole(make_pair, prompts, reference):
    """A class handed over in one call (`users_at_once(..., together=True)`, the frontier's workload) is
    admitted at one step: its rows share every step from the first, and each is exact. A class the queue
    has no room for is refused whole, and the batch serves on."""
    from specviz.serve.workload import users_at_once
    waves = []

    def hook(eng):
        add = eng.add

        def counted(req):
            waves.append(eng.steps_run)
            add(req)
        eng.add = counted
    sched = make_scheduler(make_pair("ngram"), Limits(max_rows_per_user=1, max_shared_rows=6, max_queue=2),
                           engine_hook=hook)
    reqs = [Request([prompts[i % 4]], Knobs(depth=2, batch_size=1, policy=make_policy("adaptive-verification")),
                    12) for i in range(6)]
    _, runs = users_at_once(sched, reqs, together=True)
    assert len(waves) == 6 and len(set(waves)) == 1, f"admitted at steps {waves}"
    for i, run in enumerate(runs):
        assert not run.error and run.outputs == reference(i % 4, 12)
    assert all(r.totals.shared_batch_max == 6 for r in reqs)
    too_many = [Request([prompts[0]], Knobs(depth=1, batch_size=1), 4) for _ in range(9)]
    with pytest.raises(Busy):
        sched.submit_all(too_many)
    assert not sched._pending, "a refused class left requests behind"
    _, last = collect(sched.submit(Request([prompts[1]], Knobs(depth=1, batch_size=1), 6)))
    assert not last.error and last.outputs[0] == reference(1, 6)
    sched.close()


def test_memory_guard_refuses_what_cannot_fit(make_pair, prompts):
    sched = make_scheduler(make_pair("draft"), free_memory=lambda: 1000.0)
    _, last = collect(sched.submit(Request([prompts[0]], Knobs(depth=4, batch_size=8), 100)))
    assert last.final and "not enough memory" in last.error and "lower the batch size" in last.error
    sched.close()


def test_device_gate_is_exclusive_and_ordered():
    gate = DeviceGate()
    order = []
    a, b = gate.enqueue(), gate.enqueue()
    assert (a.position(), b.position()) == (1, 2)
    assert a.acquire(0.1) and not b.acquire(0.05)
    assert (a.position(), b.position()) == (0, 1)      # a holds the device; b is next

    def stepper():
        with gate.step():
            order.append("step")
    th = threading.Thread(target=stepper)
    th.start()
    _until_stepping(gate)
    assert order == []                 # steps wait while an exclusive user holds or waits
    a.release()
    assert b.acquire(5.0)              # the step's turn came first; b once the class went quiet
    order.append("b")
    b.release()
    th.join(2)
    assert order == ["step", "b"]


def _until_stepping(gate, deadline_s: float = 10.0):
    """Until a step waits at the gate (a thread just started may not have reached it yet)."""
    deadline = time.monotonic() + deadline_s
    while gate._stepping == 0:
        assert time.monotonic() < deadline, "no step reached the gate"
        time.sleep(0.005)


def _steps_forever(gate, stop, steps):
    while not stop.is_set():
        with gate.step():
            steps.append(time.monotonic())
            time.sleep(0.01)


def test_the_class_gets_a_turn_between_experiments_back_to_back():
    """Two students pressing timed experiments back to back no longer pause a Run for good: after each
    experiment the waiting steps run (their turn) before the next experiment takes the device, and no
    step ever runs while one holds it."""
    gate, stop, steps, held = DeviceGate(turn_s=0.2), threading.Event(), [], []

    def student():
        while not stop.is_set():
            with gate.exclusive():
                t0 = time.monotonic()
                time.sleep(0.05)
                held.append((t0, time.monotonic()))
    threads = [threading.Thread(target=student) for _ in range(2)] + \
        [threading.Thread(target=_steps_forever, args=(gate, stop, steps))]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 20
    while (len(held) < 6 or len(steps) < 6) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for th in threads:
        th.join(5)
    assert len(held) >= 6 and len(steps) >= 6, (len(held), len(steps))
    assert not any(a <= t <= b for a, b in held for t in steps)        # nothing ran beside a measurement
    between = [any(end <= t <= start for t in steps) for (_, end), (start, _) in zip(held, held[1:])]
    assert sum(between) >= len(between) // 2, between    # steps ran between most pairs of experiments


def test_the_class_turn_ends_when_it_goes_quiet_or_runs_out():
    """The turn costs a measurement little: it ends once no step waits (the class had nothing left), and
    at `turn_s` however busy the class stays."""
    gate = DeviceGate(turn_s=30.0, quiet_s=0.05)
    a, b = gate.enqueue(), gate.enqueue()
    assert a.acquire(1.0)
    stepped = []
    one_step = threading.Thread(target=_one_step, args=(gate, stepped))
    one_step.start()
    _until_stepping(gate)
    a.release()
    assert b.acquire(5.0)                    # within 5 s of a 30 s turn: it ended once the class went quiet
    assert stepped == [True]                 # the waiting step had its turn first
    b.release()
    one_step.join(5)

    busy = DeviceGate(turn_s=0.3)
    stop, steps = threading.Event(), []
    c, d = busy.enqueue(), busy.enqueue()
    assert c.acquire(1.0)
    th = threading.Thread(target=_steps_forever, args=(busy, stop, steps))
    th.start()
    _until_stepping(busy)
    c.release()
    try:
        assert d.acquire(10.0)                                     # the turn ran out although steps kept coming
        n = len(steps)
        time.sleep(0.1)
        assert n > 0 and len(steps) == n                            # steps ran in the turn, none while d holds
    finally:
        d.release()
        stop.set()
        th.join(5)


def _one_step(gate, stepped):
    with gate.step():
        stepped.append(True)


def test_timed_experiment_waits_with_a_position_and_pauses_the_batch(make_pair, prompts):
    """The knee (any timed experiment) queues for the device, shows its place, then runs with the
    shared batch paused: no step of the batch overlaps the measurement."""
    from specviz.serve.runner import Waiting, exclusively

    gate = DeviceGate()
    sched = make_scheduler(make_pair("draft"), gate=gate)
    req = Request([prompts[0]], Knobs(depth=1, batch_size=1), 4000)
    ticket = sched.submit(req)
    threading.Thread(target=lambda: collect(ticket), daemon=True).start()
    first = gate.enqueue()
    assert first.acquire(5)                    # someone else is measuring
    spans = []

    def experiment():
        steps_before = req.steps
        t0 = time.perf_counter()
        time.sleep(0.3)
        spans.append((steps_before, req.steps, time.perf_counter() - t0))
        yield "measured"
    it = exclusively(gate, experiment)
    assert next(it) == Waiting(1)
    first.release()
    assert list(it) == ["measured"]
    before, after, _ = spans[0]
    assert after == before                     # the batch did not step while we measured
    for _ in range(50):                        # and it resumes afterwards
        if req.steps > after:
            break
        time.sleep(0.05)
    assert req.steps > after
    ticket.cancel()
    sched.close()


def test_a_quiet_scheduler_ends_its_thread_and_the_next_request_keeps_its_engine(make_pair, prompts, reference,
                                                                                 monkeypatch):
    """After the class goes quiet the loop's thread ends (its OpenMP workers with it: hardware/threads.py);
    the next request starts a new thread that serves the same engine (an adaptive budget's tables kept)."""
    import specviz.serve.scheduler as S
    monkeypatch.setattr(S, "IDLE_S", 0.2)
    built = []
    sched = make_scheduler(make_pair("ngram"), engine_hook=built.append)
    _, [(_, last)] = run_concurrently(sched, [Request([prompts[0]], Knobs(depth=3, batch_size=1), MAX_NEW)])
    assert last.final and not last.error
    first = sched._thread
    deadline = time.monotonic() + 20
    while sched.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sched.alive(), "the quiet scheduler kept its thread"
    _, [(_, again)] = run_concurrently(sched, [Request([prompts[1]], Knobs(depth=2, batch_size=1), MAX_NEW)])
    assert not again.error and again.outputs[0] == reference(1, MAX_NEW)
    assert sched._thread is not first and len(built) == 1 and sched.engine is built[0]
    sched.close()


def _kv_buffers(eng) -> list[torch.Tensor]:
    """The KV tensors an engine holds: its target cache's and its draft model's (static path buffers,
    or the stock path's per-layer keys and values)."""
    out = []
    for cache in (eng.target_kv, getattr(eng.drafter, "draft_kv", None)):
        if cache is None:
            continue
        out += list(getattr(cache, "kbufs", [])) + list(getattr(cache, "vbufs", []))
        if hasattr(cache, "_layers"):
            out += [t for layer in cache._layers() for t in (layer.keys, layer.values)]
    return out


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_an_idle_batch_gives_its_kv_caches_back(make_pair, prompts, reference, monkeypatch):
    """Between batches the engine keeps its grown KV buffers (the next batch reuses them instead of
    faulting fresh pages in); after IDLE_S of quiet it gives them back: the engine then holds only the
    caches a new engine starts with, the buffers of the run are freed (nothing else keeps them alive),
    and the next request is still the target's own."""
    import gc
    import weakref

    import specviz.serve.scheduler as S

    monkeypatch.setattr(S, "IDLE_S", 0.3)
    pair = make_pair("draft", compile="static")       # both caches static: buffers outlive their rows
    fresh = _nbytes(_kv_buffers(pair.engine()))
    held: dict[str, object] = {}

    def watch(eng):
        step = eng.step

        def watched(*args, **kwargs):
            out = step(*args, **kwargs)
            bufs = _kv_buffers(eng)
            held["bytes"] = max(held.get("bytes", 0), _nbytes(bufs))
            held["refs"] = [weakref.ref(b) for b in bufs]        # the last step's buffers
            return out
        eng.step = watched
    sched = make_scheduler(pair, engine_hook=watch)
    _, [(_, last)] = run_concurrently(sched, [Request([prompts[0]], Knobs(depth=3, batch_size=8), MAX_NEW)])
    assert last.final and not last.error and len(last.outputs) == 8
    assert held["bytes"] > 4 * fresh, (held["bytes"], fresh)        # 8 rows grew both caches
    deadline = time.monotonic() + 30                                 # a hang guard, not a timing
    while sched.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sched.alive(), "the quiet scheduler kept its thread"
    gc.collect()
    after = _nbytes(_kv_buffers(sched.engine))
    assert after == fresh, f"the idle engine holds {after} bytes of KV caches, a new one {fresh}"
    assert all(ref() is None for ref in held["refs"]), "the run's KV buffers are still alive"
    _, [(_, again)] = run_concurrently(sched, [Request([prompts[1]], Knobs(depth=2, batch_size=1), MAX_NEW)])
    assert not again.error and again.outputs[0] == reference(1, MAX_NEW)
    sched.close()


@contextmanager
def _paused_with_one_queued(make_pair, prompts, release_after_s: float):
    """A one-row shared batch: a long request running, a short one waiting for room (its place said),
    then a timed experiment holding the device. Yields (long, its updates, queued, its updates, timer):
    starting `timer` lets the device go after `release_after_s`; the end lets it go in any case."""
    gate = DeviceGate()
    sched = make_scheduler(make_pair("draft"), Limits(max_rows_per_user=1, max_shared_rows=1, max_queue=2), gate=gate)
    held = timer = None
    try:
        long = sched.submit(Request([prompts[0]], Knobs(depth=2, batch_size=1), 512))
        queued = sched.submit(Request([prompts[1]], Knobs(depth=2, batch_size=1), 6))
        running, waiting = long.updates(), queued.updates()
        assert next(waiting).position == 1
        held = gate.enqueue()                    # (only now: queued, it would hold the first step back)
        timer = threading.Timer(release_after_s, held.release)
        assert held.acquire(10.0)                # after the running request's current step
        yield long, running, queued, waiting, timer
    finally:
        if held is not None:
            timer.cancel()
            held.release()
        sched.close()


def test_a_request_waiting_for_room_keeps_its_queue_line_during_a_pause(make_pair, prompts):
    """While a timed experiment holds the device, the running request hears why; one waiting for room in
    the batch keeps its place in the queue on the page (no pause line replaces it)."""
    with _paused_with_one_queued(make_pair, prompts, 2.0) as (long, running, _, waiting, timer):
        while not next(running).device_wait:
            pass
        timer.start()
        long.cancel()                            # (it was long only to be running at the pause)
        after = next(waiting)                    # the next thing it hears comes once the experiment ends
        assert after.device_wait == 0, after
        rest = list(running)
        assert rest and rest[-1].final and rest[-1].stopped, rest
        assert ([after] + list(waiting))[-1].final


def test_a_stop_during_a_pause_ends_the_request_while_the_device_is_held(make_pair, prompts):
    """Stop pressed while a timed experiment holds the device: the request ends stopped at once, with its
    tokens so far (a lesson chapter may hold the device for a minute); its rows leave the batch at the
    next step, and the scheduler goes on serving once the device is back."""
    gate = DeviceGate()
    sched = make_scheduler(make_pair("draft"), gate=gate)
    ticket, other = sched.submit_all([Request([prompts[0]], Knobs(depth=2, batch_size=1), 512),
                                      Request([prompts[1]], Knobs(depth=2, batch_size=1), 512)])
    it = ticket.updates()
    while not next(it).events:                   # a step ran: the request has tokens to keep
        pass
    held = gate.enqueue()
    timer = threading.Timer(10.0, held.release)   # unheard, the Stop would wait for the device
    try:
        assert held.acquire(10.0)                # after the request's current step
        ticket.cancel()
        timer.start()
        rest = [u for u in it if not u.device_wait]
        assert held.held                         # the experiment still has the device
    finally:
        timer.cancel()
        held.release()
    end = rest[-1]
    assert end.final and end.stopped and not end.error
    assert 0 < len(end.outputs[0]) < 512 and end.totals.tokens == len(end.outputs[0])
    after = sched.submit(Request([prompts[1]], Knobs(depth=2, batch_size=1), 6))
    joined = list(after.updates())[-1]
    # beside the other student's row only: the stopped request's row left at the first step after the pause
    assert joined.outputs and joined.totals.shared_batch_max == 2
    theirs = list(other.updates())[-1]           # another student's Run was not stopped: it goes on to its end
    assert theirs.final and not theirs.stopped and not theirs.error
    assert theirs.totals.tokens == sum(map(len, theirs.outputs.values())) > 0
    sched.close()


def test_a_queued_request_stopped_during_a_pause_ends_at_once(make_pair, prompts):
    """A request waiting for room is stopped while a timed experiment holds the device: it ends stopped at
    once, not once the device is back and the queue moves."""
    with _paused_with_one_queued(make_pair, prompts, 5.0) as (long, running, queued, waiting, timer):
        queued.cancel()
        timer.start()                            # unheard, the Stop would wait for the device
        rest = list(waiting)
        assert rest[-1].final and rest[-1].stopped
        assert long.scheduler.gate.measurements() == 1       # the experiment still has the device
        long.cancel()
        assert list(running)[-1].final


def test_a_paused_request_is_told_why(make_pair, prompts):
    """While a timed experiment holds the device, a request's consumer hears why no tokens come (the
    number of experiments holding or waiting), once; its tokens follow when the experiment ends."""
    gate = DeviceGate()
    sched = make_scheduler(make_pair("draft"), gate=gate)
    with gate.exclusive():
        ticket = sched.submit(Request([prompts[0]], Knobs(depth=2, batch_size=1), 6))
        it = ticket.updates()
        first = next(it)
        while first.position is not None:
            first = next(it)
        assert first.device_wait == 1 and not first.events
        info = sched.info()
        assert (info.rows, info.users, info.waiting) == (1, 1, 0)     # "Batch now" counts it while it waits
    rest = list(it)
    assert rest[-1].final and rest[-1].outputs and not rest[-1].error
    assert all(u.device_wait == 0 for u in rest)
    sched.close()


def test_a_synthetic_run_paused_in_its_reference_shows_the_reference_again_after():
    """A synthetic Run decodes its reference with nothing to show but a line: paused meanwhile, the page
    says why, and once the measurement ends the reference's line comes back (no tokens would bring it)."""
    from specviz.serve.gate import Pauses
    from specviz.serve.runner import LocalRunner, Packet

    gate, ref = DeviceGate(), Packet([], RunTotals(), referencing=True)
    held = gate.enqueue()

    def packets():
        yield ref
        assert held.acquire(5.0)
        yield None                  # nothing for a while: a measurement holds the device
        held.release()
        yield None                  # still nothing: the measurement is over, the reference goes on
        yield None                  # (said once)
    out = list(LocalRunner._said_paused(packets(), Pauses(gate)))
    assert [p.device_wait for p in out] == [0, 1, 0] and out[2] is ref
