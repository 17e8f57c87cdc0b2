"""The contract of `segment`: an RNN run over its batches, carrying state per lane and resetting where
sequence == 0, ends every example in the same state as running it over the whole sequence; with
--world-size N, so does each rank over its own stream (and the ranks share no example)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchtool
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import run_operation
from batchtool.ops.segment import OP as SEGMENT
from batchtool.ops.segment import SegmentOptions
from batchtool.io.output import OutputOptions

D, H = 2, 3
_W = np.random.default_rng(0).normal(size=(H, D)) * 0.8
_R = np.random.default_rng(1).normal(size=(H, H)) * 0.5
_BIAS = np.random.default_rng(2).normal(size=H) * 0.1


def step(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """h = tanh(W x + R h + b), batched over the leading axis."""
    return np.tanh(x @ _W.T + h @ _R.T + _BIAS)


def reference(x: np.ndarray, length: int, h0: np.ndarray) -> np.ndarray:
    """The final state over the first `length` steps of one whole sequence."""
    h = h0[None, :]
    for t in range(length):
        h = step(x[t][None, :], h)
    return h[0]


def run_over_batches(dst: str, batch_size: int, use_initial_state: bool, rank: int = 0,
                     world_size: int = 1) -> dict[str, np.ndarray]:
    """What a truncated-BPTT trainer does: state per lane, reset at sequence == 0, steps past `length` masked."""
    h = np.zeros((batch_size, H))
    final: dict[str, np.ndarray] = {}
    for batch in batchtool.load(dst, rank=rank, world_size=world_size):
        lanes = batch["lane"]
        state = h[lanes]
        start = batch["sequence"] == 0
        state[start] = batch["h0"][start] if use_initial_state else 0.0
        x, length = batch["x"], batch["length"]
        for t in range(x.shape[1]):
            state = np.where((t < length)[:, None], step(x[:, t], state), state)
        h[lanes] = state
        for i, (key, next_key) in enumerate(zip(batch["key"], batch["next_key"])):
            if next_key.startswith("STOP:"):
                final[key.split(":", 1)[1]] = state[i]
    return final


@st.composite
def corpora(draw: st.DrawFn) -> dict:
    num_unroll = draw(st.integers(1, 50))
    pad = draw(st.booleans())
    n = draw(st.integers(0, 12))
    if pad:
        lengths = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    else:
        lengths = [num_unroll * k for k in draw(st.lists(st.integers(1, max(1, 300 // num_unroll)),
                                                         min_size=n, max_size=n))]
    with_input_length = draw(st.booleans())
    input_lengths = [draw(st.integers(0, v)) for v in lengths] if with_input_length else None
    return {"num_unroll": num_unroll, "pad": pad, "lengths": lengths, "input_lengths": input_lengths,
            "batch_size": draw(st.integers(1, 16)), "allow_small_batch": draw(st.booleans()),
            "initial_state": draw(st.booleans()), "seed": draw(st.integers(0, 2**31)),
            "world_size": draw(st.integers(1, 4))}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=corpora())
def test_segment_batches_match_whole_sequences(tmp_path_factory, case: dict) -> None:
    tmp = tmp_path_factory.mktemp("rnn")
    gen = np.random.default_rng(case["seed"])
    lengths = case["lengths"]
    xs = [gen.normal(size=(v, D)).astype(np.float32) for v in lengths]
    h0s = [gen.normal(size=H) for _ in lengths]
    flat = np.concatenate(xs).ravel() if xs else np.zeros(0, np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = pa.table({
        "key": pa.array([f"ex{i}" for i in range(len(lengths))], pa.string()),
        "x": pa.ListArray.from_arrays(pa.array(offsets), pa.FixedSizeListArray.from_arrays(pa.array(flat), D)),
        "h0": pa.array([list(h) for h in h0s], pa.list_(pa.float64())),
        "real": pa.array(case["input_lengths"] or lengths, pa.int64()),
    })
    os.makedirs(tmp / "src")
    pq.write_table(table, tmp / "src" / "part-0.parquet", row_group_size=5)
    options = SegmentOptions(key="key", sequence=("x",), num_unroll=case["num_unroll"],
                             batch_size=case["batch_size"], pad=case["pad"],
                             input_length="real" if case["input_lengths"] else None,
                             initial_state=("h0=h0",), allow_small_batch=case["allow_small_batch"],
                             world_size=case["world_size"])
    run_operation(SEGMENT, options, str(tmp / "src"), str(tmp / "dst"), OutputOptions(),
                  RunSettings(threads=2, quiet=True))

    final: dict[str, np.ndarray] = {}
    lengths_per_rank = set()
    for rank in range(case["world_size"]):
        loader = batchtool.load(str(tmp / "dst"), rank=rank, world_size=case["world_size"])
        lengths_per_rank.add(len(loader))
        mine = run_over_batches(str(tmp / "dst"), case["batch_size"], case["initial_state"], rank, case["world_size"])
        assert not set(mine) & set(final)  # each example is played by one rank only
        final.update(mine)
    assert len(lengths_per_rank) == 1  # every rank gets the same number of batches
    assert sorted(final) == sorted(f"ex{i}" for i in range(len(lengths)))
    real = case["input_lengths"] or lengths
    for i, x in enumerate(xs):
        h0 = h0s[i] if case["initial_state"] else np.zeros(H)
        np.testing.assert_allclose(final[f"ex{i}"], reference(x, real[i], h0), rtol=0, atol=1e-6)
