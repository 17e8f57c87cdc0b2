"""`resample`: each example a Poisson(rate) number of times, rates proportional to a weight, or rejection sampling."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from batchtool.core.errors import InputError, OptionInputError, SchemaError
from batchtool.ops import names as own
from batchtool.ops.base import (Context, Declaration, Depends, Kind, Operation, OptionError, Pass, Shape,
                               manifest_options, need_columns)
from batchtool.core.options import Column, Flag, Integer, Number, NumberOrColumn, option

STAGE = "resample"
DEFAULT_RATE_COLUMN = "resample_rate"
OUTPUT_COLUMNS = (DEFAULT_RATE_COLUMN,)
"""resample's own column (with --weight): each output row's effective rate."""
Locate = Callable[[int], str]

if TYPE_CHECKING:  # the kernels are imported where the op runs: `resample --help` imports no arrays
    import numpy as np
    import pyarrow as pa

    from batchtool.core.tally import Tally
    from batchtool.io.dataset import Chunk
    from batchtool.ops.copies import Copies
    from batchtool.io.output import OutputOptions


@dataclass(frozen=True)
class ResampleOptions:
    """Exactly one of: `rate` (a constant or a column), `weight` with `overall_rate`, `accept_prob`."""

    rate: float | str | None = option("Each example appears Poisson(rate) times: a number or a column.",
                                      NumberOrColumn(), None)
    weight: str | None = option("Rate proportional to this column (with --overall-rate).", Column(), None)
    overall_rate: float | None = option("Mean rate over the data for --weight.", Number(), None)
    running_mean: bool = option("Estimate the mean weight as the data streams (as "
                                "tf.contrib.training.weighted_resample) instead of a first pass.", Flag(), False)
    mean_decay: float = option("Decay of --running-mean.", Number(), 0.999)
    warmup: int = option("Chunks during which --running-mean is the plain mean.", Integer(), 10)
    rate_column: str = option("With --weight: the column of each output row's effective rate (the same as "
                              f"--output-column {DEFAULT_RATE_COLUMN}=NAME).", Column(), DEFAULT_RATE_COLUMN)
    accept_prob: str | None = option("Rejection sampling: keep each example with this probability.", Column(), None)
    output_column: tuple[tuple[str, str], ...] = own.output_column(OUTPUT_COLUMNS)

    def __post_init__(self) -> None:
        from batchtool.ops.copies import MAX_RATE

        modes = ("rate", "weight", "accept_prob")
        chosen = [name for name in modes if getattr(self, name) is not None]
        if len(chosen) != 1:
            raise OptionError(chosen[-1] if chosen else "rate", "give exactly one of {rate}, {weight} (with "
                              "{overall_rate}) or {accept_prob}" + (f" (got {', '.join('{%s}' % c for c in chosen)})"
                                                                    if chosen else ""),
                              mentions=[*modes, "overall_rate"])
        if isinstance(self.rate, float) and not (math.isfinite(self.rate) and 0 <= self.rate <= MAX_RATE):
            raise OptionError("rate", f"must be a finite rate >= 0 and at most {MAX_RATE:.10g} (expected copies of "
                              "each example), or a column name", value=str(self.rate))
        if (self.weight is None) != (self.overall_rate is None):
            raise OptionError("weight" if self.weight is None else "overall_rate", "{weight} and {overall_rate} go "
                              "together (rate = overall rate * weight / mean weight)",
                              mentions=["weight", "overall_rate"])
        if self.overall_rate is not None and not (math.isfinite(self.overall_rate)
                                                  and 0 <= self.overall_rate <= MAX_RATE):
            raise OptionError("overall_rate", f"must be a finite rate >= 0 and at most {MAX_RATE:.10g}",
                              value=str(self.overall_rate))
        if self.running_mean and self.weight is None:
            raise OptionError("running_mean", "{running_mean} applies to {weight} (it estimates the mean weight as "
                              "data streams)",
                              mentions=["weight"])
        if not 0.0 <= self.mean_decay < 1.0:
            raise OptionError("mean_decay", "must be in [0, 1)", value=str(self.mean_decay))
        if self.warmup < 1:
            raise OptionError("warmup", "must be at least 1", value=str(self.warmup))
        if not self.rate_column:
            raise OptionError("rate_column", "must be a non-empty column name")
        own.check_names(OUTPUT_COLUMNS, self.output_column)
        if self.output_column and self.rate_column != DEFAULT_RATE_COLUMN:
            raise OptionError("rate_column", "{rate_column} and {output_column} name the same column; give one",
                              mentions=["output_column"])

    @property
    def rate_name(self) -> str:
        """The name of the rate column (--output-column, or --rate-column)."""
        return own.named(OUTPUT_COLUMNS, self.output_column or ((DEFAULT_RATE_COLUMN, self.rate_column),))[
            DEFAULT_RATE_COLUMN]

    @property
    def mode(self) -> str:
        return "rate" if self.rate is not None else "weighted" if self.weight is not None else "accept"

    @property
    def column(self) -> str | None:
        """The input column the mode reads, if any."""
        if self.mode == "rate":
            return self.rate if isinstance(self.rate, str) else None
        return self.weight if self.mode == "weighted" else self.accept_prob


# -- per-chunk functions (pure; shared with stratify) -------------------------------------------------------


def checked_values(chunk: Chunk, column: str, locate: Locate, what: str, high: float = math.inf) -> np.ndarray:
    """A numeric column as float64; a null, NaN, infinite, negative or > `high` value is an error naming
    its file, row and column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

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


def example_rates(chunk: Chunk, options: ResampleOptions, mean_weight: float | None, locate: Locate) -> np.ndarray:
    """Expected copies of each row: the rate (constant or column), overall_rate * weight / mean weight,
    or the acceptance probability. A rate above MAX_RATE is an error naming its row."""
    import numpy as np

    from batchtool.ops.copies import MAX_RATE

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
        raise OptionInputError("overall_rate", f"weight {weights[i]:g} gives rate {rates[i]:g} ({{overall_rate}} "
                               f"{options.overall_rate:g} x weight / mean weight {mean_weight or 0.0:g}), more than "
                               f"{MAX_RATE:.10g} copies of one example",
                               where=f"{locate(chunk.ids[i])}, column {options.weight!r}: ")
    return rates


def resample_copies(chunk: Chunk, rates: np.ndarray, options: ResampleOptions, seed: int) -> Copies:
    """How many times each row of one chunk is written: Poisson(rate) (exact for any rate), or once with
    probability p for --accept-prob. Weighted mode keeps the rates, written with each copy."""
    import numpy as np

    from batchtool.core import rng
    from batchtool.ops.copies import Copies

    if options.mode == "accept":
        copies = (rng.uniform(seed, STAGE, chunk.ids) < rates).astype(np.int64)
    else:
        copies = rng.poisson(seed, STAGE, chunk.ids, rates)
    if options.mode != "weighted":
        return Copies(chunk, copies, seed, STAGE)
    return Copies(chunk, copies, seed, STAGE, rates, options.rate_name)


# -- statistics -------------------------------------------------------------------------------------------


# -- the mean weight: first pass or weighted_resample's running estimate ------------------------------------


class RunningMean:
    """weighted_resample's streaming estimate of the mean weight, updated once per chunk in input order (so it
    is deterministic): with c the chunk number from 1, d_c = min((c - 1) / min(c, warmup), decay) and
    mean_c = d_c * mean_(c-1) + (1 - d_c) * (mean weight of chunk c); chunk c uses mean_c."""

    def __init__(self, column: str, decay: float, warmup: int, locate: Locate) -> None:
        self.column, self.decay, self.warmup, self.locate = column, decay, warmup, locate
        self.mean, self.count = 0.0, 0

    def update(self, chunk: Chunk) -> float:
        """The estimate chunk `chunk` uses (the chunks before it already seen, in order)."""
        self.count += 1
        real_decay = min((self.count - 1) / min(self.count, self.warmup), self.decay)
        weights = checked_values(chunk, self.column, self.locate, "weight")
        batch_mean = float(weights.mean()) if len(weights) else 0.0
        self.mean = real_decay * self.mean + (1.0 - real_decay) * batch_mean
        return self.mean


# -- the operation ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResamplePlan:
    """What each chunk's kernel needs: the options, the seed, the mean weight (first pass, or the running
    estimate for that chunk) and how to name a row in an error."""

    options: ResampleOptions
    seed: int
    mean: float | None
    locate: Locate


def _weights(column: str, context: Context, chunk: Chunk) -> Tally:
    """The first pass's statistics of a chunk: its rows and weights."""
    from batchtool.core.tally import Tally

    tally = Tally.of(rows=chunk.num_rows)
    tally.add_values("weight", checked_values(chunk, column, context.locate, "weight"))
    return tally


def _shape(options: ResampleOptions) -> Shape:
    """Its rows' kind; a running mean's rates follow the chunks."""
    return Shape(Kind.ROWS, Depends.CHUNKS if options.running_mean else Depends.ORDER)


DECLARED = Declaration(
    "resample",
    summary="""Resample SRC by Poisson rate, relative weight or acceptance probability and write DST.

    Copies of an example are consecutive rows; pipe the result through `shuffle` to spread them.""",
    example="batchtool resample sample_data/parquet /tmp/weighted --weight weight --overall-rate 1.0",
    options=ResampleOptions,
    seeded=True,
    shaped=_shape)


class Resample(Operation[ResampleOptions, ResamplePlan], declared=DECLARED):
    def recorded(self, options: ResampleOptions, schema: pa.Schema, output: OutputOptions) -> dict[str, Any]:
        """The manifest's options: every field, the rate column's name as `rate_column` (and its --output-column
        as every op records one)."""
        out = manifest_options(options, output)
        del out[own.FIELD]
        return {**out, "rate_column": options.rate_name, **own.recorded(options.output_column)}

    def output_schema(self, options: ResampleOptions, schema: pa.Schema) -> pa.Schema:
        import pyarrow as pa

        if options.column:
            need_columns(schema, {"rate": "rate", "weighted": "weight", "accept": "accept_prob"}[options.mode],
                         [options.column])
        if options.mode != "weighted":
            return schema
        own.refuse_clashes("resample", {DEFAULT_RATE_COLUMN: options.rate_name}, schema.names)
        return schema.append(pa.field(options.rate_name, pa.float64()))

    def input_columns(self, options: ResampleOptions, columns: list[str] | None) -> list[str] | None:
        if columns is None:
            return None
        kept = [c for c in columns if not (options.mode == "weighted" and c == options.rate_name)]
        return list(dict.fromkeys([*kept, *([options.column] if options.column else [])]))

    def first_pass(self, options: ResampleOptions, schema: pa.Schema) -> Pass | None:
        """--weight without --running-mean: the mean weight, in a pass over that column only."""
        from batchtool.core.tally import Tally

        if options.weight is None or options.running_mean:
            return None
        return Pass([options.weight], Tally, functools.partial(_weights, options.weight))

    def plan(self, options: ResampleOptions, context: Context, stats: Tally | None) -> ResamplePlan:
        mean = None
        if stats is not None:
            mean = stats.total("weight") / stats.count("rows") if stats.count("rows") else 0.0
            if mean <= 0:
                raise InputError(f"{context.src}: column {options.weight!r}: every weight is 0, so no example can "
                                 "be sampled")
        return ResamplePlan(options, context.seed, mean, context.locate)

    def per_chunk(self, plan: ResamplePlan) -> Callable[[Chunk], ResamplePlan] | None:
        o = plan.options
        if not o.running_mean:
            return None
        running = RunningMean(o.weight, o.mean_decay, o.warmup, plan.locate)
        return lambda chunk: replace(plan, mean=running.update(chunk))

    def kernel(self, plan: ResamplePlan, chunk: Chunk) -> tuple[Copies, Tally]:
        """One chunk's copies per row (built into rows piece by piece) and its statistics."""
        from batchtool.ops.copies import copy_stats

        rates = example_rates(chunk, plan.options, plan.mean, plan.locate)
        copies = resample_copies(chunk, rates, plan.options, plan.seed)
        tally = copy_stats(copies.copies)
        tally.add_values("rate", rates)
        if plan.options.running_mean:
            tally.latest["mean_weight"] = plan.mean
        return copies, tally

    def report(self, plan: ResamplePlan, stats: Tally) -> dict[str, Any]:
        from batchtool.ops.copies import copy_summary

        o, rows_in = plan.options, stats.count("rows_in")
        result = {"mode": o.mode, **copy_summary(stats),
                  ("accept_prob" if o.mode == "accept" else "rate"): stats.summary("rate", rows_in)}
        if o.mode == "weighted":
            result.update(overall_rate=o.overall_rate, rate_column=o.rate_name,
                          mean_weight=stats.latest.get("mean_weight", 0.0) if o.running_mean else plan.mean,
                          mean_weight_source="running estimate (final)" if o.running_mean else "first pass")
        return result

    def expected(self, plan: ResamplePlan, rows_in: int | None, stats: Any = None) -> tuple[int | None, dict[str, Any]]:
        o = plan.options
        rate = o.rate if isinstance(o.rate, float) else o.overall_rate
        if rate is None or rows_in is None:
            return None, {"mean_weight": plan.mean} if plan.mean is not None else {}
        return None, {"expected_rows": round(rate * rows_in)}


OP = Resample()


__all__ = ["OP", "ResampleOptions", "RunningMean", "example_rates", "resample_copies"]
