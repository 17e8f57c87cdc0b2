"""Memory an option or a value makes batchtool hold at once, checked against --memory (or, where a command has no
--memory, --max-record-bytes) before allocating.

Options multiply memory (a batch of --batch-size rows padded to --num-unroll steps, a shuffle buffer,
one bookkeeping entry per bucket) and so can values (a length that sizes a histogram). Operations
estimate those bytes from their options, the first-pass statistics and the first input chunk, and
call `check_fits` before allocating, so an impossible request ends in one error naming the option (or
the row) instead of a MemoryError, or the machine swapping. Output that is legitimately large
(many copies of a row) is streamed in bounded pieces instead: see `row_nbytes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from batchtool.core.errors import NamesOptions, OptionError, UsageError

if TYPE_CHECKING:  # (the measuring functions import them: --help reads the defaults above alone)
    import numpy as np
    import pyarrow as pa

DEFAULT_MEMORY = 1 << 30
"""--memory's default: the budget of a run (spills, batches, what its input decompresses to)."""
SHARE = 8
"""One option-sized allocation may take an eighth of --memory: a worker thread holds about two (a padded
batch and its encoding) and the writer one, so with the default two threads and the spill parts that
is about the budget (measured: segment holds ~6.5 padded batches at its peak)."""
FLOOR = 64 << 20
"""Allocations up to this size always pass: the process needs more than this to run at all, so a --memory
below it only sizes the spill parts."""
DEFAULT_MAX_RECORD_BYTES = 16 << 20
"""--max-record-bytes' default: the largest record read, and what one unit of input may decompress to
where there is no --memory. Decoding a record takes a few times its size for ordinary data, up to about 60 times
for millions of tiny features, so this keeps even a hostile record near the default --memory (1GB)."""
HISTOGRAM_BYTES = 40
"""Per length up to the longest: a length histogram (8 bytes a length, in each chunk's statistics and their merge)
and the arrays planning derives from it."""


def human_bytes(n: float) -> str:
    """Bytes as a person reads them: 1.5 GB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def check_record_limit(limit: int) -> int:
    """limit itself, or UsageError if it cannot be a record size limit (--max-record-bytes)."""
    if limit < 1:
        raise UsageError(f"--max-record-bytes {limit}: must be at least 1 byte")
    return limit


def allowed(memory: int) -> int:
    """Bytes one option-sized allocation may take under --memory."""
    return max(memory // SHARE, FLOOR)


def check_fits(field: str, what: str, need: float, memory: int, fix: str, *, value: object = None,
          mentions: Sequence[str] = (), where: str = "", error: type[NamesOptions] = OptionError) -> None:
    """Stop before allocating `need` bytes for `what` (an option's use, or a row) if the budget does not
    allow it; `fix` says what to change. The error names option `field` (given `value`, if any); `{field}`
    placeholders in `what` and `fix` name options as NamesOptions renders them (--memory always can be)."""
    if need > allowed(memory):
        raise error(field, f"{what} takes about {human_bytes(need)} at once, more than {{memory}} "
                           f"{human_bytes(memory)} allows ({human_bytes(allowed(memory))}); {fix}",
                    value=None if value is None else str(value), mentions=(*mentions, "memory"), where=where)


def check_rows(field: str, value: int, rows: int | None, bytes_per_row: float, memory: int) -> None:
    """One batch of `value` rows (or of all `rows`, when known and fewer) of `bytes_per_row` each."""
    held = value if rows is None else min(value, rows)
    check_fits(field, f"one batch of {held:,} rows", held * bytes_per_row, memory,
          f"give a smaller {{{field}}} or a larger {{memory}}", value=value)


def row_bytes(sample: pa.RecordBatch | None, sequences: tuple[str, ...] | list[str]) -> tuple[float, float]:
    """(bytes per row outside the sequence columns, bytes per step of the sequence columns together),
    measured on a sample chunk; steps are counted in the first sequence column."""
    import pyarrow.compute as pc

    if sample is None or sample.num_rows == 0:
        return 0.0, 0.0
    steps = int(pc.sum(pc.list_value_length(sample.column(sequences[0]))).as_py() or 0) if sequences else 0
    seq_bytes = sum(sample.column(c).nbytes for c in sequences)
    return (sample.nbytes - seq_bytes) / sample.num_rows, seq_bytes / steps if steps else 0.0


def row_nbytes(batch: pa.RecordBatch) -> np.ndarray:
    """Each row's own Arrow bytes (values, offsets and validity, through nested lists): what one more
    copy of it costs. Exact for numbers, strings, binaries and lists of them; other types count
    their average row."""
    import numpy as np

    total = np.zeros(batch.num_rows)
    for column in batch.columns:
        total += _array_row_nbytes(column)
    return total


def _array_row_nbytes(arr: pa.Array) -> np.ndarray:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    t, n = arr.type, len(arr)
    validity = 0.125 if arr.buffers()[0] is not None else 0.0
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        values = np.concatenate([[0.0], np.cumsum(_array_row_nbytes(arr.values))])
        return values[offsets[1:]] - values[offsets[:-1]] + _offset_width(t) + validity
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        inner = _array_row_nbytes(arr.values)[arr.offset * size:(arr.offset + n) * size]
        return inner.reshape(n, size).sum(axis=1) + validity
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        lengths = pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False)
        return lengths + _offset_width(t) + validity
    if pa.types.is_boolean(t):
        return np.full(n, 0.125 + validity)
    try:
        return np.full(n, t.bit_width / 8 + validity)
    except ValueError:  # not a fixed-width type (structs, dictionaries, ...)
        return np.full(n, arr.nbytes / max(n, 1))


def _offset_width(t: pa.DataType) -> int:
    import pyarrow as pa

    return 8 if pa.types.is_large_list(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t) else 4
