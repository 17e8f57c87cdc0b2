"""`resample`: each example a Poisson(rate) number of times, rates proportional to a weight, or rejection sampling."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool import rng
from batchtool.budget import row_nbytes
from batchtool.dataset import Chunk, Dataset, ReadReport
from batchtool.errors import InputError, SchemaError, UsageError
from batchtool.engines import with_engine
from batchtool.job import JobResult, RunSettings, open_source, write_job
from batchtool.ops.shuffle import manifest_options
from batchtool.output import OutputOptions
from batchtool.runner import ordered_map

STAGE = "resample"
DEFAULT_RATE_COLUMN = "resample_rate"
MAX_RATE = float(1 << 32)
"""The largest rate (expected copies of one example): about 4.3 billion copies of a row is surely a mistake,
and Poisson counts stay exact integers far below 2**53."""
PIECE_BYTES = 16 << 20
"""Output Arrow bytes one work item builds: an input chunk whose copies come to more (than this and than the
chunk itself) is written as several row groups of about this size, so a rate never decides memory."""
Locate = Callable[[int], str]


@dataclass(frozen=True)
class ResampleOptions:
    """Exactly one of: `rate` (a constant or a column), `weight` with `overall_rate`, `accept_prob`."""

    rate: float | str | None = None
    weight: str | None = None
    overall_rate: float | None = None
    running_mean: bool = False
    mean_decay: float = 0.999
    warmup: int = 10
    rate_column: str = DEFAULT_RATE_COLUMN
    accept_prob: str | None = None

    def __post_init__(self) -> None:
        chosen = [flag for flag, value in (("--rate", self.rate), ("--weight", self.weight),
                                           ("--accept-prob", self.accept_prob)) if value is not None]
        if len(chosen) != 1:
            raise UsageError("give exactly one of --rate, --weight (with --overall-rate) or --accept-prob"
                             + (f" (got {', '.join(chosen)})" if chosen else ""))
        if isinstance(self.rate, float) and not (math.isfinite(self.rate) and 0 <= self.rate <= MAX_RATE):
            raise UsageError(f"--rate {self.rate}: must be a finite rate >= 0 and at most {MAX_RATE:.10g} (expected "
                             "copies of each example), or a column name")
        if (self.weight is None) != (self.overall_rate is None):
            raise UsageError("--weight and --overall-rate go together (rate = overall rate * weight / mean weight)")
        if self.overall_rate is not None and not (math.isfinite(self.overall_rate)
                                                  and 0 <= self.overall_rate <= MAX_RATE):
            raise UsageError(f"--overall-rate {self.overall_rate}: must be a finite rate >= 0 and at most "
                             f"{MAX_RATE:.10g}")
        if self.running_mean and self.weight is None:
            raise UsageError("--running-mean applies to --weight (it estimates the mean weight as data streams)")
        if not 0.0 <= self.mean_decay < 1.0:
            raise UsageError(f"--mean-decay {self.mean_decay}: must be in [0, 1)")
        if self.warmup < 1:
            raise UsageError(f"--warmup {self.warmup}: must be at least 1")
        if not self.rate_column:
            raise UsageError("--rate-column: must be a non-empty column name")

    @property
    def mode(self) -> str:
        return "rate" if self.rate is not None else "weighted" if self.weight is not None else "accept"

    @property
    def column(self) -> str | None:
        """The input column the mode reads, if any."""
        if self.mode == "rate":
            return self.rate if isinstance(self.rate, str) else None
        return self.weight if self.mode == "weighted" else self.accept_prob


def parse_rate(text: str) -> float | str:
    """--rate: a number is a constant rate, anything else names a column."""
    try:
        return float(text)
    except ValueError:
        return text


# -- per-chunk functions (pure; shared with stratify) -------------------------------------------------------


def checked_values(chunk: Chunk, column: str, locate: Locate, what: str, high: float = math.inf) -> np.ndarray:
    """A numeric column as float64; a null, NaN, infinite, negative or > `high` value is an error naming
    its file, row and column."""
    arr = chunk.data.column(column)
    t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        raise SchemaError(f"column {column!r} is {t}: {what} needs a numeric column")
    values = pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
    bad = ~(np.isfinite(values) & (values >= 0) & (values <= high))
    if bad.any():
        i = int(np.argmax(bad))
        value = "null" if not arr[i].is_valid else repr(arr[i].as_py())
        expected = f"in [0, {high:.10g}]" if math.isfinite(high) else "finite and >= 0"
        raise InputError(f"{locate(chunk.ids[i])}, column {column!r}: {what} {value} "
                         f"(expected {expected}; {int(bad.sum())} such value(s) in this chunk)")
    return values


def copy_runs(copies: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output rows [start, stop) of "row i written copies[i] times, copies consecutive", as runs: the input
    rows, how many of each one's copies fall in the range, and the copy number of each run's first."""
    ends = np.cumsum(copies)
    if stop <= start:
        return (np.zeros(0, dtype=np.int64),) * 3
    rows = np.arange(np.searchsorted(ends, start, side="right"), np.searchsorted(ends, stop - 1, side="right") + 1)
    begins = ends[rows] - copies[rows]
    low = np.maximum(begins, start)
    counts = np.minimum(ends[rows], stop) - low
    keep = counts > 0
    return rows[keep], counts[keep], (low - begins)[keep]


def repeat_rows(chunk: Chunk, copies: np.ndarray, seed: int, stage: str, start: int = 0,
                stop: int | None = None) -> Chunk:
    """Output rows [start, stop) (default: all) of each row copies[i] times, copies consecutive.

    Copy 0 keeps the example id; copy j >= 1 gets a derived id (keyed hash of id and j), so that a
    later reorder (balanced batches, a pipeline's shuffle) keys each copy's draws separately.
    """
    copies = np.asarray(copies, dtype=np.int64)
    stop = int(copies.sum()) if stop is None else stop
    if start == 0 and stop == len(copies) and len(copies) and copies.min() == 1 and copies.max() == 1:
        return chunk
    rows, counts, first = copy_runs(copies, start, stop)
    out = chunk.take(np.repeat(rows, counts))
    copy_no = np.arange(out.num_rows) - np.repeat(np.cumsum(counts) - counts - first, counts)
    extra = copy_no > 0
    if extra.any():
        ids = out.ids.copy()
        ids[extra] = rng.keyed_hash(seed, stage + "/copy", ids[extra], draw=copy_no[extra].astype(np.uint64))
        out = Chunk(out.data, ids)
    return out


def piece_bounds(copies: np.ndarray, row_bytes: np.ndarray, limit: float) -> list[tuple[int, int]]:
    """Cut the output rows (row i written copies[i] times) into consecutive ranges of at most `limit`
    bytes each (at least one row), given each input row's bytes."""
    pieces, start, position, held = [], 0, 0, 0.0
    for n, size in zip(copies.tolist(), np.maximum(row_bytes, 1.0).tolist()):
        while n:
            if held and held + size > limit:
                pieces.append((start, position))
                start, held = position, 0.0
            take = min(n, max(1, int((limit - held) // size)))
            position, held, n = position + take, held + take * size, n - take
    return [*pieces, (start, position)]


@dataclass(frozen=True)
class Copies:
    """One input chunk and how many times each of its rows is written; cheap until its pieces are built."""

    chunk: Chunk
    copies: np.ndarray
    rates: np.ndarray | None = None
    """Per input row, the effective rate written with each of its copies (--weight), else None."""

    def pieces(self) -> Iterator[Piece]:
        """The output in pieces of at most PIECE_BYTES (or the input chunk's bytes, if more): one piece
        unless the copies multiply the chunk past that. The last piece carries the chunk's input rows."""
        total = int(self.copies.sum())
        limit = max(PIECE_BYTES, self.chunk.data.nbytes)
        bounds = [(0, total)]
        if total and int(self.copies.max()) * self.chunk.data.nbytes > limit:
            bounds = piece_bounds(self.copies, row_nbytes(self.chunk.data), limit)
        for i, (start, stop) in enumerate(bounds):
            yield Piece(self, start, stop, self.chunk.num_rows if i == len(bounds) - 1 else 0)


@dataclass(frozen=True)
class Piece:
    """Output rows [start, stop) of one chunk's copies, and the input rows they complete (for progress)."""

    source: Copies
    start: int
    stop: int
    rows: int

    def build(self, seed: int, stage: str, rate_column: str | None = None) -> Chunk:
        """The piece's rows, with each one's effective rate appended as `rate_column` if given."""
        src = self.source
        out = repeat_rows(src.chunk, src.copies, seed, stage, self.start, self.stop)
        if rate_column is not None:
            rows, counts, _ = copy_runs(src.copies, self.start, self.stop)
            out = Chunk(out.data.append_column(rate_column, pa.array(np.repeat(src.rates[rows], counts),
                                                                     pa.float64())), out.ids)
        return out


def merged(results: Iterable[tuple[Copies, Tally]], tally: Tally) -> Iterator[Copies]:
    """The copies of each chunk in order, merging each one's statistics into `tally` as it passes."""
    for copies, stats in results:
        tally.merge(stats)
        yield copies


def pieces(copies: Iterable[Copies]) -> Iterator[Piece]:
    """Every chunk's output pieces, in order."""
    for c in copies:
        yield from c.pieces()


def example_rates(chunk: Chunk, options: ResampleOptions, mean_weight: float | None, locate: Locate) -> np.ndarray:
    """Expected copies of each row: the rate (constant or column), overall_rate * weight / mean weight,
    or the acceptance probability. A rate above MAX_RATE is an error naming its row."""
    if options.mode == "rate":
        if isinstance(options.rate, float):
            return np.full(chunk.num_rows, options.rate)
        return checked_values(chunk, options.rate, locate, "rate", high=MAX_RATE)
    if options.mode == "accept":
        return checked_values(chunk, options.accept_prob, locate, "acceptance probability", high=1.0)
    weights = checked_values(chunk, options.weight, locate, "weight")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rates = np.where(weights > 0, options.overall_rate * weights / (mean_weight or 0.0), 0.0)
    bad = np.flatnonzero(~(rates <= MAX_RATE))
    if len(bad):
        i = int(bad[0])
        raise InputError(f"{locate(chunk.ids[i])}, column {options.weight!r}: weight {weights[i]:g} gives rate "
                         f"{rates[i]:g} (--overall-rate {options.overall_rate:g} x weight / mean weight "
                         f"{mean_weight or 0.0:g}), more than {MAX_RATE:.10g} copies of one example")
    return rates


def resample_copies(chunk: Chunk, rates: np.ndarray, options: ResampleOptions, seed: int) -> Copies:
    """How many times each row of one chunk is written: Poisson(rate) (exact for any rate), or once with
    probability p for --accept-prob. Weighted mode keeps the rates, written with each copy."""
    if options.mode == "accept":
        copies = (rng.uniform(seed, STAGE, chunk.ids) < rates).astype(np.int64)
    else:
        copies = rng.poisson(seed, STAGE, chunk.ids, rates)
    return Copies(chunk, copies, rates if options.mode == "weighted" else None)


# -- statistics -------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """Statistics of some chunks: a kernel returns its chunk's, the driver merges them in input order (`merge`).
    Counts add exactly, float sums go through math.fsum, min and max commute."""

    counts: dict[str, Any] = field(default_factory=dict)
    sums: dict[str, list[float]] = field(default_factory=dict)
    low: dict[str, float] = field(default_factory=dict)
    high: dict[str, float] = field(default_factory=dict)

    def add(self, **counts: Any) -> None:
        for name, value in counts.items():
            self.counts[name] = self.counts.get(name, 0) + value

    def add_values(self, name: str, values: np.ndarray) -> None:
        if len(values):
            self.sums.setdefault(name, []).append(float(values.sum()))
            self.low[name] = min(self.low.get(name, math.inf), float(values.min()))
            self.high[name] = max(self.high.get(name, -math.inf), float(values.max()))

    def merge(self, other: Tally) -> None:
        """Add another chunk's statistics to these (the driver, in input order)."""
        self.add(**other.counts)
        for name, sums in other.sums.items():
            self.sums.setdefault(name, []).extend(sums)
            self.low[name] = min(self.low.get(name, math.inf), other.low[name])
            self.high[name] = max(self.high.get(name, -math.inf), other.high[name])

    def summary(self, name: str, count: int) -> dict[str, float]:
        if name not in self.sums:
            return {}
        return {"mean": math.fsum(self.sums[name]) / max(count, 1), "min": self.low[name], "max": self.high[name]}

    def count(self, name: str) -> int:
        return int(self.counts.get(name, 0))


def copy_stats(copies: np.ndarray) -> Tally:
    """The counts every resampling command reports: rows in and out, examples dropped and duplicated."""
    tally = Tally()
    tally.add(rows_in=len(copies), rows_out=int(copies.sum()), examples_dropped=int((copies == 0).sum()),
              examples_duplicated=int((copies >= 2).sum()))
    tally.add_values("copies", copies)
    return tally


def copy_summary(tally: Tally) -> dict[str, Any]:
    rows_in = tally.count("rows_in")
    return {"rows_in": rows_in, "examples_dropped": tally.count("examples_dropped"),
            "examples_duplicated": tally.count("examples_duplicated"),
            "copies_per_example": tally.summary("copies", rows_in)}


# -- the mean weight: first pass or weighted_resample's running estimate ------------------------------------


def mean_weight(dataset: Dataset, column: str, threads: int) -> float:
    """Mean of the weight column over the whole dataset (one pass over that column only)."""
    def partial(task: Callable[[], Chunk]) -> tuple[float, int]:
        chunk = task()
        return float(checked_values(chunk, column, dataset.locate, "weight").sum()), chunk.num_rows

    sums, rows = [], 0
    for total, count in ordered_map(partial, dataset.tasks([column]), threads):
        sums.append(total)
        rows += count
    mean = math.fsum(sums) / rows if rows else 0.0
    if mean <= 0:
        raise InputError(f"{dataset.src}: column {column!r}: every weight is 0, so no example can be sampled")
    return mean


class RunningMean:
    """weighted_resample's streaming estimate of the mean weight, updated once per chunk in input order (so it
    is deterministic): with c the chunk number from 1, d_c = min((c - 1) / min(c, warmup), decay) and
    mean_c = d_c * mean_(c-1) + (1 - d_c) * (mean weight of chunk c); chunk c uses mean_c."""

    def __init__(self, column: str, decay: float, warmup: int, locate: Locate) -> None:
        self.column, self.decay, self.warmup, self.locate = column, decay, warmup, locate
        self.mean = 0.0

    def __call__(self, chunks: Iterable[Chunk]) -> Iterator[tuple[Chunk, float]]:
        for count, chunk in enumerate(chunks, start=1):
            real_decay = min((count - 1) / min(count, self.warmup), self.decay)
            weights = checked_values(chunk, self.column, self.locate, "weight")
            batch_mean = float(weights.mean()) if len(weights) else 0.0
            self.mean = real_decay * self.mean + (1.0 - real_decay) * batch_mean
            yield chunk, self.mean


# -- entry point --------------------------------------------------------------------------------------------


@with_engine
def resample(src: str, dst: str, options: ResampleOptions, output: OutputOptions, run: RunSettings = RunSettings(),
             *, seed: int = 0, format: str | None = None, skip_corrupt: bool = False) -> JobResult:
    """Resample SRC into DST; copies of an example are consecutive rows (a later `shuffle` spreads them)."""
    dataset = open_source(src, dst, output, format=format, skip_corrupt=skip_corrupt)
    return write_resampled(prepare(dataset, options, seed, run.threads), dst, output, run)


def prepare(dataset: Dataset, options: ResampleOptions, seed: int, threads: int) -> Resampling:
    """Check the columns and, for --weight without --running-mean, take the mean weight in a first pass."""
    dataset.check_columns([options.column] if options.column else None)
    if options.mode == "weighted" and options.rate_column in dataset.schema.names:
        raise UsageError(f"--rate-column {options.rate_column!r}: SRC already has this column; choose another name")
    mean = None
    if options.mode == "weighted" and not options.running_mean:
        mean = mean_weight(dataset, options.weight, threads)
    return Resampling(dataset, options, seed, mean)


@dataclass
class Resampling:
    """Resampling one dataset's chunks: the options, the first pass's mean weight, and the statistics merged
    so far (on the driver)."""

    dataset: Dataset
    options: ResampleOptions
    seed: int
    mean: float | None
    tally: Tally = field(default_factory=Tally)

    def __post_init__(self) -> None:
        o = self.options
        self.running = RunningMean(o.weight, o.mean_decay, o.warmup, self.dataset.locate) if o.running_mean else None

    @property
    def schema(self) -> pa.Schema:
        """The output schema: the input's, plus the rate column in weighted mode."""
        schema = self.dataset.schema
        if self.options.mode == "weighted":
            schema = schema.append(pa.field(self.options.rate_column, pa.float64()))
        return schema

    def items(self, threads: int, report: ReadReport,
              columns: Sequence[str] | None = None) -> Iterable[tuple[Chunk, float | None]]:
        """(chunk, mean weight) in input order; --running-mean updates the mean chunk by chunk."""
        chunks = self.dataset.chunks(columns, threads, report)
        return self.running(chunks) if self.running else ((chunk, self.mean) for chunk in chunks)

    def copies(self, item: tuple[Chunk, float | None]) -> tuple[Copies, Tally]:
        """One chunk's copies per row and its statistics; pure, runs on the engine's workers."""
        chunk, chunk_mean = item
        rates = example_rates(chunk, self.options, chunk_mean, self.dataset.locate)
        copies = resample_copies(chunk, rates, self.options, self.seed)
        tally = copy_stats(copies.copies)
        tally.add_values("rate", rates)
        return copies, tally

    def pieces(self, threads: int, report: ReadReport, columns: Sequence[str] | None = None) -> Iterator[Piece]:
        """The output in order, as pieces of bounded size (see Copies.pieces); the chunks' statistics are
        merged into `tally` here, in input order."""
        return pieces(merged(ordered_map(self.copies, self.items(threads, report, columns), threads), self.tally))

    def build(self, piece: Piece) -> tuple[Chunk, int]:
        """One piece's output rows and the input rows it completes."""
        rate_column = self.options.rate_column if self.options.mode == "weighted" else None
        return piece.build(self.seed, STAGE, rate_column), piece.rows

    def work(self, piece: Piece) -> tuple[list[pa.RecordBatch], int]:
        out, rows = self.build(piece)
        return ([out.data] if out.num_rows else []), rows

    def stats(self) -> dict[str, Any]:
        options, tally = self.options, self.tally
        rows_in = tally.count("rows_in")
        result = {"mode": options.mode, **copy_summary(tally),
                  ("accept_prob" if options.mode == "accept" else "rate"): tally.summary("rate", rows_in)}
        if options.mode == "weighted":
            result.update(overall_rate=options.overall_rate, rate_column=options.rate_column,
                          mean_weight=self.running.mean if self.running else self.mean,
                          mean_weight_source="running estimate (final)" if self.running else "first pass")
        return result


def write_resampled(resampling: Resampling, dst: str, output: OutputOptions, run: RunSettings,
                    *, write: Callable[..., JobResult] = write_job) -> JobResult:
    """The pass that writes (`write` is write_job, or a wrapper when resample is a pipeline's last stage)."""
    report = ReadReport()
    return write(command="resample", options=manifest_options(resampling.options, output), seed=resampling.seed,
                 dataset=resampling.dataset, dst=dst, output=output, schema=resampling.schema,
                 items=resampling.pieces(run.threads, report), work=resampling.work, stats=resampling.stats,
                 run=run, report=report)


__all__ = ["Copies", "MAX_RATE", "Piece", "ResampleOptions", "Resampling", "RunningMean", "Tally", "example_rates",
           "merged", "parse_rate", "pieces", "prepare", "repeat_rows", "resample", "resample_copies", "write_resampled"]
