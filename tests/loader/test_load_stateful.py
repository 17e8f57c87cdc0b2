"""torchdata's StatefulDataLoader over batchtool.load (K = 0..4 workers) and over batchtool.source (K workers, then
K' others), saved mid-epoch and resumed in a fresh process: the rest of the stream is the uninterrupted run's.
Also PyTorch's map-style DataLoader and DistributedSampler over a source. Needs the `torch` extra (torch and
torchdata); skipped without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from load_outputs import bucket_output
from memlimit import HANG_GUARD

torch = pytest.importorskip("torch", reason="the `torch` extra (torch, torchdata) is not installed")
stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="the `torch` extra's torchdata is not installed")
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

import batchtool  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3-4 workers on 2 cores
LOAD = {"seed": 4, "rank": 1, "world_size": 2, "drop_uneven": False}
SAVE_AFTER = {0: 7, 1: 0, 2: 7, 3: 5, 4: 11}
"""Batches taken before state_dict(), per number of workers."""
RESUME = """
import json, sys, torch, batchtool
from torchdata.stateful_dataloader import StatefulDataLoader
out = {}
for name, (dst, kwargs, workers, path, kind) in json.loads(sys.argv[1]).items():
    state = torch.load(path, weights_only=False)
    if kind == "source":
        data = batchtool.source(dst)
        state = batchtool.Source.dataloader_state(state, workers)
    else:
        data = batchtool.load(dst, **kwargs)
    loader = StatefulDataLoader(data, batch_size=None, num_workers=workers)
    loader.load_state_dict(state)
    out[name] = [int(b["batch"][0]) for b in loader]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("outputs"))


def ids(batches) -> list[int]:
    return [int(b["batch"][0]) for b in batches]


def take(loader, k: int) -> list[int]:
    it = iter(loader)
    return [int(next(it)["batch"][0]) for _ in range(k)]


def resume_in_a_fresh_process(jobs: dict) -> dict[str, list[int]]:
    done = subprocess.run([sys.executable, "-c", RESUME, json.dumps(jobs)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_stateful_dataloader_over_load_resumes_exactly_for_0_to_4_workers(root, tmp_path):
    dst = bucket_output(root, "arrow")
    expected = ids(batchtool.load(dst, **LOAD))
    jobs, heads = {}, {}
    for workers, k in SAVE_AFTER.items():
        loader = stateful.StatefulDataLoader(batchtool.load(dst, **LOAD), batch_size=None, num_workers=workers)
        heads[str(workers)] = take(loader, k)
        path = str(tmp_path / f"state-{workers}.pt")
        torch.save(loader.state_dict(), path)
        jobs[str(workers)] = (dst, LOAD, workers, path, "load")
    for workers, rest in resume_in_a_fresh_process(jobs).items():
        assert heads[workers] + rest == expected, workers


def test_stateful_dataloader_over_source_resumes_on_another_number_of_workers(root, tmp_path):
    dst = bucket_output(root, "arrow")
    expected = list(range(len(batchtool.source(dst))))
    jobs, heads = {}, {}
    for saved, resumed, k in ((1, 3, 5), (3, 2, 9), (4, 1, 13)):
        loader = stateful.StatefulDataLoader(batchtool.source(dst), batch_size=None, num_workers=saved)
        name = f"{saved}->{resumed}"
        heads[name] = take(loader, k)
        path = str(tmp_path / f"state-{saved}.pt")
        torch.save(loader.state_dict(), path)
        jobs[name] = (dst, {}, resumed, path, "source")
    for name, rest in resume_in_a_fresh_process(jobs).items():
        assert heads[name] + rest == expected, name


def test_a_map_style_dataloader_and_distributed_sampler_over_a_source(root):
    dst = bucket_output(root, "arrow")
    in_order = ids(batchtool.load(dst, shuffle=False))
    assert ids(DataLoader(batchtool.source(dst), batch_size=None, num_workers=2)) == in_order
    parts = []
    for rank in range(3):
        sampler = DistributedSampler(batchtool.source(dst), num_replicas=3, rank=rank, shuffle=True, seed=5)
        sampler.set_epoch(1)
        parts.append(ids(DataLoader(batchtool.source(dst), batch_size=None, sampler=sampler)))
    seen = [b for p in parts for b in p]
    assert len({len(p) for p in parts}) == 1 and set(seen) == set(in_order)


def test_the_dataloader_state_of_source_refuses_what_it_cannot_rewrite():
    with pytest.raises(batchtool.BatchtoolError, match=r"num_workers=0: a state saved with workers resumes with 1"):
        batchtool.Source.dataloader_state({"_snapshot": {"_main_snapshot": {}}}, 0)
    with pytest.raises(batchtool.BatchtoolError, match=r"pass what StatefulDataLoader.state_dict\(\) returned"):
        batchtool.Source.dataloader_state({"epoch": 0}, 2)
