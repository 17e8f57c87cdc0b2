"""`stratify`: resample to target class proportions (exact, Bernoulli, online, with replacement, balanced batches).

This package declares the op (DECLARED); ops.stratify.op runs it."""

from __future__ import annotations

from batchtool.core.registry import exports
from batchtool.ops.base import Declaration, Depends, Kind, Shape
from batchtool.ops.stratify.options import StratifyOptions

def _shape(options: StratifyOptions) -> Shape:
    """Rows as they stream, or batches with --batch-size (and --balanced-batches); online, its rates follow the
    chunks."""
    return Shape(Kind.ROWS if options.batch_size is None else Kind.BATCHES,
                 Depends.CHUNKS if options.mode == "online" else Depends.ORDER)



DECLARED = Declaration(
    "stratify",
    summary="Resample SRC to target class proportions (tf.contrib.training.stratified_sample) and write DST.",
    example="batchtool stratify sample_data/parquet /tmp/balanced --label label --target uniform",
    options=StratifyOptions,
    seeded=True,
    spills=("memory", "tmp_dir"),
    batches_flag="--balanced-batches",
    shaped=_shape)


__getattr__ = exports(globals(), {name: ("batchtool.ops.stratify.op", name) for name in (
    "MAX_CLASSES", "MODES", "OP", "ONLINE_PRIOR", "LabelError", "Stratify", "discard_warning", "label_codes")})

__all__ = ["DECLARED", "MAX_CLASSES", "MODES", "OP", "ONLINE_PRIOR", "LabelError", "Stratify",
           "StratifyOptions", "discard_warning", "label_codes"]
