"""pack: the plan over the length histogram (efficiency, validity, vs first-fit), the keyed permutation,
and packed rows read back exactly: every example once and unmodified, segment ids, positions, offsets."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import batchtool
from batchtool.core import rng
from batchtool.core.errors import InputError, SchemaError
from batchtool.core.run_settings import RunSettings
from batchtool.exec.driver import run_operation
from batchtool.ops.base import OptionError
from batchtool.core.options import fields
from batchtool.ops.pack import OP, PackOptions
from batchtool.ops.pack.options import MAX_LENGTH_LIMIT, resolve_columns
from batchtool.ops.pack.packing import first_fit, lower_bound, plan_packing
from batchtool.io.output import OutputOptions
from batchtool.core.synthetic import lognormal_lengths
from conftest import REPO, data_bytes, read_dir, write_parquet_shards

BENCH_EXAMPLES = 374_126
"""Examples of the 1 GB benchmark corpus (scripts/bench.py: median 100, max 2000 steps)."""


def counts_of(lengths, max_length: int) -> np.ndarray:
    return np.bincount(np.asarray(lengths, dtype=np.int64), minlength=max_length + 1)


# --- the keyed permutation ---------------------------------------------------------------------------

@given(st.integers(1, 5000), st.integers(0, 2**32), st.integers(0, 1000))
@settings(max_examples=60, deadline=None)
def test_index_shuffle_is_a_permutation_and_its_inverse_undoes_it(n, seed, tweak):
    index = np.arange(n, dtype=np.uint64)
    forward = rng.index_shuffle(seed, "p", index, n, tweak=tweak)
    assert sorted(forward.tolist()) == list(range(n))
    assert np.array_equal(rng.index_shuffle(seed, "p", forward, n, tweak=tweak, inverse=True), index)
    one_by_one = [int(rng.index_shuffle(seed, "p", index[i:i + 1], n, tweak=tweak)[0]) for i in range(0, n, 97)]
    assert one_by_one == forward[::97].tolist()


def test_index_shuffle_differs_by_tweak_and_mixes_well():
    n = 10_000
    a = rng.index_shuffle(1, "p", np.arange(n), n, tweak=1)
    b = rng.index_shuffle(1, "p", np.arange(n), n, tweak=2)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05 and abs(np.corrcoef(a, np.arange(n))[0, 1]) < 0.05


# --- the plan ----------------------------------------------------------------------------------------

def test_benchmark_length_distribution_packs_within_a_hair_of_the_optimum():
    """Lognormal lengths (median 100, max 2000) at the 1 GB corpus's size, L = 2048: 25,076 rows against a
    lower bound (Martello-Toth L2, here = ceil(steps / L)) of 25,072, efficiency 0.99984; greedy first-fit
    in arrival order needs 25,112."""
    lengths = lognormal_lengths(np.random.default_rng(1), BENCH_EXAMPLES, 100, 2000)
    packing, report = plan_packing(counts_of(lengths, 2048), 2048)
    bound = report["rows_lower_bound"]
    assert bound == -(-int(lengths.sum()) // 2048)
    assert packing.efficiency() >= 0.99
    assert packing.total_rows <= bound * 1.0005
    assert packing.total_rows <= first_fit(lengths.tolist(), 2048).max() + 1
    for k in (16, 32):  # with a bound on examples per row the hybrids win, still above 0.99
        bounded, _ = plan_packing(counts_of(lengths, 2048), 2048, k)
        assert bounded.efficiency() >= 0.99 and (bounded.class_examples <= k).all()


@given(st.integers(0, 2**32), st.integers(1, 1500), st.floats(2, 400), st.floats(0.05, 1.5), st.integers(8, 4096))
@settings(max_examples=80, deadline=None)
def test_never_more_rows_than_first_fit_in_arrival_order(seed, n, median, sigma, max_length):
    """On long-tailed length distributions of any scale (sigma >= 0.3), in any arrival order, never more rows
    than first-fit; on narrow ones (many near-equal lengths: best-fit decreasing leaves each row a gap just
    under the smallest length, which a lucky arrival order fills) a few more, under 1% (docs/pack.md)."""
    gen = np.random.default_rng(seed)
    lengths = np.clip(np.round(gen.lognormal(np.log(median), sigma, n)), 0, max_length).astype(np.int64)
    packing, _ = plan_packing(counts_of(lengths, max_length), max_length)
    first_fit_rows = int(first_fit(lengths.tolist(), max_length).max()) + 1 if n else 0
    assert packing.total_rows <= first_fit_rows + (0 if sigma >= 0.3 else 2 + first_fit_rows // 100)


def test_a_narrow_distribution_can_lose_rows_to_a_lucky_arrival_order():
    """The case hypothesis found: 583 lengths of 47-60 steps in rows of 314, 5 or 6 to a row."""
    gen = np.random.default_rng(0)
    lengths = np.clip(np.round(gen.lognormal(np.log(52.5), 0.0625, 583)), 0, 314).astype(np.int64)
    packing, report = plan_packing(counts_of(lengths, 314), 314)
    first_fit_rows = int(first_fit(lengths.tolist(), 314).max()) + 1
    assert report["rows_lower_bound"] <= packing.total_rows == first_fit_rows + 2


@st.composite
def instances(draw, max_examples: int = 120):
    max_length = draw(st.integers(1, 200))
    lengths = draw(st.lists(st.integers(0, max_length), max_size=max_examples))
    k = draw(st.none() | st.integers(1, 12))
    return lengths, max_length, k


@given(instances())
@settings(max_examples=300, deadline=None)
def test_plan_is_a_packing_of_exactly_these_lengths(instance):
    lengths, L, K = instance
    counts = counts_of(lengths, L)
    packing, report = plan_packing(counts, L, K)
    assert (packing.class_length <= L).all() and (K is None or (packing.class_examples <= K).all())
    held = np.bincount(packing.entry_size, packing.rows[packing.entry_class] * packing.entry_count, minlength=L + 1)
    assert np.array_equal(held, counts)
    assert lower_bound(counts, L, K) == report["rows_lower_bound"] <= packing.total_rows
    # every slot of every length belongs to one row, and the rows' slots add up to the rows' shapes
    sizes = np.repeat(packing.sizes, counts[packing.sizes])
    slots = np.concatenate([np.arange(c) for c in counts[packing.sizes]]) if len(sizes) else np.zeros(0, np.int64)
    rows = packing.rows_of(sizes, slots)
    steps, examples = packing.row_shape(np.arange(packing.total_rows))
    assert np.array_equal(np.bincount(rows, sizes, minlength=packing.total_rows), steps)
    assert np.array_equal(np.bincount(rows, minlength=packing.total_rows), examples)


@given(instances(max_examples=40))
@settings(max_examples=300, deadline=None)
def test_small_instances_never_lose_to_first_fit(instance):
    """Up to 64 examples the exact search backs the heuristics (which first-fit beats in a lucky order,
    see the next test)."""
    lengths, L, K = instance
    packing, _ = plan_packing(counts_of(lengths, L), L, K)
    assert packing.total_rows <= (first_fit(lengths, L, K).max() + 1 if lengths else 0)


def test_exact_search_finds_the_perfect_packing_the_heuristics_miss():
    lengths = [11, 6, 4, 9, 5, 5, 2]  # 11+6+4 and 9+5+5+2: first-fit in this order finds it too
    packing, report = plan_packing(counts_of(lengths, 21), 21)
    assert set(report["candidates"].values()) == {3, 2} and report["candidates"]["exact search"] == 2
    assert packing.total_rows == 2 == first_fit(lengths, 21).max() + 1
    assert packing.method == "exact search" and report["proven_optimal"]


@pytest.mark.parametrize("lengths, L, K, bound", [
    ([6, 6, 6, 1], 10, None, 3),  # three lengths over L/2 never share a row
    ([5, 5, 5, 5], 10, None, 2),
    ([1] * 10, 10, 3, 4),  # ceil(10 / K)
    ([], 10, None, 0),
])
def test_lower_bound(lengths, L, K, bound):
    assert lower_bound(counts_of(lengths, L), L, K) == bound


# --- packed rows, end to end ---------------------------------------------------------------------------

def table_of(lengths) -> pa.Table:
    """Examples with these lengths: a key, a label, tokens numbered globally (so every step is unique)
    and 2-float frames."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    steps = int(lengths.sum())
    return pa.table({
        "key": pa.array([f"ex-{i:05d}" for i in range(len(lengths))]),
        "label": pa.array(np.arange(len(lengths)) % 3),
        "tokens": pa.ListArray.from_arrays(offsets, pa.array(np.arange(steps, dtype=np.int64) + 1)),
        "frames": pa.ListArray.from_arrays(offsets, pa.FixedSizeListArray.from_arrays(
            pa.array(np.arange(2 * steps, dtype=np.float32)), 2)),
    })


def run_pack(src: str, dst: str, seed: int = 0, long: str = "error", **options) -> dict:
    options.setdefault("batch_size", 3)
    options.update(split_long=long == "split", drop_long=long == "drop")
    return run_operation(OP, PackOptions(**options), src, dst, OutputOptions(), RunSettings(quiet=True),
                         seed=seed).manifest


def unpack(dst: str) -> dict[str, list]:
    """Every packed example as {key: [(tokens, frames, source_offset), ...]}, checking each row's
    segment_ids, positions, cu_seqlens, num_examples, length and padding on the way."""
    out: dict[str, list] = {}
    for row in read_dir(dst).to_pylist():
        cu = row["cu_seqlens"]
        n = row["num_examples"]
        assert len(cu) == n + 1 and cu[0] == 0 and row["length"] == cu[-1] and len(row["key"]) == n
        assert all(len(row[c]) == n for c in ("key", "label"))
        pad = len(row["tokens"]) - cu[-1]
        assert row["segment_ids"] == [i + 1 for i in range(n) for _ in range(cu[i], cu[i + 1])] + [0] * pad
        assert row["positions"] == [t for i in range(n) for t in range(cu[i + 1] - cu[i])] + [0] * pad
        assert row["tokens"][cu[-1]:] == [0] * pad and len(row["frames"]) == len(row["tokens"])
        for i, key in enumerate(row["key"]):
            piece = (row["tokens"][cu[i]:cu[i + 1]], row["frames"][cu[i]:cu[i + 1]],
                     row.get("source_offset", [0] * n)[i], row["label"][i])
            out.setdefault(key, []).append(piece)
    return out


def examples_of(table: pa.Table) -> dict[str, tuple]:
    return {r["key"]: (r["tokens"], r["frames"], r["label"]) for r in table.to_pylist()}


@given(st.lists(st.integers(0, 60), min_size=1, max_size=60), st.integers(1, 40), st.none() | st.integers(1, 6),
       st.sampled_from(["split", "drop"]), st.integers(0, 3))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_example_once_unmodified_with_correct_segments(tmp_path_factory, lengths, L, K, long, seed):
    base = tmp_path_factory.mktemp("pack")
    table = table_of(lengths)
    src = write_parquet_shards(str(base / "src"), table, shards=2, row_group_size=7)
    stats = run_pack(src, str(base / "out"), seed, max_length=L, max_examples_per_row=K, long=long)["stats"]
    packed = unpack(str(base / "out"))
    want = examples_of(table)
    rows = read_dir(str(base / "out"))
    assert max(rows.column("length").to_pylist(), default=0) <= L
    assert max(rows.column("num_examples").to_pylist(), default=0) <= min(K or L, L)  # also with empty examples
    assert rows.schema.field("segment_ids").type == rows.schema.field("positions").type == pa.list_(pa.int8())
    too_long = {k for k, (tokens, _, _) in want.items() if len(tokens) > L}
    if long == "drop":
        assert set(packed) == set(want) - too_long and stats["examples_dropped"]["long"] == len(too_long)
        assert all(len(p) == 1 and p[0][:2] == want[k][:2] and p[0][3] == want[k][2] for k, p in packed.items())
    else:
        assert set(packed) == set(want) and stats["examples_split"] == len(too_long)
        for key, pieces in packed.items():
            pieces.sort(key=lambda p: p[2])
            assert [p[2] for p in pieces] == [i * L for i in range(len(pieces))]
            assert all(len(p[0]) <= L for p in pieces)
            assert sum((p[0] for p in pieces), []) == want[key][0]
            assert sum((p[1] for p in pieces), []) == want[key][1]
    assert stats["rows"] == rows.num_rows and stats["real_steps"] == sum(rows.column("length").to_pylist())


def test_a_row_holds_at_most_max_length_examples_so_segment_ids_fit_their_type(tmp_path):
    """300 examples of 0 steps and 3 of 1 to 3: best-fit would put all 303 in one row of L = 8, segment ids up to
    303, which int8 (what holds L) does not; a row holds at most L examples instead."""
    src = write_parquet_shards(str(tmp_path / "src"), table_of([0] * 300 + [1, 2, 3]), shards=1)
    stats = run_pack(src, str(tmp_path / "out"), max_length=8)["stats"]
    assert max(int(k) for k in stats["examples_per_row"]) == 8 and stats["rows"] == stats["rows_lower_bound"] == 38
    packed = unpack(str(tmp_path / "out"))  # checks every row's segment ids and positions
    assert sorted(packed) == sorted(f"ex-{i:05d}" for i in range(303))


@pytest.mark.parametrize("max_length, step_type", [(1, pa.int8()), (127, pa.int8()), (128, pa.int16()),
                                                   (32767, pa.int16()), (32768, pa.int32()),
                                                   (MAX_LENGTH_LIMIT, pa.int32())])
def test_per_step_columns_take_the_smallest_signed_type_holding_max_length(max_length, step_type):
    schema = pa.schema([("tokens", pa.list_(pa.int64()))])
    options = PackOptions(max_length=max_length)
    out = OP.output_schema(options, schema)
    assert out.field("segment_ids").type == out.field("positions").type == pa.list_(step_type)
    assert out.field("cu_seqlens").type == pa.list_(pa.int32())


@pytest.fixture
def packed_src(tmp_path) -> str:
    return write_parquet_shards(str(tmp_path / "src"), table_of(np.random.default_rng(3).integers(1, 50, 120)),
                                shards=2, row_group_size=25)


def test_rows_are_full_and_stats_state_the_bound(tmp_path, packed_src):
    stats = run_pack(packed_src, str(tmp_path / "out"), max_length=64, batch_size=4)["stats"]
    assert stats["rows_in"] == stats["examples_packed"] == 120
    assert stats["rows"] >= stats["rows_lower_bound"] and stats["packing_efficiency"] > 0.9
    assert stats["packing_efficiency"] == round(stats["real_steps"] / (stats["rows"] * 64), 6)
    assert sum(stats["examples_per_row"].values()) == stats["rows"]
    assert stats["candidates"][stats["method"]] == stats["rows"]
    assert stats["batches"] == -(-stats["rows"] // 4)


def test_same_seed_same_rows_other_seed_other_rows(tmp_path, packed_src):
    keys = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        run_pack(packed_src, str(tmp_path / name), seed, max_length=64, batch_size=4)
        keys[name] = read_dir(str(tmp_path / name)).column("key").to_pylist()
    assert keys["a"] == keys["b"] and keys["a"] != keys["c"]
    assert sorted(map(tuple, keys["a"])) != sorted(map(tuple, keys["c"]))  # other rows, not only another order


def test_pad_to_max_length_and_max_tokens(tmp_path, packed_src):
    run_pack(packed_src, str(tmp_path / "a"), max_length=64, pad_to_max_length=True)
    assert {len(t) for t in read_dir(str(tmp_path / "a")).column("segment_ids").to_pylist()} == {64}
    stats = run_pack(packed_src, str(tmp_path / "b"), max_length=64, batch_size=None, max_tokens=200)["stats"]
    out = read_dir(str(tmp_path / "b"))
    for b in range(stats["batches"]):
        rows = out.filter(pa.compute.equal(out.column("batch"), b))
        assert rows.num_rows * len(rows.column("tokens")[0]) <= 200


def test_long_examples_stop_the_run_naming_the_first(tmp_path):
    src = write_parquet_shards(str(tmp_path / "src"), table_of([3, 9, 4, 12]), shards=1)
    with pytest.raises(InputError, match=r"part-00000.parquet, row 1, column 'tokens': 9 steps, more than "
                                         r"--max-length 8 \(pass --split-long"):
        run_pack(src, str(tmp_path / "out"), max_length=8)
    assert not os.path.exists(tmp_path / "out")


def test_load_gives_padded_batch_arrays(tmp_path, packed_src):
    run_pack(packed_src, str(tmp_path / "out"), max_length=64, batch_size=4)
    batch = next(iter(batchtool.load(str(tmp_path / "out"))))
    width = batch["tokens"].shape[1]
    assert batch["tokens"].shape == batch["segment_ids"].shape == batch["positions"].shape == (4, width)
    assert batch["frames"].shape == (4, width, 2) and batch["length"].max() == width
    assert [len(c) for c in batch["cu_seqlens"]] == (batch["num_examples"] + 1).tolist()


def _script():
    spec = importlib.util.spec_from_file_location("train_packed", os.path.join(REPO, "scripts", "train_packed.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_attention_over_a_packed_row_equals_each_example_alone(tmp_path, packed_src):
    """The block-diagonal causal mask from segment_ids keeps examples apart: NumPy (and PyTorch's
    scaled_dot_product_attention where installed) give each example the outputs it gets alone."""
    run_pack(packed_src, str(tmp_path / "out"), max_length=64, batch_size=4)
    script = _script()
    assert script.check(str(tmp_path / "out"), batches=2) < 1e-5
    batch = next(iter(batchtool.load(str(tmp_path / "out"))))
    flat, cu, longest = script.varlen_inputs(batch)
    assert cu[-1] == len(flat) == batch["length"].sum() and longest == max(np.diff(cu))


# --- the options: one schema for the command line and pipeline files -------------------------------------

@pytest.mark.parametrize("given, cli, toml", [
    ({"max_length": 8, "batch_size": 0}, "--batch-size 0: must be positive", "key 'batch-size' = 0: must be positive"),
    ({"max_length": 4000, "batch_size": 1_000_000, "pad_to_max_length": True},
     "--batch-size 1000000 x --max-length 4000 padded steps exceed 2,147,483,647",
     "batch-size 1000000 x max-length 4000 padded steps exceed 2,147,483,647"),
    ({"max_length": 8, "max_tokens": 8, "split_long": True, "drop_long": True},
     "give at most one of --split-long and --drop-long", "give at most one of split-long and drop-long"),
])
def test_option_errors_name_the_option_in_each_vocabulary(given, cli, toml):
    with pytest.raises(OptionError) as caught:
        PackOptions(**given)
    assert caught.value.rendered("cli").startswith(cli) and caught.value.rendered("toml").startswith(toml)


def test_pad_values_as_pairs_a_list_or_a_table():
    kind = {f.name: decl.value for f, decl in fields(PackOptions)}["pad_value"]
    assert kind.parse("pad_value", "tokens=-1") == ("tokens=-1",)
    assert kind.parse("pad_value", ["tokens=-1", "words=<pad>"]) == ("tokens=-1", "words=<pad>")
    assert kind.parse("pad_value", {"tokens": -1, "words": "<pad>"}) == ("tokens=-1", "words=<pad>")
    with pytest.raises(OptionError, match=r"expected COL=V pairs, got list \[1\]"):
        kind.parse("pad_value", [1])


def test_the_manifest_records_the_options_as_one_long_word():
    options = PackOptions(max_length=8, sequence=("tokens",), drop_long=True, max_tokens=64, pad_value=("tokens=1",))
    assert options.recorded() == {"max_length": 8, "sequences": ("tokens",), "max_examples_per_row": None,
                                  "long": "drop", "batch_size": None, "max_tokens": 64, "pad_to_max_length": False,
                                  "pad_values": ("tokens=1",)}
    defaulted = PackOptions(max_length=8, columns=("key",)).recorded()
    assert defaulted["batch_size"] == 8 and defaulted["max_tokens"] is None and defaulted["columns"] == ("key",)
    renamed = PackOptions(max_length=8, batch_size=2, output_column=(("length", "steps"),))
    assert renamed.recorded()["output_columns"] == {"length": "steps"}


@pytest.mark.parametrize("schema, sequence, message", [
    (pa.schema([("key", pa.string())]), None, "no list column to pack: pass --sequence COL"),
    (pa.schema([("tokens", pa.list_(pa.int64()))]), ("words",), "--sequence words: no such column (available: tokens)"),
    (pa.schema([("tokens", pa.list_(pa.int64())), ("length", pa.float64())]), None,
     "column 'length' is also an output column of pack; name pack's otherwise with --output-column length=NEW_NAME"),
    (pa.schema([("positions", pa.list_(pa.int64()))]), None,
     "column 'positions' is also an output column of pack; name pack's otherwise with --output-column "
     "positions=NEW_NAME"),
])
def test_columns_are_checked_against_the_schema(schema, sequence, message):
    with pytest.raises(SchemaError) as caught:
        resolve_columns(PackOptions(max_length=8, batch_size=2, sequence=sequence), schema)
    assert message in str(caught.value)


def test_pipeline_keys_in_every_form_write_what_the_command_writes(tmp_path, parquet_src, run_cli):
    args = ["--max-length", "128", "--split-long", "--batch-size", "4", "--sequence", "tokens", "--pad-value",
            "tokens=-1", "--columns", "key,label", "--seed", "3", "-q"]
    assert run_cli("pack", parquet_src, tmp_path / "cli", *args).exit_code == 0
    for i, keys in enumerate(['sequence = ["tokens"]\npad-value = {tokens = -1}\ncolumns = ["key", "label"]',
                              'sequence = "tokens"\npad-value = ["tokens=-1"]\ncolumns = "key,label"']):
        pipeline = tmp_path / f"p{i}.toml"
        pipeline.write_text(f'seed = 3\n[input]\npath = "{parquet_src}"\n[[stage]]\nop = "pack"\nmax-length = 128\n'
                            f'split-long = true\nbatch-size = 4\n{keys}\n[output]\npath = "{tmp_path / str(i)}"\n')
        assert run_cli("run", pipeline, "-q").exit_code == 0
        assert data_bytes(str(tmp_path / str(i))) == data_bytes(str(tmp_path / "cli"))
