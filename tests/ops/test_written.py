"""What a manifest says of its writer: the op, its options and statistics (a `run` pipeline's last stage's), and the
traits that op declares of its output, which inspect and batchtool.load read instead of the op's name."""

from __future__ import annotations

import pytest

from batchtool.core.errors import InputError
from batchtool.ops import OPERATIONS
from batchtool.ops.base import OutputRows
from batchtool.ops.written import Written, written_by


def test_each_op_declares_what_a_row_of_its_output_is():
    declared = {name: op.output_rows for name, op in OPERATIONS.items()}
    assert {name: rows for name, rows in declared.items() if rows is not OutputRows.EXAMPLES} == {
        "bucket": OutputRows.PADDED, "pack": OutputRows.PACKED, "segment": OutputRows.SEGMENTS}


def test_a_command_s_manifest_gives_its_op_options_stats_and_traits():
    manifest = {"command": "segment", "options": {"batch_size": 4}, "stats": {"lanes": 4}}
    assert written_by(manifest) == Written("segment", {"batch_size": 4}, "options", {"lanes": 4}, OutputRows.SEGMENTS)
    assert written_by(manifest).lanes
    bucket = written_by({"command": "bucket", "options": {}, "stats": {}})
    assert bucket.rows is OutputRows.PADDED and not bucket.lanes


def test_a_pipeline_s_manifest_gives_its_last_stage():
    manifest = {"command": "run",
                "options": {"stages": [{"op": "shuffle"}, {"op": "segment", "batch-size": 2}]},
                "stats": {"rows_in": 9, "stages": [{"stage": 1}, {"stage": 2, "world_size": 2}]}}
    assert written_by(manifest) == Written("segment", {"op": "segment", "batch-size": 2}, "options.stages[1]",
                                        {"stage": 2, "world_size": 2}, OutputRows.SEGMENTS)


def test_no_manifest_an_unknown_op_or_a_malformed_one_has_no_traits():
    assert written_by(None) == Written(None, {}, "options", {}, None)
    future = written_by({"command": "dedup", "options": {"key": "id"}, "stats": []})
    assert future == Written("dedup", {"key": "id"}, "options", {}, None) and not future.lanes
    for stages in (None, [], [3], "segment"):
        assert written_by({"command": "run", "options": {"stages": stages}}).rows is None
    assert written_by({"command": ["segment"], "options": 5}) == Written(None, {}, "options", {}, None)


def test_an_option_is_found_by_its_field_name_in_a_command_or_a_pipeline():
    command = written_by({"command": "bucket", "options": {"batch_size": 8, "order": "sorted"}})
    stage = written_by({"command": "run", "options": {"stages": [{"op": "bucket", "batch-size": 8}]}})
    assert command.option("batch_size") == stage.option("batch_size") == 8
    assert command.option("order") == "sorted" and stage.option("order") is None


def test_lane_streams_and_the_rank_layout_are_the_manifest_s():
    segment = written_by({"command": "segment", "options": {}, "stats": {"world_size": 4}})
    assert (segment.streams, segment.ranks) == (4, None)
    pack = written_by({"command": "pack", "options": {}, "stats": {"world_size": 4, "rank_layout": {"world_size": 2}}})
    assert (pack.streams, pack.ranks) == (1, 2)
    with pytest.raises(InputError, match=r"stats.rank_layout is \{'world_size': 0\}"):
        _ = written_by({"command": "pack", "stats": {"rank_layout": {"world_size": 0}}}).ranks
