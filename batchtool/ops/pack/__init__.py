"""`pack`: whole sequences packed into rows of at most --max-length steps, planned once over the length
histogram, assembled through a spill in bounded memory, with the segment ids varlen attention needs.

Passes: (1) the lengths alone, into a histogram of the pieces to pack; the plan (which lengths share a
row) is made from it by batchtool.ops.pack.packing (ops/pack/plan.py). (2) Every example is given a slot of its
length (with --segment-multiple, of its span: ops/pack/segments.py): its arrival rank among examples of that
length, through a keyed permutation, so which examples share a row is random among examples of the same length;
the slot's row goes through a second keyed permutation to its output position, and the example is scattered to
the group of output positions it belongs to. (3) Each group is sorted by position (and a keyed order within the
row) on a worker, and the planned batches are assembled into packed rows where they are written
(ops/pack/rows.py). Every decision is a pure function of --seed, the histogram and the input order, so output
bytes do not depend on --threads, --memory or the engine.


This package declares the op (DECLARED); ops.pack.op runs it."""

from __future__ import annotations

from batchtool.core.registry import exports
from batchtool.ops.base import Declaration, Kind, OutputRows
from batchtool.ops.pack.options import DEFAULT_BATCH_SIZE, PackOptions

DECLARED = Declaration(
    "pack",
    summary=f"""Pack whole sequences into rows of at most L steps, for transformer training without padding waste.

    Which lengths share a row is planned once over the whole length histogram (near the optimum,
    which the summary states); which examples fill those rows, and the order of the rows, are seeded
    random. DST gets the packed sequence columns with segment_ids and positions per step (in the smallest
    integer type that holds L), cu_seqlens, num_examples and length per row (--output-column names them
    otherwise), and every other column (or those --columns names) as a list of one value per example (an integer
    column named like pack's `length` is taken for it if it holds each example's steps). A batch holds
    {DEFAULT_BATCH_SIZE} rows unless --batch-size or --max-tokens says otherwise.""",
    example="batchtool pack sample_data/parquet /tmp/packed --max-length 512 --sequence tokens --columns key,label",
    options=PackOptions,
    kind=Kind.BATCHES,
    seeded=True,
    spills=("memory",),
    batches_flag=True,
    output_rows=OutputRows.PACKED)


__getattr__ = exports(globals(), {name: ("batchtool.ops.pack.op", name) for name in (
    "OP", "Pack", "PackColumns", "assemble", "output_schema")})

__all__ = ["DECLARED", "OP", "Pack", "PackColumns", "PackOptions", "assemble", "output_schema"]
