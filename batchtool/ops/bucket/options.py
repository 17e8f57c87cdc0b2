"""What `bucket` is asked to do: its options, declared once for the command line and pipeline files, with the
checks that need no data."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from batchtool.ops.base import OptionError

from batchtool.core.options import Choice, Column, ColumnList, Flag, Integer, Pairs, Value, option, shown
from batchtool.ops import names
from batchtool.ops.boundaries import check_boundaries
from batchtool.ops.targets import TargetSpec, check_target
from batchtool.ops.targets import Target

ORDERS = ("shuffle", "sorted")
COSTS = ("linear", "quadratic")
PADDINGS = ("stored", "on-load")
"""--padding: batches written padded, or with their real lengths and padded by batchtool.load."""
OUTPUT_COLUMNS = ("batch", "bucket", "length", "mask", "length_2")
"""bucket's own columns (`batch` marks the batches for load and check; the manifest records its name); `length_2`,
the second length's steps, only with two --length."""


# -- option values ---------------------------------------------------------------------------------------------


class Integers(Value):
    """Integers, comma-separated: `64,128,256` (a TOML integer, a list of integers, or that string)."""

    metavar = "N[,N...]"

    def parse(self, field: str, value: Any) -> tuple[int, ...]:
        if isinstance(value, int) and not isinstance(value, bool):
            return (Integer().parse(field, value),)
        if isinstance(value, list) and all(_is_scalar(v) for v in value):
            value = ",".join(str(v) for v in value)
        if not isinstance(value, str):
            raise OptionError(field, f"expected comma-separated integers, got {shown(value)}")
        try:
            parts = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise OptionError(field, "expected comma-separated integers, e.g. 64,128,256", value=repr(value)) from None
        return tuple(Integer().parse(field, part) for part in parts)


class Lengths(Value):
    """--length: one column (one-length buckets, recorded as the name), or repeated, one per dimension of a grid of
    buckets (recorded as the list)."""

    multiple = True
    metavar = "COL"

    def parse(self, field: str, value: Any) -> str | tuple[str, ...]:
        names = ColumnList().parse(field, value)
        return names[0] if len(names) == 1 else names


class CostCoefficients(Value):
    """--cost-coefficients A,B,C: three non-negative numbers (a TOML list of numbers, or that string)."""

    metavar = "A,B,C"

    def parse(self, field: str, value: Any) -> tuple[float, float, float]:
        if isinstance(value, str):
            try:
                value = [float(part) for part in value.split(",")]
            except ValueError:
                raise OptionError(field, "expected three numbers A,B,C, e.g. 1,1,0", value=repr(value)) from None
        if (not isinstance(value, list) or len(value) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise OptionError(field, f"expected three numbers A,B,C, got {shown(value)}")
        if not all(math.isfinite(v) and v >= 0 for v in value) or not any(value):
            raise OptionError(field, "coefficients must be finite, non-negative and not all zero",
                              value=",".join(str(v) for v in value))
        return (float(value[0]), float(value[1]), float(value[2]))


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


# -- options ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketOptions:
    """What `bucket` computes; validated on construction (problems name the option's field)."""

    length: str | tuple[str, ...] | None = option(
        "Length to bucket by: an integer column, or a list column's steps (default: the first sequence column). "
        "Give it twice for a grid of buckets over two lengths: the i-th --length is the steps of the i-th "
        "--sequence.", Lengths(), None)
    sequence: tuple[str, ...] = option("A sequence (list) column to pad; repeat for several, which must agree in "
                                       "length (default: every list column); with two --length, one per length "
                                       "(default: the two --length list columns).", ColumnList(dedupe=True), ())
    boundaries: tuple[int, ...] | None = option("Bucket edges b0,b1,...: buckets < b0, [b_i, b_i+1), >= b_last.",
                                                Integers(), None)
    auto_buckets: int | None = option("Choose K buckets from the length distribution to minimise padding.",
                                      Integer(metavar="K"), None)
    bucket_column: str | None = option("Integer column giving each example's bucket (with --num-buckets).",
                                       Column(), None)
    num_buckets: int | None = option("Buckets of --bucket-column: values in [0, N).", Integer(), None)
    batch_size: tuple[int, ...] | None = option("Rows per batch, or one size per bucket.",
                                                Integers(metavar="B[,B...]"), None)
    max_tokens: int | None = option("Instead of --batch-size: at most T padded elements (rows x padded length) "
                                    "per batch.", Integer(metavar="T"), None)
    max_rows: int | None = option("With --max-tokens: also at most this many rows per batch.", Integer(), None)
    cost: str = option("With --max-tokens, what a batch costs: rows x padded length (linear), or rows x padded "
                       "length squared (quadratic, as attention costs), so short buckets get more rows.",
                       Choice(COSTS), "linear")
    cost_coefficients: tuple[float, float, float] | None = option(
        "With two --length and --max-tokens: a row padded to (in, out) steps costs A*in^2 + B*in*out + C*out "
        "(instead of --cost's in + out or in^2 + out^2).", CostCoefficients(), None)
    drop_oversize: bool = option("Drop (and count) examples that exceed --max-tokens alone, instead of stopping.",
                                 Flag(), False)
    pad_to_boundary: bool = option("Pad to the longest length the bucket admits (boundary - 1), not the batch's "
                                   "longest.", Flag(), False)
    pad_value: tuple[str, ...] = option("Pad value of a sequence column (default 0, '' for strings); repeatable.",
                                        Pairs("COL=V"), ())
    mask: bool = option("Add a 'mask' list<bool> column, true on real steps.", Flag(), False)
    padding: str = option("stored: write every batch padded (zero-copy [B, T, ...] epochs); on-load: write the "
                          "sequences' real steps (less disk for uncompressed Arrow IPC) and let batchtool.load pad "
                          "each batch as it reads it (the same arrays, slower epochs; other readers see the real "
                          "lists).",
                          Choice(PADDINGS), "stored")
    output_column: tuple[tuple[str, str], ...] = names.output_column(OUTPUT_COLUMNS)
    keep: str | None = option("Boolean column: only rows where it is true are bucketed.", Column(), None)
    drop_remainder: bool = option("Drop (and count) each bucket's last, partial batch.", Flag(), False)
    balance: str | None = option("Every full batch of every bucket (with two --length, of every cell) holds each "
                                 "class's exact share of the batch "
                                 "(as tf.contrib.training.stratified_sample, but exact per batch); rows no balanced "
                                 "batch can take are dropped and counted.", Column(metavar="LABEL_COL"), None)
    target: Target = option("With --balance: class proportions P0,P1,..., CLASS=PROB pairs, or uniform.",
                            TargetSpec(), "uniform")
    oversample: bool = option("With --balance: repeat rarer classes (keyed, deterministic) instead of dropping rows "
                              "of the common ones.", Flag(), False)
    order: str = option("shuffle: seeded random order within buckets and across batches; sorted: ascending length, "
                        "buckets in order (for inference).", Choice(ORDERS), "shuffle")

    def __post_init__(self) -> None:
        modes = ("boundaries", "auto_buckets", "bucket_column")
        given = [name for name in modes if getattr(self, name) is not None]
        if len(given) != 1:
            raise OptionError(given[-1] if given else "boundaries", "give exactly one of {boundaries}, "
                              "{auto_buckets}, {bucket_column}" + (f" (got {' and '.join('{%s}' % m for m in given)})"
                                                                   if given else ""), mentions=modes)
        if self.boundaries is not None:
            check_boundaries(self.boundaries)
        if self.auto_buckets is not None and self.auto_buckets < 1:
            raise OptionError("auto_buckets", "must be at least 1", value=str(self.auto_buckets))
        if (self.bucket_column is None) != (self.num_buckets is None):
            raise OptionError("bucket_column" if self.bucket_column is None else "num_buckets",
                              "{bucket_column} and {num_buckets} go together", mentions=["bucket_column", "num_buckets"])
        if self.num_buckets is not None and self.num_buckets < 1:
            raise OptionError("num_buckets", "must be at least 1", value=str(self.num_buckets))
        self._check_batching()
        if self.pad_to_boundary and self.bucket_column is not None:
            raise OptionError("pad_to_boundary", "{pad_to_boundary} needs length buckets ({boundaries} or "
                              "{auto_buckets}), not {bucket_column}", mentions=modes)
        if self.padding not in PADDINGS:
            raise OptionError("padding", f"expected {' or '.join(PADDINGS)}", value=repr(self.padding))
        if self.order not in ORDERS:
            raise OptionError("order", f"expected {' or '.join(ORDERS)}", value=repr(self.order))
        self._check_balance()
        self._check_grid()
        names.check_names(OUTPUT_COLUMNS, self.output_column)

    @property
    def output_names(self) -> dict[str, str]:
        """Each output column's name: its own, or the one --output-column gives."""
        return names.named(OUTPUT_COLUMNS, self.output_column)

    def _check_balance(self) -> None:
        if self.balance is None:
            for name, given in (("target", self.target != "uniform"), ("oversample", self.oversample)):
                if given:
                    raise OptionError(name, f"{{{name}}} goes with {{balance}} LABEL_COLUMN", mentions=["balance"])
            return
        check_target(self.target)
        if self.order != "shuffle":
            raise OptionError("balance", f"{{balance}} with {{order}} {self.order}: balanced batches are drawn at "
                              "random (use {order} shuffle)", mentions=["order"])

    @property
    def lengths(self) -> tuple[str, ...]:
        """The --length columns given, one per dimension (none: the first sequence column's steps)."""
        if self.length is None:
            return ()
        return (self.length,) if isinstance(self.length, str) else tuple(self.length)

    @property
    def grid(self) -> bool:
        """Two --length: a grid of buckets over both lengths."""
        return len(self.lengths) == 2

    def _check_grid(self) -> None:
        """Two lengths: one --sequence per length, buckets chosen by --auto-buckets, and the one-length features
        a grid does not have refused (one line each)."""
        if len(self.lengths) > 2:
            raise OptionError("length", f"{len(self.lengths)} lengths given: give one, or two for a grid of buckets",
                              value=",".join(self.lengths))
        if not self.grid:
            if self.cost_coefficients is not None:
                raise OptionError("cost_coefficients", "{cost_coefficients} needs two {length} columns (in, out)",
                                  mentions=["length"])
            return
        if self.sequence and len(self.sequence) != 2:
            raise OptionError("sequence", f"{len(self.sequence)} {{sequence}} columns for 2 {{length}} columns: give "
                              "one sequence per length, in the same order", value=",".join(self.sequence),
                              mentions=["length"])
        refused = {"boundaries": self.boundaries is not None, "bucket_column": self.bucket_column is not None,
                   "mask": self.mask}
        name = next((n for n, given in refused.items() if given), None)
        if name is not None:
            raise OptionError(name, f"{{{name}}} is not available with two {{length}} columns (a grid of buckets "
                              "takes {auto_buckets} K, no mask)", mentions=["length", "auto_buckets"])
        if self.cost_coefficients is not None and self.cost != "linear":
            raise OptionError("cost_coefficients", f"give {{cost}} {self.cost} or {{cost_coefficients}}, not both",
                              mentions=["cost"])
        if self.cost_coefficients is not None and self.max_tokens is None:
            raise OptionError("cost_coefficients", "{cost_coefficients} goes with {max_tokens}",
                              mentions=["max_tokens"])

    @property
    def known_classes(self) -> int | None:
        """--balance: the number of classes a --target list fixes (else the labels seen decide)."""
        return len(self.target) if isinstance(self.target, tuple) else None

    def _check_batching(self) -> None:
        if (self.batch_size is None) == (self.max_tokens is None):
            raise OptionError("batch_size", "give exactly one of {batch_size} and {max_tokens}",
                              mentions=["max_tokens"])
        for name, value in (("max_tokens", self.max_tokens), ("max_rows", self.max_rows)):
            if value is not None and value < 1:
                raise OptionError(name, "must be positive", value=str(value))
        if self.max_tokens is None and (self.max_rows is not None or self.drop_oversize):
            name = "max_rows" if self.max_rows is not None else "drop_oversize"
            raise OptionError(name, f"{{{name}}} goes with {{max_tokens}}", mentions=["max_tokens"])
        if self.cost not in COSTS:
            raise OptionError("cost", f"expected {' or '.join(COSTS)}", value=repr(self.cost))
        if self.cost != "linear" and self.max_tokens is None:
            raise OptionError("cost", f"{{cost}} {self.cost} goes with {{max_tokens}}", mentions=["max_tokens"])
        if self.batch_size is None:
            return
        text = ",".join(str(b) for b in self.batch_size)
        if not self.batch_size or min(self.batch_size) < 1:
            raise OptionError("batch_size", "batch sizes must be positive", value=text)
        if len(self.batch_size) > 1:
            if self.auto_buckets is not None:
                raise OptionError("batch_size", "one size per bucket needs fixed buckets ({boundaries} or "
                                  "{bucket_column}); {auto_buckets} takes one size", value=text,
                                  mentions=["boundaries", "bucket_column", "auto_buckets"])
            if len(self.batch_size) != self.bucket_count:
                raise OptionError("batch_size", f"{len(self.batch_size)} sizes for {self.bucket_count} buckets (give "
                                  "one size, or one per bucket)", value=text)

    @property
    def bucket_count(self) -> int | None:
        """Buckets fixed by the options (None for --auto-buckets, which may find fewer distinct lengths)."""
        if self.boundaries is not None:
            return len(self.boundaries) + 1
        return self.num_buckets


__all__ = ["COSTS", "ORDERS", "PADDINGS", "OUTPUT_COLUMNS", "BucketOptions", "CostCoefficients", "Integers", "Lengths"]
