"""batchtool.load in a training job: seeded epochs, equal disjoint rank streams, exact O(1) resume."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import data_bytes
from load_outputs import BUCKET_BATCHES, bucket_output, segment_output

import batchtool
from memlimit import HANG_GUARD
from batchtool.core.errors import UsageError
from batchtool.loader.load import epoch_order, rank_positions

order_mod = importlib.import_module("batchtool.loader.order")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("outputs"))


def ids(loader) -> list[int]:
    """The output batch numbers a loader yields, in order (every batch's rows share one `batch` value)."""
    out = []
    for batch in loader:
        assert len(set(batch["batch"].tolist())) == 1
        out.append(int(batch["batch"][0]))
    return out


def in_another_process(code: str) -> object:
    """Run `code` (which prints JSON) in a fresh interpreter with this worktree's batchtool."""
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --- the order of an epoch, as pure functions ----------------------------------------------------------------

def test_epoch_order_is_a_seeded_permutation_per_epoch():
    counts = [8, 0, 8, 4]
    order, _ = epoch_order(counts, seed=3, epoch=0, shuffle=True)
    assert sorted(order.tolist()) == list(range(20))
    again, _ = epoch_order(counts, seed=3, epoch=0, shuffle=True)
    assert again.tolist() == order.tolist()
    orders = {tuple(epoch_order(counts, seed=3, epoch=e, shuffle=True)[0].tolist()) for e in range(10)}
    assert len(orders) == 10
    assert epoch_order(counts, seed=4, epoch=0, shuffle=True)[0].tolist() != order.tolist()
    assert epoch_order(counts, seed=3, epoch=0, shuffle=False)[0].tolist() == list(range(20))


def test_shuffled_epochs_visit_files_block_by_block(monkeypatch):
    """A block of consecutive files (in a permuted file order) is finished before the next starts, so a
    reader needs the footers of one block at a time; within a block the batches are mixed."""
    monkeypatch.setattr(order_mod, "SHUFFLE_BLOCK_BATCHES", 12)
    counts = [6, 6, 6, 6, 6, 6]
    file_of = np.repeat(np.arange(6), 6)
    for epoch in range(5):
        order, blocks = epoch_order(counts, seed=0, epoch=epoch, shuffle=True)
        assert (np.diff(blocks) >= 0).all() and blocks[-1] == 2
        for b in range(3):
            files = set(file_of[order[blocks == b]].tolist())
            assert len(files) == 2  # the files starting in each stretch of 12 batches
            assert len(set(file_of[order[blocks == b]][:6].tolist())) == 2  # interleaved, not file after file


@settings(max_examples=200, deadline=None)
@given(batches=st.integers(0, 60), world_size=st.integers(1, 5), drop_uneven=st.booleans())
def test_rank_parts_are_equal_disjoint_and_cover_the_epoch(batches, world_size, drop_uneven):
    parts = [rank_positions(batches, r, world_size, drop_uneven) for r in range(world_size)]
    assert len({len(p) for p in parts}) == 1
    seen = np.stack(parts, axis=1).ravel()  # step by step, rank by rank
    if drop_uneven:
        assert seen.tolist() == list(range(batches - batches % world_size))  # a prefix: only the end is dropped
    else:
        assert seen.tolist() == [p % batches for p in range(-(-batches // world_size) * world_size)]  # then its start


# --- epochs ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_every_batch_once_per_epoch_and_epochs_differ(root, fmt):
    loader = batchtool.load(bucket_output(root, fmt), seed=5)
    assert loader.shuffle and len(loader) == BUCKET_BATCHES
    epochs = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        epochs.append(ids(loader))
        assert sorted(epochs[-1]) == list(range(BUCKET_BATCHES))
        assert epochs[-1] == loader.epoch_batches().tolist()
    assert len({tuple(e) for e in epochs}) == 3
    assert ids(batchtool.load(bucket_output(root, fmt), shuffle=False)) == list(range(BUCKET_BATCHES))


def test_same_seed_and_epoch_same_order_in_another_process(root):
    dst = bucket_output(root)
    loader = batchtool.load(dst, seed=9)
    loader.set_epoch(4)
    theirs = in_another_process(
        "import json, batchtool\n"
        f"loader = batchtool.load({dst!r}, seed=9)\n"
        "loader.set_epoch(4)\n"
        "print(json.dumps([int(b['batch'][0]) for b in loader]))\n")
    assert theirs == ids(loader)


def test_segment_output_is_never_shuffled(root):
    dst = segment_output(root)
    loader = batchtool.load(dst)
    assert not loader.shuffle
    first = ids(loader)
    loader.set_epoch(1)
    assert ids(loader) == first == list(range(len(loader)))
    with pytest.raises(UsageError, match=r"shuffle=True: .* segment output, whose batches continue each other's lanes"):
        batchtool.load(dst, shuffle=True)


def test_bucket_sorted_order_is_kept_by_default(root):
    assert not batchtool.load(bucket_output(root, order="sorted")).shuffle


# --- ranks -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("drop_uneven", [True, False])
def test_ranks_get_equal_disjoint_parts_of_the_epoch(root, fmt, world_size, drop_uneven):
    dst = bucket_output(root, fmt)
    loaders = [batchtool.load(dst, rank=r, world_size=world_size, drop_uneven=drop_uneven, seed=2)
               for r in range(world_size)]
    for loader in loaders:
        loader.set_epoch(1)
    parts = [ids(loader) for loader in loaders]
    assert {len(p) for p in parts} == {len(loaders[0])}
    seen = [b for step in zip(*parts) for b in step]  # what the ranks read together, step by step
    whole = batchtool.load(dst, seed=2)
    whole.set_epoch(1)
    epoch = ids(whole)
    extra = -BUCKET_BATCHES % world_size
    if drop_uneven:
        assert len(loaders[0]) == BUCKET_BATCHES // world_size
        assert seen == epoch[:len(seen)] and len(set(seen)) == len(seen)  # the last BUCKET_BATCHES % N dropped
    else:
        assert len(loaders[0]) == -(-BUCKET_BATCHES // world_size)
        assert seen == epoch + epoch[:extra]  # the epoch, then its first batches again to fill the last rank


def test_segment_ranks_read_their_own_lane_streams(root):
    dst = segment_output(root, world_size=2)
    manifest = batchtool.load(dst, world_size=2).manifest
    parts = [ids(batchtool.load(dst, rank=r, world_size=2)) for r in range(2)]
    assert len(parts[0]) == len(parts[1]) == manifest["stats"]["batches_per_rank"]
    assert parts[0] == list(range(0, manifest["output"]["batches"], 2))
    assert parts[1] == list(range(1, manifest["output"]["batches"], 2))
    with pytest.raises(UsageError, match=r"world_size=3: .* with 2 lane streams .*; load it with world_size=2"):
        batchtool.load(dst, world_size=3)
    with pytest.raises(UsageError, match=r"world_size=2: .* 1 lane stream .*; write it with `segment --world-size N`"):
        batchtool.load(segment_output(root), world_size=2)


def test_segment_world_size_from_the_cli_and_a_pipeline(tmp_path, parquet_src, run_cli):
    flags = ("--key", "key", "--sequence", "tokens", "--num-unroll", "8", "--batch-size", "4", "-q")
    assert run_cli("segment", parquet_src, tmp_path / "cli", *flags, "--world-size", "3").exit_code == 0
    (tmp_path / "p.toml").write_text(
        f'[input]\npath = "{parquet_src}"\n\n[[stage]]\nop = "segment"\nkey = "key"\nsequence = "tokens"\n'
        f'num-unroll = 8\nbatch-size = 4\nworld-size = 3\n\n[output]\npath = "{tmp_path / "run"}"\n')
    assert run_cli("run", tmp_path / "p.toml", "-q").exit_code == 0
    assert data_bytes(str(tmp_path / "cli")) == data_bytes(str(tmp_path / "run"))
    for out in ("cli", "run"):  # a pipeline's manifest names its last stage: the loader reads it the same way
        loaders = [batchtool.load(str(tmp_path / out), rank=r, world_size=3) for r in range(3)]
        assert not loaders[0].shuffle and loaders[0].num_lanes == loaders[0].batch_size == 4
        parts = [ids(loader) for loader in loaders]
        assert len({len(p) for p in parts}) == 1 and sorted(sum(parts, [])) == list(range(3 * len(parts[0])))
        with pytest.raises(UsageError, match=r"world_size=1: .* segment output with 3 lane streams"):
            batchtool.load(str(tmp_path / out))
    bad = run_cli("segment", parquet_src, tmp_path / "bad", *flags, "--world-size", "0")
    assert bad.exit_code == 2 and bad.stderr == "error: --world-size 0: must be at least 1\n"
    assert not os.path.exists(tmp_path / "bad")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"world_size": 0}, r"world_size=0: must be at least 1"),
    ({"rank": 2, "world_size": 2}, r"rank=2: must be in 0..1 for world_size=2"),
    ({"rank": -1}, r"rank=-1: must be in 0..0"),
])
def test_rank_errors(root, kwargs, message):
    with pytest.raises(UsageError, match=message):
        batchtool.load(bucket_output(root), **kwargs)


# --- exact resume ---------------------------------------------------------------------------------------------

RESUME_CASES = [
    ("bucket", "parquet", {"seed": 3}),
    ("bucket", "tfrecord", {"seed": 3}),
    ("bucket", "parquet", {"rank": 2, "world_size": 3, "drop_uneven": False}),
    ("segment", "parquet", {"rank": 1, "world_size": 2}),
    ("segment", "tfrecord", {"rank": 0, "world_size": 2}),
]


def output_of(root: str, kind: str, fmt: str, kwargs: dict, compression: str | None = None) -> str:
    if kind == "bucket":
        return bucket_output(root, fmt, compression)
    return segment_output(root, fmt, kwargs.get("world_size", 1), compression)


@pytest.mark.parametrize(("kind", "fmt", "kwargs"), RESUME_CASES)
def test_resume_after_every_k_yields_exactly_the_rest(root, kind, fmt, kwargs):
    dst = output_of(root, kind, fmt, kwargs)
    loader = batchtool.load(dst, **kwargs)
    loader.set_epoch(2)
    full = ids(loader)
    assert len(full) == len(loader) >= 8
    for k in range(len(full) + 1):
        loader = batchtool.load(dst, **kwargs)
        loader.set_epoch(2)
        it = iter(loader)
        head = [int(next(it)["batch"][0]) for _ in range(k)]
        state = json.loads(json.dumps(loader.state_dict()))
        assert state["epoch"] == 2 and state["position"] == k
        fresh = batchtool.load(dst, **kwargs)
        fresh.load_state_dict(state)
        assert head + ids(fresh) == full, k


def test_resume_in_a_fresh_process_reads_no_skipped_batch(root, monkeypatch):
    dst = segment_output(root, "tfrecord", world_size=2)
    loader = batchtool.load(dst, rank=1, world_size=2)
    full = ids(loader)
    loader = batchtool.load(dst, rank=1, world_size=2)
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = loader.state_dict()
    theirs = in_another_process(
        "import json, batchtool\n"
        "from batchtool.io.formats.tfrecord.records import RangeReader\n"
        "ranges = []\n"
        "original = RangeReader.records\n"
        "RangeReader.records = lambda self, start, end, first, **named: ranges.append(first) or original("
        "self, start, end, first, **named)\n"
        f"loader = batchtool.load({dst!r}, rank=1, world_size=2)\n"
        f"loader.load_state_dict({state!r})\n"
        "batches = [int(b['batch'][0]) for b in loader]\n"
        "print(json.dumps([batches, len(ranges)]))\n")
    assert theirs == [full[7:], len(full) - 7]  # only the remaining batches' records were read


@pytest.mark.parametrize("kind", ["bucket", "segment"])
def test_resume_of_gzip_tfrecord(root, kind):
    dst = output_of(root, kind, "tfrecord", {}, compression="gzip")
    full = ids(batchtool.load(dst, shuffle=False))
    loader = batchtool.load(dst, shuffle=False)
    loader.load_state_dict({**loader.state_dict(), "position": 5})
    assert ids(loader) == full[5:]
    if kind == "bucket":
        with pytest.raises(UsageError, match=r"shuffle=True: .* GZIP-compressed TFRecord, which can only be read "
                                             r"forward .*; pass shuffle=False"):
            batchtool.load(dst, shuffle=True)


@pytest.mark.parametrize(("saved", "resumed"), [(2, 3), (3, 2), (4, 1), (1, 4)])
@pytest.mark.parametrize("drop_uneven", [True, False])
def test_a_state_saved_on_n_ranks_resumes_on_m(root, saved, resumed, drop_uneven):
    """Together the M ranks read exactly the rest of the epoch's order after what the N ranks consumed: equal
    counts, no batch twice, none lost but the uneven tail (dropped, or filled from the epoch's start)."""
    dst = bucket_output(root, "arrow")
    whole = batchtool.load(dst, seed=5)
    whole.set_epoch(2)
    epoch = ids(whole)
    for step in (0, 3):
        before = [batchtool.load(dst, seed=5, rank=r, world_size=saved, drop_uneven=drop_uneven)
                  for r in range(saved)]
        for loader in before:
            loader.set_epoch(2)
        heads = [[int(next(it)["batch"][0]) for _ in range(step)] for it in map(iter, before)]
        consumed = [b for taken in zip(*heads) for b in taken]
        assert consumed == epoch[:len(consumed)]  # a prefix of the epoch's order
        state = json.loads(json.dumps(before[0].state_dict()))
        after = [batchtool.load(dst, seed=5, rank=r, world_size=resumed, drop_uneven=drop_uneven)
                 for r in range(resumed)]
        for loader in after:
            loader.load_state_dict(state)
            loader.set_epoch(2)
        parts = [ids(loader) for loader in after]
        assert {len(p) for p in parts} == {len(after[0])}
        rest = [b for taken in zip(*parts) for b in taken]
        remaining = epoch[len(consumed):]
        if drop_uneven:
            assert rest == remaining[:len(remaining) - len(remaining) % resumed]
        else:
            assert rest == remaining + epoch[:-len(remaining) % resumed]
        for loader in after:
            loader.set_epoch(3)  # the next epoch is whole again on the M ranks
        per = len(epoch) // resumed if drop_uneven else -(-len(epoch) // resumed)
        assert [len(ids(loader)) for loader in after] == [per] * resumed


def test_segment_output_refuses_another_world_size_saying_what_to_do(root):
    dst = segment_output(root, world_size=2)
    state = batchtool.load(dst, rank=0, world_size=2).state_dict()
    with pytest.raises(UsageError, match=r"saved on 2 ranks, this loader has world_size=1: segment output's lanes "
                                         r"carry state .* write it again with `segment --world-size 1`"):
        batchtool.load(segment_output(root), world_size=1).load_state_dict({**state, "batches": batchtool.load(
            segment_output(root)).num_batches})


def test_the_default_call_reads_gzip_tfrecord_in_order_with_one_warning(root):
    dst = bucket_output(root, "tfrecord", "gzip")
    with pytest.warns(UserWarning, match=r"GZIP-compressed TFRecord, which can only be read forward.*: reading its "
                                         r"batches in file order"):
        loader = batchtool.load(dst)
    assert ids(loader) == list(range(BUCKET_BATCHES))


def test_a_new_iteration_restarts_the_epoch_unless_a_state_was_loaded(root):
    loader = batchtool.load(bucket_output(root))
    full = ids(loader)
    it = iter(loader)
    next(it), next(it)
    assert loader.position == 2 and ids(loader) == full  # like StatefulDataLoader: iter() starts over
    loader.load_state_dict({**loader.state_dict(), "position": 3})
    loader.set_epoch(0)  # the epoch of the state: the resume position is kept
    assert ids(loader) == full[3:]
    loader.load_state_dict({**loader.state_dict(), "position": 3})
    loader.set_epoch(1)  # another epoch starts at its beginning
    assert len(ids(loader)) == len(full)
    state = loader.state_dict()
    assert state["position"] == len(full)  # an ended epoch: resuming yields nothing until set_epoch
    loader.load_state_dict(state)
    assert ids(loader) == []


@pytest.mark.parametrize(("change", "message"), [
    ({"seed": 4}, r"saved with seed=4, this loader has seed=3"),
    ({"drop_uneven": False}, r"saved with drop_uneven=False, this loader has drop_uneven=True"),
    ({"batches": 99}, r"saved with batches=99, this loader has batches=23"),
    ({"position": 24}, r"position 24: this rank has 23 batches in this epoch"),
])
def test_a_state_from_another_setup_is_refused(root, change, message):
    loader = batchtool.load(bucket_output(root), seed=3)
    with pytest.raises(UsageError, match=message):
        loader.load_state_dict({**loader.state_dict(), **change})
    with pytest.raises(UsageError, match=r"the state has no epoch, position"):
        loader.load_state_dict({"seed": 3})
