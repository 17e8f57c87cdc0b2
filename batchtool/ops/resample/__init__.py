"""`resample`: each example a Poisson(rate) number of times, rates proportional to a weight, or rejection sampling.

This package declares the op (DECLARED); ops.resample.op runs it (each chunk's rates and copies, the first pass or
running estimate of the mean weight)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchtool.core.options import Column, Flag, Integer, Number, NumberOrColumn, option
from batchtool.core.registry import exports
from batchtool.ops import names as own
from batchtool.ops.base import Declaration, Depends, Kind, OptionError, Shape

DEFAULT_RATE_COLUMN = "resample_rate"
OUTPUT_COLUMNS = (DEFAULT_RATE_COLUMN,)
"""resample's own column (with --weight): each output row's effective rate."""


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
        from batchtool.ops.copies import MAX_RATE  # here, not at the top: ops/copies.py imports NumPy, --help must not

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


__getattr__ = exports(globals(), {name: ("batchtool.ops.resample.op", name) for name in (
    "OP", "STAGE", "Resample", "ResamplePlan", "RunningMean", "checked_values", "example_rates", "resample_copies")})

__all__ = ["DECLARED", "DEFAULT_RATE_COLUMN", "OP", "STAGE", "Resample", "ResampleOptions", "ResamplePlan",
           "RunningMean", "checked_values", "example_rates", "resample_copies"]
