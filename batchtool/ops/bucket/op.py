"""The `bucket` op's run: its Operation (its declaration, DECLARED, is the package's)."""

from __future__ import annotations

import functools
from dataclasses import asdict
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.io.dataset import Chunk
from batchtool.io.output import OutputOptions
from batchtool.io.stats import DatasetStats
from batchtool.ops.base import Context, Kind, Operation, OutputRows, Pass, Said
from batchtool.ops.boundaries import efficiency, expected_efficiency
from batchtool.ops.bucket import DECLARED, batches
from batchtool.ops.bucket.batches import output_schema
from batchtool.ops.bucket.options import BucketOptions
from batchtool.ops.bucket.plan import BucketPlan, LengthPass, batchable_counts, length_pass, make_plan, resolve_columns
from batchtool.ops.bucket.report import summary_lines
from batchtool.ops.regroup import Exchange, Input, Probe


def _no_lengths(options: BucketOptions) -> LengthPass:
    classes = np.zeros((0, 4 if options.grid else 0), dtype=np.int64)
    return LengthPass(DatasetStats(), classes if options.balance else None,
                      np.zeros((0, 3), dtype=np.int64) if options.grid else None)


def _lengths(options: BucketOptions, context: Context, chunk: Chunk) -> LengthPass:
    return length_pass(options, resolve_columns(options, context.schema), chunk, context.locate, context.memory)


class Bucket(Operation[BucketOptions, "BucketPlan"], declared=DECLARED):
    """bucket's definition: a first pass over the lengths plans the buckets; its regrouping scatters the rows to
    per-bucket spills and gives back padded batches, in a seeded order across buckets."""

    def output_schema(self, options: BucketOptions, schema: pa.Schema) -> pa.Schema:
        return output_schema(schema, resolve_columns(options, schema), options.mask, options.padding == "stored")

    def recorded(self, options: BucketOptions, schema: pa.Schema, output: OutputOptions) -> dict[str, Any]:
        return _manifest_options(options)

    def first_pass(self, options: BucketOptions, schema: pa.Schema) -> Pass:
        """The length histogram of the length column (the input's first list column unless --length names one),
        with --keep, --bucket-column and --balance's labels."""
        return Pass(resolve_columns(options, schema).first_pass, functools.partial(_no_lengths, options),
                    functools.partial(_lengths, options), desc="lengths")

    def plan(self, options: BucketOptions, context: Context, stats: LengthPass | None) -> BucketPlan:
        assert stats is not None
        return make_plan(options, resolve_columns(options, context.schema), stats, context.schema, context.seed,
                         context.memory, context.tasks)

    def regroup(self, plan: BucketPlan, input: Input, probe: Probe) -> Exchange:
        return batches.exchange(plan, input, probe)

    def expected(self, plan: BucketPlan, rows_in: int | None, scan: Any = None) -> tuple[int | None, dict[str, Any]]:
        """The buckets' rows from the first pass, and from the plan the batches and rows written (with --max-tokens
        and no --drop-remainder all rows; the batches depend on the order) and the expected padding efficiency."""
        options = plan.options
        rows = plan.rows_per_bucket()
        info: dict[str, Any] = {"boundaries": list(plan.boundaries) if plan.boundaries is not None else None,
                                "num_buckets": plan.num_buckets, "examples_per_bucket": rows.tolist()}
        rows_out: int | None = None
        if plan.grid is not None:
            grid = plan.grid
            info.update(boundaries=[list(grid.first), [list(b) for b in grid.second]], grid=grid.shape,
                        padding_efficiency=efficiency(int(grid.cell_steps().sum()), grid.bound()))
            size = grid.budget.batch_size
            if plan.balance is None and size is not None:
                full = rows // size if options.drop_remainder else -(-rows // size)
                info["batches"] = int(full.sum())
                return int(np.minimum(rows, full * size).sum()), info
            if plan.balance is None:
                return (None if options.drop_remainder else int(rows.sum())), info
        if plan.balance is not None:
            per_bucket, written = plan.balance.batches, plan.balance.written
            info.update(batches=sum(per_bucket), batches_per_bucket=per_bucket, batch_rows=[
                layout.batch_size for layout in plan.balance.layouts], class_rows_out=written.sum(axis=0).tolist(),
                examples_dropped_unbalanced=int(np.maximum(plan.balance.available - written, 0).sum()))
            rows_out = int(written.sum())
        elif options.batch_size is not None:
            sizes = np.array([b.batch_size for b in plan.budgets])
            full = rows // sizes if options.drop_remainder else -(-rows // sizes)
            info["batches"] = int(full.sum())
            rows_out = int(np.minimum(rows, full * sizes).sum())
        elif not options.drop_remainder:
            rows_out = int(rows.sum())
        if plan.boundaries is not None:
            info["padding_efficiency"] = expected_efficiency(batchable_counts(plan.first.stats, options),
                                                             plan.boundaries)
        return rows_out, info

    def said(self, stats: dict[str, Any]) -> Said:
        return Said(tuple(summary_lines(stats)))


RECORDED_AS = {"sequence": "sequences", "pad_value": "pad_values", "output_column": "output_columns"}
"""Fields the manifest records under the names bucket's options had before they were named after their flags."""
RECORDED_ORDER = ("length", "sequences", "boundaries", "auto_buckets", "bucket_column", "num_buckets", "batch_size",
                  "max_tokens", "max_rows", "drop_oversize", "pad_to_boundary", "pad_values", "mask", "keep",
                  "drop_remainder", "order", "cost", "output_columns", "balance", "target", "oversample")


def _manifest_options(options: BucketOptions) -> dict[str, Any]:
    """The manifest's options, as bucket has always recorded them: every field but tmp_dir, in their old names
    and order; `padding` only when it is on-load and `cost_coefficients` only when given, so that earlier
    outputs' manifests stay as they were (`length` is a list with two lengths)."""
    out = {RECORDED_AS.get(k, k): v for k, v in asdict(options).items() if k != "tmp_dir"}
    recorded = {k: out[k] for k in RECORDED_ORDER}
    if options.padding != "stored":
        recorded["padding"] = options.padding
    if options.cost_coefficients is not None:
        recorded["cost_coefficients"] = out["cost_coefficients"]
    return recorded


OP = Bucket()

__all__ = ["OP", "Bucket", "BucketOptions"]
