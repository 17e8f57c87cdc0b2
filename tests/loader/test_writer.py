"""What the writer of an output fixes for the loader, from the traits its manifest's op declares (not its name): lanes
that carry state, or batches balanced for a number of ranks, each with what to do."""

from __future__ import annotations

from batchtool.loader.writer import fixed
from batchtool.ops.written import written_by


def test_a_pipeline_ending_in_segment_fixes_each_rank_s_lanes():
    writer = written_by({"command": "run", "options": {"stages": [{"op": "segment", "batch-size": 3}]},
                         "stats": {"stages": [{"world_size": 2, "lanes": 3}]}})
    assert writer.lanes and writer.streams == 2 and writer.option("batch_size") == 3
    assert fixed(writer)(1, 4) == ("segment output's lanes carry state from batch to batch, so each rank's stream is "
                                   "fixed when it is written; write it again with `segment --world-size 4` (and "
                                   "start that run from its first batch)")


def test_pack_balanced_for_some_ranks_says_which():
    writer = written_by({"command": "pack", "options": {}, "stats": {"rank_layout": {"world_size": 2}}})
    assert "pack output balanced for --world-size 2" in fixed(writer)(2, 3)
    assert fixed(writer)(2, 3).endswith("`--world-size 3`")


def test_other_outputs_have_independent_batches():
    for manifest in (None, {"command": "bucket", "options": {"batch_size": 2}, "stats": {"world_size": 3}},
                     {"command": "dedup", "options": {}, "stats": {}}):
        writer = written_by(manifest)
        assert not writer.lanes and writer.streams == 1 and fixed(writer) is None
