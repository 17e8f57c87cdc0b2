"""The `resample` op's run: its Operation (its declaration, DECLARED, is the package's), each chunk's rates and
copies, and the mean weight's running estimate."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batchtool.core import rng
from batchtool.core.errors import InputError, OptionInputError, SchemaError
from batchtool.core.tally import Tally
from batchtool.io.dataset import Chunk
from batchtool.io.output import OutputOptions
from batchtool.ops import names as own
from batchtool.ops.base import Context, Operation, Pass, manifest_options, need_columns
from batchtool.ops.copies import MAX_RATE, Copies, copy_stats, copy_summary
from batchtool.ops.resample import DECLARED, DEFAULT_RATE_COLUMN, ResampleOptions

STAGE = "resample"
Locate = Callable[[int], str]


# -- per-chunk functions (pure) ----------------------------------------------------------------------------


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
        raise OptionInputError("overall_rate", f"weight {weights[i]:g} gives rate {rates[i]:g} ({{overall_rate}} "
                               f"{options.overall_rate:g} x weight / mean weight {mean_weight or 0.0:g}), more than "
                               f"{MAX_RATE:.10g} copies of one example",
                               where=f"{locate(chunk.ids[i])}, column {options.weight!r}: ")
    return rates


def resample_copies(chunk: Chunk, rates: np.ndarray, options: ResampleOptions, seed: int) -> Copies:
    """How many times each row of one chunk is written: Poisson(rate) (exact for any rate), or once with
    probability p for --accept-prob. Weighted mode keeps the rates, written with each copy."""
    if options.mode == "accept":
        copies = (rng.uniform(seed, STAGE, chunk.ids) < rates).astype(np.int64)
    else:
        copies = rng.poisson(seed, STAGE, chunk.ids, rates)
    if options.mode != "weighted":
        return Copies(chunk, copies, seed, STAGE)
    return Copies(chunk, copies, seed, STAGE, rates, options.rate_name)


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
    tally = Tally.of(rows=chunk.num_rows)
    tally.add_values("weight", checked_values(chunk, column, context.locate, "weight"))
    return tally


class Resample(Operation[ResampleOptions, ResamplePlan], declared=DECLARED):
    def recorded(self, options: ResampleOptions, schema: pa.Schema, output: OutputOptions) -> dict[str, Any]:
        """The manifest's options: every field, the rate column's name as `rate_column` (and its --output-column
        as every op records one)."""
        out = manifest_options(options, output)
        del out[own.FIELD]
        return {**out, "rate_column": options.rate_name, **own.recorded(options.output_column)}

    def output_schema(self, options: ResampleOptions, schema: pa.Schema) -> pa.Schema:
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
        rates = example_rates(chunk, plan.options, plan.mean, plan.locate)
        copies = resample_copies(chunk, rates, plan.options, plan.seed)
        tally = copy_stats(copies.copies)
        tally.add_values("rate", rates)
        if plan.options.running_mean:
            tally.latest["mean_weight"] = plan.mean
        return copies, tally

    def report(self, plan: ResamplePlan, stats: Tally) -> dict[str, Any]:
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

__all__ = ["OP", "STAGE", "Resample", "ResamplePlan", "RunningMean", "checked_values", "example_rates",
           "resample_copies"]
