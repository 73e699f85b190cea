"""hardware/threads.py: work in a thread of its own that ends with it (its OpenMP pool with it), its
result or error handed back."""
import threading

import pytest

from specviz.hardware.threads import own_thread, own_thread_iter


def test_own_thread_returns_the_value_from_another_thread_and_raises_its_error():
    main = threading.get_ident()
    assert own_thread(lambda a, b=0: (a + b, threading.get_ident() != main), 2, b=3) == (5, True)
    with pytest.raises(ValueError, match="bad"):
        own_thread(lambda: (_ for _ in ()).throw(ValueError("bad")))


def test_own_thread_iter_yields_in_order_from_one_thread_that_ends():
    seen = []

    def make():
        for i in range(5):
            seen.append(threading.current_thread())
            yield i
    assert list(own_thread_iter(make)) == [0, 1, 2, 3, 4]
    assert len(set(seen)) == 1 and seen[0] is not threading.current_thread()
    seen[0].join(5)
    assert not seen[0].is_alive()


def test_own_thread_iter_raises_the_generators_error_after_what_it_yielded():
    def make():
        yield "a"
        raise RuntimeError("cell failed")
    got = []
    with pytest.raises(RuntimeError, match="cell failed"):
        for x in own_thread_iter(make):
            got.append(x)
    assert got == ["a"]


def test_closing_early_stops_the_generator_before_the_caller_goes_on():
    """A closed tab: the consumer stops; the experiment's generator is closed at its next yield, and the
    consumer's close returns only once that thread has finished (the device is given back after)."""
    closed, worker = threading.Event(), []

    def make():
        worker.append(threading.current_thread())
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()
    it = own_thread_iter(make)
    assert next(it) == 0
    it.close()
    assert closed.is_set()
    assert not worker[0].is_alive()
