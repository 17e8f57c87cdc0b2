"""The stage runner: ordered results for any thread count, prompt and deterministic errors."""

from __future__ import annotations

import threading
import time

import pytest

from batchtool.runner import ordered_map


@pytest.mark.parametrize("threads", [1, 2, 4, 8])
def test_results_come_out_in_input_order(threads):
    def slow_for_even(x: int) -> int:
        time.sleep(0.002 if x % 2 == 0 else 0)
        return x * x
    assert list(ordered_map(slow_for_even, range(50), threads)) == [x * x for x in range(50)]


def test_worker_error_stops_everything_and_is_the_first_in_order():
    seen = []

    def work(x: int) -> int:
        seen.append(x)
        if x in (7, 9):
            raise ValueError(f"bad {x}")
        return x

    with pytest.raises(ValueError, match="bad 7"):
        list(ordered_map(work, range(10_000), 4))
    assert len(seen) < 100  # stopped promptly, not after the whole input


def test_source_error_surfaces_after_the_items_before_it():
    def source():
        yield 1
        yield 2
        raise OSError("disk gone")

    out = []
    with pytest.raises(OSError, match="disk gone"):
        for item in ordered_map(lambda x: x, source(), 3):
            out.append(item)
    assert out == [1, 2]


def test_bounded_in_flight_items():
    """Backpressure: a slow consumer holds back the source."""
    produced = []

    def source():
        for i in range(1000):
            produced.append(i)
            yield i

    it = ordered_map(lambda x: x, source(), 2, window=4)
    next(it)
    time.sleep(0.2)
    assert len(produced) < 20
    it.close()


def test_closing_early_leaves_no_busy_threads():
    before = threading.active_count()
    it = ordered_map(lambda x: x, iter(range(10**9)), 4)
    for _ in range(10):
        next(it)
    it.close()
    time.sleep(0.5)
    assert threading.active_count() <= before + 1
