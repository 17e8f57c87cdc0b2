"""batchtool.source as a Grain data source: MapDataset and DataLoader (sharded, shuffled, in worker processes) read
the same batches as batchtool.load(DST, shuffle=False); scripts/train_jax.py trains on it. Needs grain (the test
extra); the training script also JAX (the `jax` extra)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from load_outputs import bucket_output

grain = pytest.importorskip("grain", reason="grain (in the test extra) is not installed")

import batchtool  # noqa: E402
from memlimit import HANG_GUARD

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def dst(tmp_path_factory) -> str:
    return bucket_output(str(tmp_path_factory.mktemp("outputs")), "arrow")


def ids(batches) -> list[int]:
    return [int(b["batch"][0]) for b in batches]


def test_a_map_dataset_over_a_source_is_the_output_in_file_order(dst):
    expected = list(batchtool.load(dst, shuffle=False))
    dataset = grain.MapDataset.source(batchtool.source(dst))
    assert len(dataset) == len(expected)
    for got, want in zip(dataset, expected):
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    assert ids(dataset.shuffle(seed=3)) != ids(expected) and sorted(ids(dataset.shuffle(seed=3))) == ids(expected)


def test_grain_dataloader_shards_and_shuffles_a_source_in_worker_processes(dst):
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags, which a non-absl program never parses
    source = batchtool.source(dst, columns=["batch"])

    def read(shard_options, workers: int) -> list[int]:
        sampler = grain.samplers.IndexSampler(num_records=len(source), shuffle=True, seed=7, num_epochs=1,
                                              shard_options=shard_options)
        return ids(grain.DataLoader(data_source=source, sampler=sampler, worker_count=workers))

    whole = read(grain.sharding.NoSharding(), 1)
    assert whole != sorted(whole) and sorted(whole) == ids(batchtool.load(dst, shuffle=False))
    parts = [read(grain.sharding.ShardOptions(shard, 2, drop_remainder=True), 0) for shard in range(2)]
    assert len(parts[0]) == len(parts[1]) and not set(parts[0]) & set(parts[1])


@pytest.mark.skipif(pytest.importorskip("importlib").util.find_spec("jax") is None,
                    reason="the `jax` extra (JAX) is not installed")
def test_the_jax_example_trains_on_bucket_output(dst):
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "train_jax.py"), dst, "--epochs", "2"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr[-2000:]
    losses = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("epoch")]
    assert len(losses) == 2 and losses[1] < losses[0]
