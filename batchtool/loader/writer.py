"""What wrote a batch-shard output, as its manifest says, and what that fixes for the loader: lanes that carry state
(segment) or batches laid out by step for a number of ranks (pack --world-size)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from batchtool.core.errors import InputError

LANE_COMMANDS = ("segment",)
"""Operations whose batches continue each other (lanes carry state): read in order, never shuffled."""


@dataclass(frozen=True)
class Writer:
    """The operation that wrote the batches, with its options and statistics: the command's own, or for a
    `run` pipeline its last stage's (whose options are keyed by flag name: `batch-size` becomes `batch_size`)."""

    op: str | None
    options: dict
    stats: dict

    @staticmethod
    def of(manifest: dict | None) -> Writer:
        if not manifest:
            return Writer(None, {}, {})
        options, stats = manifest.get("options") or {}, manifest.get("stats") or {}
        if manifest.get("command") != "run":
            return Writer(manifest.get("command"), options, stats)
        stage = (options.get("stages") or [{}])[-1]
        return Writer(stage.get("op"), {k.replace("-", "_"): v for k, v in stage.items()},
                       (stats.get("stages") or [{}])[-1])

    @property
    def lanes(self) -> bool:
        return self.op in LANE_COMMANDS

    @property
    def streams(self) -> int:
        """Lane streams (`segment --world-size`); 1 for independent batches and older outputs."""
        return int(self.stats.get("world_size") or 1) if self.lanes else 1

    @property
    def ranks(self) -> int | None:
        """The world size the batches were laid out for by step (`pack --world-size`: batch k is rank k % N's at
        step k // N, the step's rows balanced across the N ranks), as the manifest's rank_layout says; else None."""
        layout = self.stats.get("rank_layout")
        if layout is None:
            return None
        size = layout.get("world_size") if isinstance(layout, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise InputError(f"the manifest's stats.rank_layout is {layout!r:.80}, expected {{\"world_size\": N}} with N "
                             "a positive integer")
        return size

    def fixed(self) -> Callable[[int, int], str] | None:
        """Why each rank's stream is fixed when written, and what to do, for two world sizes that differ (a saved
        state's or the output's, and the loader's); None where batches are independent and any number of ranks can
        share them."""
        op, written = self.op, self.ranks
        if self.lanes:
            return lambda _, asked: (f"{op} output's lanes carry state from batch to batch, so each rank's stream is "
                                     f"fixed when it is written; write it again with `segment --world-size {asked}` "
                                     "(and start that run from its first batch)")
        if written is not None:
            def balanced(saved: int, asked: int) -> str:
                other = asked if asked != written else saved
                return (f"{op} output balanced for --world-size {written}: each step's rows are balanced across "
                        f"exactly {written} ranks; load it with world_size={written}, or run {op} again with "
                        f"`--world-size {other}`")
            return balanced
        return None


__all__ = ["LANE_COMMANDS", "Writer"]
