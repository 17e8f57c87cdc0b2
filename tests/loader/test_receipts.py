"""Receipts: `where`/`step` agree with the batches batchtool.load actually yields, and the receipt log of interrupted,
resumed and elastic runs shows each example handed out exactly once (or names the one that was not)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from load_outputs import bucket_output, segment_output

import batchtool
from batchtool.check.receipts import exactly_once, same_prefix
from batchtool.core.errors import InputError, UsageError
from batchtool.io.example_index import NotFoundError
from batchtool.loader.receipts import read_receipts
from batchtool.loader.steps import key_places, step_keys


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("receipts"))


def yielded_keys(dst: str, epoch: int, world_size: int, rank: int, seed: int) -> list[list[str]]:
    loader = batchtool.load(dst, seed=seed, rank=rank, world_size=world_size, columns=["key"])
    loader.set_epoch(epoch)
    return [batch["key"].tolist() for batch in loader]


@settings(max_examples=12, deadline=None)
@given(batch_size=st.integers(1, 30), world_size=st.integers(1, 4), epoch=st.integers(0, 3),
       seed=st.integers(0, 5), data=st.data())
def test_where_and_step_match_a_scan_of_the_loaders_batches(root, batch_size, world_size, epoch, seed, data):
    dst = bucket_output(root, "parquet", batch_size=(batch_size,))
    scans = {r: yielded_keys(dst, epoch, world_size, r, seed) for r in range(world_size)}
    rank = data.draw(st.integers(0, world_size - 1))
    for step, keys in enumerate(scans[rank]):
        assert step_keys(dst, step, epoch=epoch, world_size=world_size, rank=rank, seed=seed)[1] == keys
    for key in data.draw(st.lists(st.sampled_from([f"ex-{i:08d}" for i in range(240)]), min_size=1, max_size=5)):
        places = key_places(dst, key, epoch=epoch, world_size=world_size, seed=seed)
        expected = [(r, s) for r in range(world_size) for s, keys in enumerate(scans[r]) if key in keys]
        assert [(p.rank, p.step) for p in places] == expected
        only = key_places(dst, key, epoch=epoch, world_size=world_size, rank=rank, seed=seed)
        assert [(p.rank, p.step) for p in only] == [(r, s) for r, s in expected if r == rank]


def test_where_and_step_refuse_what_is_not_there(root):
    dst = bucket_output(root)
    with pytest.raises(NotFoundError, match="no example has key 'nope'"):
        key_places(dst, "nope")
    with pytest.raises(UsageError, match="step 23: rank 0 of 1 has 23 steps"):
        step_keys(dst, 23)
    with pytest.raises(UsageError, match="rank=2"):
        step_keys(dst, 0, world_size=2, rank=2)


def test_segment_steps_are_its_lanes_batches(root):
    dst = segment_output(root, world_size=2)
    scan = yielded_keys(dst, 0, 2, 1, 0)
    assert [step_keys(dst, s, world_size=2, rank=1)[1] for s in range(len(scan))] == scan


def consume(dst: str, log: str, world_size: int, steps: int | None, state: dict | None = None,
            epoch: int = 0) -> dict:
    """Every rank of a run takes `steps` batches (None: the rest of the epoch), logging receipts; its state."""
    saved = None
    for rank in range(world_size):
        loader = batchtool.load(dst, rank=rank, world_size=world_size, receipt=log, columns=["key"])
        loader.set_epoch(epoch)
        if state is not None:
            loader.load_state_dict(state)
        for i, _ in enumerate(loader):
            if steps is not None and i + 1 == steps:
                break
        saved = loader.state_dict()
    return saved


def test_an_interrupted_resumed_and_elastic_training_hands_out_each_example_once(root, tmp_path):
    dst = bucket_output(root)
    first, second = str(tmp_path / "first.log"), str(tmp_path / "second.log")
    state = consume(dst, first, 2, 3)  # stopped after 3 steps on 2 ranks
    state = consume(dst, second, 3, 2, state)  # resumed on 3 ranks, stopped again
    consume(dst, second, 2, None, state)  # resumed on 2 ranks: the rest of epoch 0
    consume(dst, second, 2, None, epoch=1)
    verdict = exactly_once(dst, [first, second])
    assert verdict.passed, verdict.line
    assert "2 finished epoch(s)" in verdict.line
    receipts = read_receipts(second)
    assert {(r.world_size, r.epoch) for r in receipts} == {(3, 0), (2, 0), (2, 1)}


def test_a_dropped_or_repeated_batch_is_named(root, tmp_path):
    dst = bucket_output(root)
    log = str(tmp_path / "run.log")
    consume(dst, log, 1, None)
    consume(dst, log, 1, None, epoch=1)
    lines = open(log).read().splitlines(keepends=True)
    receipts = read_receipts(log)
    index = {b: keys for b, keys in ((r.batch, step_keys(dst, r.step)[1]) for r in receipts[:23])}
    dropped = str(tmp_path / "dropped.log")
    open(dropped, "w").writelines(lines[:5] + lines[6:])
    verdict = exactly_once(dst, [dropped])
    assert not verdict.passed
    assert verdict.line.startswith(f"example {index[receipts[5].batch][0]!r} (batch {receipts[5].batch}) of epoch 0 "
                                   "was never handed out")
    repeated = str(tmp_path / "repeated.log")
    open(repeated, "w").writelines(lines[:30] + [lines[27]] + lines[30:])
    verdict = exactly_once(dst, [repeated])
    assert not verdict.passed
    assert f"(batch {receipts[27].batch}) of epoch 1 was handed out twice: step 4 rank 0 ({repeated}, line 28) " \
           f"and step 4 rank 0 ({repeated}, line 31)" in verdict.line
    assert exactly_once(dst, [log]).passed


def test_same_prefix_names_the_first_step_that_differs(root, tmp_path):
    dst = bucket_output(root)
    a, b, c = (str(tmp_path / f"{n}.log") for n in "abc")
    consume(dst, a, 2, None)
    consume(dst, b, 2, 4)
    assert same_prefix(dst, [a, b]).passed
    consume(dst, c, 2, 4)
    lines = open(c).read().splitlines(keepends=True)
    swapped = lines[:2] + [lines[2].replace('"rank":0', '"rank":9')] + lines[3:]
    open(c, "w").writelines(swapped)
    verdict = same_prefix(dst, [a, c])
    assert not verdict.passed and verdict.line.startswith("step 2 of epoch 0, rank 0: example ")
    assert verdict.line.endswith(f"nothing in {c}")


def test_a_receipt_from_elsewhere_is_one_clear_error(root, tmp_path):
    dst = bucket_output(root)
    log = str(tmp_path / "other.log")
    consume(segment_output(root), log, 1, 2)
    with pytest.raises(InputError, match="the receipt is another output's"):
        exactly_once(dst, [log])
    with open(log, "a") as f:
        f.write("not json\n")
    with pytest.raises(InputError, match=r"line 3: not a receipt line"):
        read_receipts(log)
    cut = str(tmp_path / "cut.log")
    open(cut, "w").writelines(open(log).readlines()[:2] + ['{"epoch":0,"st'])  # a write the process did not finish
    assert [r.step for r in read_receipts(cut)] == [0, 1]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_dataloader_workers_append_whole_lines_to_one_receipt(root, tmp_path):
    torch_data = pytest.importorskip("torch.utils.data")
    dst = bucket_output(root)
    plain, workers = str(tmp_path / "plain.log"), str(tmp_path / "workers.log")
    consume(dst, plain, 2, None)
    for rank in range(2):
        loader = batchtool.load(dst, rank=rank, world_size=2, receipt=workers, columns=["key"])
        assert len(list(torch_data.DataLoader(loader, batch_size=None, num_workers=2))) == len(loader)
    assert exactly_once(dst, [workers]).passed
    assert same_prefix(dst, [plain, workers]).passed
    assert sorted((r.rank, r.step) for r in read_receipts(workers)) == [(r, s) for r in range(2) for s in range(11)]
