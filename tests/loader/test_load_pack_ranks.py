"""load over `pack --world-size N` output: rank r's i-th batch is its batch at step i, exactly the rows the plan gave
it; another world size (at load or at resume) and shuffling are refused in one line naming --world-size."""

from __future__ import annotations

import pytest

import batchtool
from batchtool.core.errors import UsageError
from batchtool.core.synthetic import make_table
from conftest import invoke_cli, read_dir, write_parquet_shards

N, B = 3, 2


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("pack_ranks")
    src = write_parquet_shards(str(root / "src"), make_table(300, seed=2), shards=2)
    dst = str(root / "dst")
    result = invoke_cli("pack", src, dst, "--max-length", "512", "--sequence", "tokens", "--columns", "key",
                        "--world-size", N, "--batch-size", B, "-q")
    assert result.exit_code == 0, result.stderr
    return dst


def test_each_rank_reads_its_batch_of_every_step(packed):
    table = read_dir(packed)
    keys = table.column("key").to_pylist()
    steps = table.num_rows // (N * B)
    for rank in range(N):
        loader = batchtool.load(packed, rank=rank, world_size=N, shuffle=False)
        got = [batch for batch in loader]
        assert len(got) == len(loader) == steps
        for i, batch in enumerate(got):
            first = (i * N + rank) * B  # output batch i * N + rank: this rank's at step i
            assert batch["batch"].tolist() == [i * N + rank] * B
            assert [list(k) for k in batch["key"]] == keys[first:first + B]


def test_default_is_unshuffled(packed):
    assert [int(b["batch"][0]) for b in batchtool.load(packed, rank=1, world_size=N)][:3] == [1, 1 + N, 1 + 2 * N]


@pytest.mark.parametrize("kwargs, message", [
    ({"world_size": 2}, "world_size=2: {dst} is pack output balanced for --world-size 3: each step's rows are "
                        "balanced across exactly 3 ranks; load it with world_size=3, or run pack again with "
                        "`--world-size 2`"),
    ({"world_size": 1, "rank": 0}, "or run pack again with `--world-size 1`"),
    ({"world_size": N, "shuffle": True}, "shuffle=True: {dst} is pack output laid out by step for --world-size 3"),
])
def test_another_world_size_or_shuffling_is_refused(packed, kwargs, message):
    with pytest.raises(UsageError) as caught:
        batchtool.load(packed, **kwargs)
    assert message.format(dst=packed) in str(caught.value) and "\n" not in str(caught.value)


def test_resume_on_another_world_size_is_refused_and_on_the_same_continues(packed):
    loader = batchtool.load(packed, rank=0, world_size=N, shuffle=False)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = batchtool.load(packed, rank=0, world_size=N, shuffle=False)
    with pytest.raises(UsageError, match=r"saved on 6 ranks, this loader has world_size=3: pack output balanced for "
                                         r"--world-size 3.*`--world-size 6`"):
        other.load_state_dict({**state, "world_size": 6})
    other.load_state_dict(state)
    assert [int(b["batch"][0]) for b in other][:2] == [N, 2 * N]
