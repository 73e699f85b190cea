"""A stand-in for Hugging Face's `spaces` package on a ZeroGPU Space, for tests on a machine without one.

It keeps the behaviour SpecViz depends on, read from `spaces` 0.51 (spaces/zero/wrappers.py) and the
ZeroGPU documentation (models placed on `cuda` at start-up in the main process; a fork inherits them): a
`@GPU(duration=...)` generator function runs in a *forked* worker process that is reused between calls;
arguments go in and every yielded value comes back through pickling queues; closing the caller's
generator sets a stop event that the worker checks after each value; a `gradio.Error` raised in the
worker reaches the caller as itself, any other exception as a generic "ZeroGPU worker error".
The worker has no GPU here, so the code inside runs on the CPU.
"""
import multiprocessing
import pickle
import traceback

import gradio as gr

durations: list = []            # what each call asked for (seconds), for the tests to check
# The real package emulates `cuda` in the main process, so an app places its weights there at start-up
# and each forked worker starts with them on the GPU. This double has no GPU: the app places them here.
EMULATED_DEVICE = "cpu"
_ctx = multiprocessing.get_context("fork")


def GPU(task=None, *, duration=None, size=None):
    if task is None:
        return lambda fn: _wrap(fn, duration)
    return _wrap(task, duration)


def _worker_loop(task, args_q, res_q, stop):
    while True:
        args, kwargs = pickle.loads(args_q.get())
        stop.clear()
        try:
            for value in task(*args, **kwargs):
                if stop.is_set():
                    break
                res_q.put(pickle.dumps(("ok", value)))
        except gr.Error as exc:
            res_q.put(pickle.dumps(("gradio-error", exc)))
        except Exception as exc:   # the real package hides the message from the browser
            traceback.print_exc()
            res_q.put(pickle.dumps(("error", type(exc).__name__)))
        res_q.put(pickle.dumps(("end", None)))


def _wrap(task, duration):
    worker = {}

    def handler(*args, **kwargs):
        durations.append(duration(*args, **kwargs) if callable(duration) else duration)
        if "proc" not in worker or not worker["proc"].is_alive():
            args_q, res_q, stop = _ctx.Queue(), _ctx.Queue(), _ctx.Event()
            proc = _ctx.Process(target=_worker_loop, args=(task, args_q, res_q, stop), daemon=True)
            proc.start()
            worker.update(proc=proc, args=args_q, res=res_q, stop=stop)
        worker["args"].put(pickle.dumps((args, kwargs)))
        ended = False
        try:
            while True:
                kind, value = pickle.loads(worker["res"].get(timeout=300))
                if kind == "end":
                    ended = True
                    return
                if kind == "gradio-error":
                    _drain(worker)
                    ended = True
                    raise value
                if kind == "error":
                    _drain(worker)
                    ended = True
                    raise gr.Error(f"ZeroGPU worker error: {value}")
                yield value
        finally:
            if not ended:
                worker["stop"].set()
                _drain(worker)

    return handler


def _drain(worker):
    """Read up to the worker's end marker so the next call starts on an empty queue."""
    while True:
        kind, _ = pickle.loads(worker["res"].get(timeout=300))
        if kind == "end":
            return
