"""pack --world-size: every planned row placed once at a (step, rank), every step full on every rank, each step's
rank costs within the bound the assignment guarantees, the remainder dropped and counted; end to end through the
CLI, with the same bytes for any --threads, and bad values refused in one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchtool.core.synthetic import make_table
from batchtool.io.manifest import MANIFEST_NAME
from batchtool.ops.base import OptionError
from batchtool.ops.pack import PackOptions
from batchtool.ops.pack.packing import plan_packing
from batchtool.ops.pack.ranks import TOLERANCE, assign_ranks, class_costs
from conftest import data_bytes, read_dir, write_parquet_shards


def row_costs(packing, coefficients) -> np.ndarray:
    """Cost of every row id, from its class."""
    return np.repeat(class_costs(packing, coefficients), packing.rows)


def step_loads(plan, costs: np.ndarray) -> np.ndarray:
    """[steps, ranks] cost of each rank's batch at each step, from the positions alone."""
    N, B = plan.world_size, plan.batch_size
    return costs[plan.row_at].reshape(-1, N, B).sum(axis=2)


@given(st.lists(st.integers(0, 64), min_size=1, max_size=40), st.integers(1, 6), st.integers(1, 4),
       st.integers(0, 2**32), st.sampled_from([(1.0, 0.0), (0.0, 1.0), (0.5, 3.0)]))
@settings(max_examples=60, deadline=None)
def test_every_row_is_placed_once_and_every_step_is_full_on_every_rank(lengths, N, B, seed, coefficients):
    counts = np.bincount(np.asarray(lengths), minlength=65)
    packing, _ = plan_packing(counts, 64)
    plan = assign_ranks(packing, coefficients, N, B, seed)
    total = packing.total_rows
    kept = total - total % (N * B)
    assert plan.dropped_rows == total % (N * B)
    placed = plan.position[plan.position >= 0]
    assert sorted(placed.tolist()) == list(range(kept))  # each kept row once, positions filling whole steps
    assert np.array_equal(plan.position[plan.row_at], np.arange(kept))
    assert plan.steps == kept // (N * B)
    costs = row_costs(packing, coefficients)
    loads = step_loads(plan, costs)
    ordered = np.sort(costs[plan.row_at])[::-1]
    widest_tuple = (ordered.reshape(-1, N)[:, 0] - ordered.reshape(-1, N)[:, -1]).max(initial=0)
    assert ((loads.max(axis=1) - loads.min(axis=1)) <= widest_tuple + 1e-9).all()
    mean = loads.mean(axis=1)
    expected = np.where(mean > 0, loads.max(axis=1) / np.where(mean > 0, mean, 1), 1.0)
    assert np.allclose(plan.ratios, expected)
    dropped_rows = np.flatnonzero(plan.position < 0)
    shape_steps, shape_examples = packing.row_shape(dropped_rows)
    assert plan.dropped_steps == int(shape_steps.sum()) and plan.dropped_examples == int(shape_examples.sum())
    # the remainder is the rows with the fewest real steps
    kept_steps, _ = packing.row_shape(plan.row_at)
    assert shape_steps.max(initial=0) <= kept_steps.min(initial=64)


def test_small_case_exactly():
    """L = 10: two rows of one 10-step example (cost 100), two rows of two 5-step ones (50), one row of a 3-step one
    (9). N = 2, B = 2: one step, each rank one row of each kind (150); the 3-step row is the remainder."""
    packing, _ = plan_packing(np.bincount([10, 10, 5, 5, 5, 5, 3]), 10)
    plan = assign_ranks(packing, (1.0, 0.0), 2, 2, seed=0)
    costs = row_costs(packing, (1.0, 0.0))
    assert step_loads(plan, costs).tolist() == [[150.0, 150.0]]
    assert (plan.dropped_rows, plan.dropped_examples, plan.dropped_steps) == (1, 1, 3)
    assert plan.ratios.tolist() == [1.0]
    assert sorted(costs[plan.row_at].reshape(2, 2).tolist()) == [[100.0, 50.0], [100.0, 50.0]]
    tokens = assign_ranks(packing, (0.0, 1.0), 2, 2, seed=0)
    assert step_loads(tokens, row_costs(packing, (0.0, 1.0))).tolist() == [[20.0, 20.0]]


@pytest.mark.parametrize("N", [8, 64])
def test_lognormal_corpus_balances_every_step_within_the_tolerance(N):
    """20,000 lognormal lengths (sigma 1.5, capped at L = 8,192), B = 4: every step's max/mean attention cost at
    most 1 + TOLERANCE; the same rows dealt in row order are far above it."""
    rng = np.random.default_rng(5)
    lengths = np.minimum(np.maximum(1, rng.lognormal(5.5, 1.5, 20_000).astype(np.int64)), 8192)
    packing, _ = plan_packing(np.bincount(lengths), 8192)
    plan = assign_ranks(packing, (1.0, 0.0), N, 4, seed=1)
    costs = row_costs(packing, (1.0, 0.0))
    assert plan.ratios.max() <= 1 + TOLERANCE
    naive = costs[:len(plan.row_at)].reshape(-1, N, 4).sum(axis=2)
    assert (naive.max(axis=1) / naive.mean(axis=1)).max() > 1 + 5 * TOLERANCE


# --- end to end -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    return write_parquet_shards(str(tmp_path_factory.mktemp("ranks") / "src"), make_table(400, seed=11), shards=3)


def manifest(path) -> dict:
    with open(os.path.join(path, MANIFEST_NAME)) as f:
        return json.load(f)


def test_cli_writes_steps_of_balanced_batches_and_counts_the_remainder(tmp_path, source, run_cli):
    args = ["--max-length", "512", "--sequence", "tokens", "--columns", "key", "--world-size", "3", "--batch-size",
            "2", "--seed", "4", "-q"]
    assert run_cli("pack", source, tmp_path / "a", *args, "--threads", "1").exit_code == 0
    assert run_cli("pack", source, tmp_path / "b", *args, "--threads", "2", "--memory", "64MB").exit_code == 0
    assert data_bytes(str(tmp_path / "a")) == data_bytes(str(tmp_path / "b"))
    stats = manifest(tmp_path / "a")["stats"]
    table = read_dir(str(tmp_path / "a"))
    assert table.num_rows % 6 == 0 and stats["rows"] == table.num_rows
    assert stats["rank_layout"] == {"world_size": 3, "layout": "steps", "steps": table.num_rows // 6}
    keys = [k for row in table.column("key").to_pylist() for k in row]
    assert len(keys) == len(set(keys)) == stats["examples_packed"]
    assert stats["examples_packed"] + stats["examples_dropped"]["remainder"] == 400
    cu = table.column("cu_seqlens").to_pylist()
    cost = np.array([float(np.square(np.diff(c)).sum()) for c in cu]).reshape(-1, 3, 2).sum(axis=2)
    ratios = cost.max(axis=1) / cost.mean(axis=1)
    assert stats["rank_cost_max_over_mean"] == {"worst": round(float(ratios.max()), 6),
                                                "mean": round(float(ratios.mean()), 6)}
    assert table.column("batch").to_pylist() == [b for b in range(table.num_rows // 2) for _ in range(2)]


def test_without_world_size_the_manifest_holds_no_rank_keys(tmp_path, source, run_cli):
    assert run_cli("pack", source, tmp_path / "a", "--max-length", "512", "--sequence", "tokens", "-q").exit_code == 0
    m = manifest(tmp_path / "a")
    assert "rank_layout" not in m["stats"] and "world_size" not in m["options"]
    assert set(m["stats"]["examples_dropped"]) == {"long"}


@pytest.mark.parametrize("args, message", [
    (["--world-size", "0"], "error: --world-size 0: must be at least 1"),
    (["--world-size", "2", "--cost-coefficients", "1"], "error: --cost-coefficients '1': expected two numbers A,B"),
    (["--world-size", "2", "--cost-coefficients", "a,b"], "error: --cost-coefficients 'a,b': expected two numbers"),
    (["--world-size", "2", "--cost-coefficients", "-1,0"], "error: --cost-coefficients -1,0: must be finite, at "
                                                           "least 0 and not both 0"),
    (["--world-size", "2", "--cost-coefficients", "0,0"], "not both 0"),
    (["--world-size", "2", "--balance", "tokens", "--cost-coefficients", "1,1"], "--cost-coefficients weighs "
                                                                                  "--balance attention"),
    (["--balance", "tokens"], "--balance balances ranks: give it with --world-size N"),
    (["--world-size", "2", "--max-tokens", "512"], "error: --max-tokens: give --batch-size with --world-size"),
])
def test_bad_values_are_one_line_usage_errors(tmp_path, source, run_cli, args, message):
    result = run_cli("pack", source, tmp_path / "dst", "--max-length", "512", "--sequence", "tokens", *args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "dst").exists()


def test_options_parse_coefficients_from_a_pipeline_array():
    o = PackOptions(max_length=8, world_size=2, cost_coefficients=(2.0, 1.0))
    assert o.coefficients == (2.0, 1.0) and PackOptions(max_length=8, world_size=2).coefficients == (1.0, 0.0)
    assert PackOptions(max_length=8, world_size=2, balance="tokens").coefficients == (0.0, 1.0)
    with pytest.raises(OptionError):
        PackOptions(max_length=8, cost_coefficients=(1.0, 0.0))


def test_check_bounds_the_worst_steps_rank_cost(tmp_path, source, run_cli):
    dst = tmp_path / "out"
    args = ["--max-length", "512", "--sequence", "tokens", "--batch-size", "2", "-q"]
    assert run_cli("pack", source, dst, *args, "--world-size", "3").exit_code == 0
    worst = manifest(dst)["stats"]["rank_cost_max_over_mean"]["worst"]
    rules = tmp_path / "rules.toml"
    for bound, status in ((worst, 0), (worst - 1e-6, 1)):
        rules.write_text(f'[[rules]]\nkind = "rank_cost_max_over_mean"\nmax = {bound!r}\n')
        checked = run_cli("check", dst, "--rules", rules)
        assert checked.exit_code == status and f"worst step {worst:.4f}" in checked.output, checked.output
    rules.write_text('[[rules]]\nkind = "rank_cost_max_over_mean"\nmax = 0.5\n')
    refused = run_cli("check", dst, "--rules", rules)
    assert refused.exit_code == 2 and "key 'max': must be a number >= 1, got 0.5" in refused.stderr, refused.stderr
    assert run_cli("pack", source, tmp_path / "plain", *args).exit_code == 0
    rules.write_text('[[rules]]\nkind = "rank_cost_max_over_mean"\nmax = 1.02\n')
    unrecorded = run_cli("check", tmp_path / "plain", "--rules", rules)
    assert unrecorded.exit_code == 2 and unrecorded.stderr.count("\n") == 1
    assert "records no stats.rank_cost_max_over_mean" in unrecorded.stderr and "pack --world-size" in unrecorded.stderr
