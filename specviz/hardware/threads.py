"""Which thread runs the models, and why it matters on a CPU.

OpenMP (libgomp, the runtime torch and our C kernel share) gives every thread that runs a parallel
region a pool of worker threads of its own, kept while that thread lives. Once the pools' threads
outnumber the cores, libgomp stops spinning between parallel regions (its "throttled" spin), so every
region of the thread that does the work waits for its workers to be woken from sleep. A decode step runs
hundreds of regions, so the cost is large: on 2 cores a one-user decode at 2 threads runs up to a third
slower while another, idle thread keeps the pool it made for a single matrix product (never spinning,
`OMP_WAIT_POLICY=PASSIVE`, is as slow). A thread that exits gives its pool back, and the speed returns.

So work that precedes a timed run in another thread (loading a pair, the warm-up profile, a budget's
warm-up), runs in a thread of its own that then exits: `own_thread`. The shared scheduler's thread is
then the only one with a pool, as in the app, where loading and warm-up already run in threads that end.
The app's timed experiments run in a thread of their own for the same reason (`own_thread_iter`), and
the scheduler's thread ends when the class has been quiet a while (serve/scheduler.py).
"""
from __future__ import annotations

import queue
import threading


def own_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) in a new thread that exits when it returns (its OpenMP workers go with it);
    its result, or its exception raised here."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:       # handed to the caller, who decides
            out["error"] = exc
    t = threading.Thread(target=run, name="specviz-own-thread")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


_DONE = object()


def own_thread_iter(make, join_s: float = 120.0, idle_s: float | None = None):
    """Iterate the generator `make()` in a thread of its own and yield what it yields, here. A web
    server's handler threads are long-lived and many (one per request, reused), and each that ran a
    timed experiment would keep a pool of OpenMP workers beside the shared scheduler's. If the consumer
    stops early (a closed tab), the generator is closed at its next yield and its thread is waited for,
    so the caller's `finally` (giving the device back) runs only once the work has stopped. With
    `idle_s`, None is yielded whenever the generator has yielded nothing for that long."""
    items: queue.Queue = queue.Queue()
    stop = threading.Event()

    def run() -> None:
        gen = make()
        try:
            for item in gen:
                items.put(("item", item))
                if stop.is_set():
                    break
        except BaseException as exc:       # handed to the consumer
            items.put(("error", exc))
        finally:
            gen.close()
            items.put(("done", _DONE))
    t = threading.Thread(target=run, name="specviz-experiment", daemon=True)
    t.start()
    try:
        while True:
            try:
                kind, value = items.get(timeout=idle_s)
            except queue.Empty:
                yield None
                continue
            if kind == "item":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        stop.set()
        t.join(join_s)
