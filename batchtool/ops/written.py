"""What a batchtool output's manifest says of its writer: the op, its options and statistics, the traits the op declares
of its output (Written.rows, Written.lanes), and the names it gave its own columns (bucket's `length`, segment's
`sequence`, ...): what `batchtool.load`, `inspect` and `check` read the output by."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchtool.core.errors import InputError, OptionError
from batchtool.io.formats.base import BATCH_COLUMN
from batchtool.ops import OPERATIONS
from batchtool.ops.base import OutputRows
from batchtool.ops.names import FIELD, RECORDED, OutputColumns, named
from batchtool.core.options import fields


@dataclass(frozen=True)
class Written:
    """What wrote a batchtool output, as its manifest records it: the op (the command's, or for `run` its last stage's),
    its options (keyed as recorded) and where they sit, its statistics, and the traits the op declares of its output,
    so that readers branch on what the output is, never on which op wrote it."""

    op: str | None
    options: Mapping[str, Any]
    at: str
    """Where the options sit in the manifest (`options`, `options.stages[2]`)."""
    stats: Mapping[str, Any]
    rows: OutputRows | None
    """What a row of the output is (Operation.output_rows); None: no manifest, or an op this version does not know."""

    @property
    def lanes(self) -> bool:
        """Its batches continue each other (lanes carry state): read in order, never shuffled, no lane split."""
        return self.rows is OutputRows.SEGMENTS

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
        size = layout.get("world_size") if isinstance(layout, Mapping) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise InputError(f"the manifest's stats.rank_layout is {layout!r:.80}, expected "
                             "{\"world_size\": N} with N a positive integer")
        return size

    def option(self, field: str) -> Any:
        """An option by its field name (`batch_size`), as the command recorded it or the pipeline file gave it
        (`batch-size`)."""
        if self.at == "options":
            return self.options.get(field)
        return {k.replace("-", "_"): v for k, v in self.options.items()}.get(field)


def written_by(manifest: Mapping[str, Any] | None) -> Written:
    """The op that wrote a batchtool output and its traits, from its manifest (a manifest of any version: the traits are
    those the op it names declares today)."""
    if not manifest:
        return Written(None, {}, "options", {}, None)
    options, stats = _mapping(manifest.get("options")), _mapping(manifest.get("stats"))
    if manifest.get("command") != "run":
        return _written(manifest.get("command"), options, "options", stats)
    stages, ran = options.get("stages"), stats.get("stages")
    if not isinstance(stages, list) or not stages or not isinstance(stages[-1], Mapping):
        return Written(None, {}, "options.stages", {}, None)
    last = ran[-1] if isinstance(ran, list) and ran else {}
    return _written(stages[-1].get("op"), stages[-1], f"options.stages[{len(stages) - 1}]", last)


def _written(op: Any, options: Mapping[str, Any], at: str, stats: Any) -> Written:
    operation = OPERATIONS.get(op) if isinstance(op, str) else None
    return Written(op if isinstance(op, str) else None, options, at, _mapping(stats),
                   operation.output_rows if operation else None)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def written_names(manifest: Mapping[str, Any] | None, path: str) -> dict[str, str]:
    """{own column: its name} of a batchtool output's writer (bucket's `length`, segment's `sequence`, ...): the
    defaults, with the renames its manifest (file `path`) records; {} for another writer or no manifest. A malformed
    record is an InputError naming the file and the key."""
    writer = written_by(manifest)
    op, options, at = writer.op, writer.options, writer.at
    operation = OPERATIONS.get(op) if op is not None else None
    kind = next((decl.value for f, decl in fields(operation.options) if f.name == FIELD), None) if operation else None
    if not isinstance(kind, OutputColumns):
        return {}
    pipeline = at != "options"
    key = "output-column" if pipeline else RECORDED
    given = options.get(key)
    if given is None or given == []:
        return named(kind.roles, ())
    if not pipeline and isinstance(given, list) and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                                                        for p in given):
        given = dict(map(tuple, given))  # bucket's [[OUT, NAME], ...]
    try:
        return named(kind.roles, kind.parse(FIELD, given))
    except OptionError as exc:
        raise InputError(f"{path}: {at}.{key} is malformed ({exc.problem})") from None


def batched_rows(manifest: Mapping[str, Any] | None, path: str) -> str | None:
    """The op that wrote a batchtool output whose rows are not examples but padded, packed or segmented batch rows
    (it numbers them in a `batch` column of its own: bucket, pack, segment); None for any other input."""
    return written_by(manifest).op if BATCH_COLUMN in written_names(manifest, path) else None


__all__ = ["Written", "batched_rows", "written_by", "written_names"]
