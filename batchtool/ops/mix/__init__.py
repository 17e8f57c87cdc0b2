"""`mix`: several sources (one dataset, batchtool.io.mixed) in exact proportions, shuffled or in batches that each hold
every source's share. It is stratify with the source column as the label and the weights as the target: its exact
selection (keyed, without replacement, or every row k or k+1 times), then one keyed global order (the exchange of a
shuffle) or stratify's balanced batches (with --pad, padded as bucket pads its batches).

This package declares the op (DECLARED); ops.mix.op runs it."""

from __future__ import annotations

from batchtool.core.registry import exports
from batchtool.ops.base import Declaration, Depends, Kind, Shape
from batchtool.ops.mix.options import MixOptions

def _shape(options: MixOptions) -> Shape:
    """A global reorder, or batches with --batch-size; its selection is keyed by the ids, like stratify's."""
    batches = options.batch_size is not None or options.weighted  # --by tokens, --schedule: in BLOCK batches
    return Shape(Kind.BATCHES if batches else Kind.REORDERS, Depends.ORDER)



DECLARED = Declaration(
    "mix",
    summary="""Mix several sources into DST in exact proportions: tf.data.Dataset.sample_from_datasets without
    the sampling noise, per epoch and (with --batch-size) per batch.""",
    example="batchtool mix sample_data/parquet sample_data/tfrecord /tmp/mixed --weights parquet=0.7,tfrecord=0.3",
    options=MixOptions,
    seeded=True,
    spills=("memory", "tmp_dir"),
    batches_flag="--batch-size",
    reorder_selects=True,
    several_sources=True,
    shaped=_shape)


__getattr__ = exports(globals(), {name: ("batchtool.ops.mix.op", name) for name in (
    "OP", "OUTPUT_COLUMNS", "STAGE", "Mix", "Mixture", "batch_padding", "largest_remainder", "mixture_totals", "source_table")})

__all__ = ["DECLARED", "OP", "OUTPUT_COLUMNS", "STAGE", "Mix", "MixOptions", "Mixture", "batch_padding",
           "largest_remainder", "mixture_totals", "source_table"]
