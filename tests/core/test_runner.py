"""The local executor (runner.Threads): ordered results for any thread count, prompt and deterministic errors."""

from __future__ import annotations

import threading

import pytest

from batchtool.core.runner import Threads

DEADLINE = 60.0


@pytest.mark.parametrize("threads", [1, 2, 4, 8])
def test_results_come_out_in_input_order(threads):
    """Item 2k finishes only after item 2k+1 has (when there are threads to run both): completion order
    is the reverse of input order within each pair, and the results still come out in input order."""
    done = [threading.Event() for _ in range(51)]

    def odd_first(x: int) -> int:
        if threads > 1 and x % 2 == 0:
            assert done[x + 1].wait(DEADLINE)
        done[x].set()
        return x * x
    assert list(Threads(threads).map(odd_first, range(50))) == [x * x for x in range(50)]


def test_worker_error_stops_everything_and_is_the_first_in_order():
    seen = []

    def work(x: int) -> int:
        seen.append(x)
        if x in (7, 9):
            raise ValueError(f"bad {x}")
        return x

    with pytest.raises(ValueError, match="bad 7"):
        list(Threads(4).map(work, range(10_000)))
    assert len(seen) < 100  # stopped promptly, not after the whole input


def test_source_error_surfaces_after_the_items_before_it():
    def source():
        yield 1
        yield 2
        raise OSError("disk gone")

    out = []
    with pytest.raises(OSError, match="disk gone"):
        for item in Threads(3).map(lambda x: x, source()):
            out.append(item)
    assert out == [1, 2]


@pytest.mark.parametrize("threads", [1, 3])
def test_a_source_that_fails_to_start_is_an_error_not_a_hang(threads):
    """An iterable whose __iter__ raises (it opens a file, say) fails the map at once."""
    class Unopenable:
        def __iter__(self):
            raise OSError("cannot open the input")

    result: list[BaseException] = []

    def consume() -> None:
        try:
            list(Threads(threads).map(lambda x: x, Unopenable()))
        except OSError as exc:
            result.append(exc)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    consumer.join(DEADLINE)
    assert not consumer.is_alive(), "the map waited for a source that had already failed"
    assert [str(e) for e in result] == ["cannot open the input"]


def test_bounded_in_flight_items():
    """Backpressure: a consumer that waits holds back the source. With `window` items in flight and a
    queue of max(2, threads), the source runs exactly window + queue items ahead of what was consumed
    and then stops until the consumer takes the next one."""
    produced = []
    changed = threading.Condition()

    def source():
        for i in range(1000):
            with changed:
                produced.append(i)
                changed.notify_all()
            yield i

    window, queue_size = 4, 2
    it = Threads(2).map(lambda x: x, source(), window=window)
    for consumed in range(1, 6):
        assert next(it) == consumed - 1
        with changed:  # woken by each item the source makes (the deadline only turns a hang into a failure)
            assert changed.wait_for(lambda: len(produced) >= consumed + window + queue_size, DEADLINE)
        assert len(produced) == consumed + window + queue_size
    it.close()


def test_closing_early_stops_the_reader_at_once_and_the_workers_soon():
    before = set(threading.enumerate())
    it = Threads(4).map(lambda x: x, iter(range(10**9)))
    for _ in range(10):
        next(it)
    it.close()
    assert not [t for t in threading.enumerate() if t.name == "batchtool-reader" and t not in before]
    for thread in set(threading.enumerate()) - before:
        thread.join(DEADLINE)
        assert not thread.is_alive(), f"{thread.name} still runs"


def test_a_source_is_closed_before_the_map_returns():
    """A source's own cleanup (a spill it wrote, say) has run by the time the consumer stops, so the
    consumer's cleanup never races a reader thread still writing."""
    events = []

    def source():
        try:
            for i in range(10**9):
                yield i
        finally:
            events.append("source closed")

    it = Threads(2).map(lambda x: x, source())
    next(it)
    it.close()
    events.append("map closed")
    assert events == ["source closed", "map closed"]


def test_a_map_whose_source_maps_stops_without_waiting_for_a_worker_that_never_returns():
    """The outer map's reader consumes an inner map (a source that maps, as writing does) whose worker is stuck in
    a call that does not return: closing the outer map stops the inner one too, so neither reader waits for that
    worker (an interrupted command would otherwise never get to its cleanup), and the inner source is closed."""
    stuck, release, events = threading.Event(), threading.Event(), []

    def blocked(x: int) -> int:
        if x == 5:  # after the outer map's first window (its first result comes once that is full)
            stuck.set()
            release.wait()  # what a long native call looks like from here: released only at the test's end
        return x

    def inner():
        try:
            yield from Threads(2).map(blocked, range(10))
        finally:
            events.append("inner closed")

    it = Threads(2).map(lambda x: x, inner())
    try:
        assert next(it) == 0
        assert stuck.wait(DEADLINE)
        closing = threading.Thread(target=it.close)
        closing.start()
        closing.join(DEADLINE)  # a hang guard only: it returns at once, while the worker is still stuck
        assert not closing.is_alive() and events == ["inner closed"] and not release.is_set()
    finally:
        release.set()
