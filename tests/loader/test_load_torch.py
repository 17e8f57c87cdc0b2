"""batchtool.load as a PyTorch dataset: DataLoader workers split the batches with no duplicate, no loss and
the loader's own order; tensors share the decoded memory; the DDP example checkpoints and resumes mid-epoch.
Skipped where PyTorch is not installed (it is not a dependency)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
from load_outputs import bucket_output, segment_output

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

import batchtool  # noqa: E402
from memlimit import HANG_GUARD
from batchtool.core.errors import UsageError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("outputs"))


def batch_ids(batches) -> list[int]:
    return [int(b["batch"][0]) for b in batches]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize(("kind", "kwargs"), [
    ("bucket", {"seed": 4, "rank": 1, "world_size": 2, "drop_uneven": False}),
    ("segment", {"rank": 0, "world_size": 2}),
])
def test_dataloader_workers_yield_the_loaders_own_order(root, num_workers, kind, kwargs):
    dst = bucket_output(root, "tfrecord") if kind == "bucket" else segment_output(root, world_size=2)
    loader = batchtool.load(dst, **kwargs)
    assert isinstance(loader, IterableDataset)
    loader.set_epoch(3)
    expected = batch_ids(loader)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not writable")  # PyTorch's warning on read-only arrays
        seen = batch_ids(DataLoader(loader, batch_size=None, num_workers=num_workers))
    assert seen == expected and len(seen) == len(loader)
    loader.load_state_dict(loader.state_dict(position=5))
    resumed = batch_ids(DataLoader(loader, batch_size=None, num_workers=num_workers))
    assert resumed == expected[5:]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_state_dict_after_dataloader_workers_read_the_batches_asks_for_the_position(root, num_workers):
    """The workers' copies read the batches (forked: this loader's own position stays 0), so a bare state_dict()
    would checkpoint the start of the epoch: it refuses, naming what to do instead; state_dict(position=N)
    resumes exactly; once the loader iterates itself again, it knows its position."""
    loader = batchtool.load(bucket_output(root), seed=2)
    expected = batch_ids(loader)
    it = iter(DataLoader(loader, batch_size=None, num_workers=num_workers))
    consumed = batch_ids(next(it) for _ in range(7))
    with pytest.raises(UsageError, match=r"^state_dict\(\): DataLoader worker processes read this loader's batches.*"
                                         r"state_dict\(position=N\).*torchdata's StatefulDataLoader"):
        loader.state_dict()
    del it
    resumed = batchtool.load(bucket_output(root), seed=2)
    resumed.load_state_dict(loader.state_dict(position=7))
    assert consumed + batch_ids(resumed) == expected
    for _ in zip(range(3), loader):
        pass
    assert loader.state_dict()["position"] == 3


def test_a_pickled_loader_asks_for_the_position_as_spawned_workers_copies_would_read_it(root):
    loader = batchtool.load(bucket_output(root))
    copy = pickle.loads(pickle.dumps(loader))
    assert batch_ids(copy) == batch_ids(batchtool.load(bucket_output(root)))
    with pytest.raises(UsageError, match=r"state_dict\(position=N\)"):
        loader.state_dict()
    assert loader.state_dict(position=4)["position"] == 4


def test_torch_imported_after_load_still_sees_an_iterable_dataset(root, monkeypatch):
    """Registration happens when DataLoader asks (isinstance), whatever was imported first: the loader is made
    while torch.utils.data is not imported (and IterableDataset has no registration, as in a fresh process)."""
    dst = bucket_output(root)
    IterableDataset._abc_registry_clear()
    IterableDataset._abc_caches_clear()
    with monkeypatch.context() as patched:
        patched.delitem(sys.modules, "torch.utils.data")
        loader = batchtool.load(dst, seed=5)
    assert batch_ids(DataLoader(loader, batch_size=None)) == batch_ids(batchtool.load(dst, seed=5))


def test_dataloader_converts_arrays_to_tensors_without_a_copy(root):
    batch = next(iter(DataLoader(batchtool.load(bucket_output(root)), batch_size=None)))
    assert isinstance(batch["frames"], torch.Tensor) and batch["frames"].dtype == torch.float32
    assert batch["frames"].shape[2] == 3 and isinstance(batch["key"], np.ndarray)


def test_tensors_share_the_decoded_memory(root):
    loader = batchtool.load(bucket_output(root), tensors=True, shuffle=False)
    batch = next(iter(loader))
    assert isinstance(batch["tokens"], torch.Tensor) and batch["tokens"].dtype == torch.int64
    assert isinstance(batch["key"], np.ndarray) and batch["key"].dtype == object  # strings stay NumPy
    reference = next(iter(batchtool.load(bucket_output(root), shuffle=False)))
    np.testing.assert_array_equal(batch["tokens"].numpy(), reference["tokens"])


def test_ddp_example_checkpoints_mid_epoch_and_finishes_after_a_restart(root, tmp_path):
    """scripts/train_ddp.py: 2 gloo ranks train, stop after 4 steps with a checkpoint, restart from it and finish
    the epoch; together the two runs give each rank exactly its batches of the epoch, once."""
    dst = bucket_output(root, drop_remainder=False)
    script = [sys.executable, os.path.join(REPO, "scripts", "train_ddp.py"), dst, "--epochs", "1",
              "--checkpoint", str(tmp_path / "ckpt.pt"), "--workers", "1"]
    env = {**os.environ, "PYTHONPATH": REPO}
    runs = [subprocess.run([*script, *extra], capture_output=True, text=True, env=env, timeout=HANG_GUARD)
            for extra in (["--stop-after", "4"], [])]
    for run in runs:
        assert run.returncode == 0, run.stderr
    reports = [json.loads(line) for run in runs for line in run.stdout.splitlines() if line.startswith("{")]
    for rank in range(2):
        mine = [r for r in reports if r["rank"] == rank]
        assert [(r["start"], r["end"]) for r in mine] == [(0, 4), (4, len(mine[1]["epoch_batches"]))]
        assert mine[0]["batches"] + mine[1]["batches"] == mine[1]["epoch_batches"]
    loaders = [batchtool.load(dst, rank=r, world_size=2, seed=0) for r in range(2)]
    assert [r["epoch_batches"] for r in reports[2:]] == [list(map(int, x.epoch_batches())) for x in loaders]
