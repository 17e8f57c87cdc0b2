"""Tally: statistics merged in input order; Counters add in place as Counter's + would."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from batchtool.core.tally import Tally

counters = st.builds(Counter, st.dictionaries(st.integers(0, 20), st.integers(1, 5), max_size=12))


@given(st.lists(counters, max_size=8))
def test_merged_counters_equal_counter_addition_and_leave_the_chunks_alone(chunks):
    originals = [Counter(c) for c in chunks]
    total = Tally()
    for chunk in chunks:
        total.merge(Tally.of(labels=chunk, rows=np.int64(len(chunk))))
    expected = Counter()
    for chunk in originals:
        expected = expected + chunk
    assert total.counts.get("labels", Counter()) == expected
    assert chunks == originals  # a chunk's own Counter is never the running total
    assert total.count("rows") == sum(len(c) for c in originals)
