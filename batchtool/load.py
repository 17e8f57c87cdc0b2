"""`batchtool.load`: iterate the batches of a batch-shard output as dicts of NumPy arrays, for training loops."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchtool import rng
from batchtool.dataset import Dataset, Shard, open_dataset
from batchtool.errors import InputError, SchemaError
from batchtool.formats import example as example_codec
from batchtool.formats import parquet as parquet_format
from batchtool.formats import tfrecord as tfrecord_format
from batchtool.manifest import MANIFEST_NAME, manifest_path, output_files, read_manifest, schema_from_json
from batchtool.runner import default_threads, ordered_map
from batchtool.stats import is_sequence_type

READ_ROW_GROUPS = 32
"""Row groups (batches) decoded per read call: amortises the per-call cost of tiny row groups."""
BATCH_COLUMN = "batch"
"""The column that marks batch boundaries in TFRecord output (each batch's rows share its value)."""
_TFRECORD_CHUNK = 1024


@dataclass(frozen=True)
class _Part:
    """One output file and the number of (non-empty) batches it holds."""

    path: str
    batches: int


@dataclass(frozen=True)
class _ParquetRead:
    """Decode a run of row groups with one call (cheaper per batch) and cut it back into one batch per group."""

    path: str
    metadata: pq.FileMetaData
    row_groups: tuple[int, ...]
    columns: list[str] | None

    def __call__(self) -> list[pa.RecordBatch]:
        pf = parquet_format.open_file(self.path, self.metadata)  # the parsed footer is shared, not re-read
        try:
            table = pf.read_row_groups(list(self.row_groups), columns=self.columns, use_threads=False)
        except (pa.ArrowInvalid, OSError) as exc:
            raise parquet_format.unreadable(pf, self.path, list(self.row_groups), self.columns, exc) from exc
        whole = _one_batch(table)
        out, start = [], 0
        for rg in self.row_groups:
            rows = self.metadata.row_group(rg).num_rows
            out.append(whole.slice(start, rows))
            start += rows
        return out


class Loader:
    """The batches of DST in order: `for batch in loader` gives {column: np.ndarray}; `len(loader)` counts them.

    Files are opened as iteration reaches them; `threads` workers decode a few runs of row
    groups ahead of the consumer (in order), so memory holds about (threads + 1) * READ_ROW_GROUPS batches.
    """

    def __init__(self, dataset: Dataset, columns: list[str] | None, parts: list[_Part], threads: int) -> None:
        self.dataset = dataset
        self.columns = columns
        self.parts = parts
        self.threads = threads

    @property
    def schema(self) -> pa.Schema:
        return self.dataset.projected_schema(self.columns)

    def __len__(self) -> int:
        return sum(p.batches for p in self.parts)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in self.record_batches():
            yield to_numpy(batch)

    def record_batches(self) -> Iterator[pa.RecordBatch]:
        """The same batches as Arrow RecordBatches (for Arrow-native consumers)."""
        if self.dataset.format == "parquet":
            for batches in ordered_map(lambda read: read(), self._parquet_reads(), self.threads):
                yield from batches
        else:
            for part in self.parts:
                yield from self._tfrecord_batches(part.path)

    def _parquet_reads(self) -> Iterator[_ParquetRead]:
        for part in self.parts:
            meta = parquet_format.open_file(part.path).metadata
            groups = [rg for rg in range(meta.num_row_groups) if meta.row_group(rg).num_rows]
            for start in range(0, len(groups), READ_ROW_GROUPS):
                yield _ParquetRead(part.path, meta, tuple(groups[start:start + READ_ROW_GROUPS]), self.columns)

    def _tfrecord_batches(self, path: str) -> Iterator[pa.RecordBatch]:
        """Decode records in chunks (on worker threads) and cut them where the batch column changes value."""
        wanted = self.schema
        schema = wanted if BATCH_COLUMN in wanted.names else wanted.append(self.dataset.schema.field(BATCH_COLUMN))
        kind = self.dataset.tfrecord_kind or "sequence_example"

        def decode(chunk: tuple[int, list[bytes]]) -> pa.RecordBatch:
            return example_codec.decode_records(chunk[1], schema, kind, path=path, first_record=chunk[0])

        pending: list[pa.RecordBatch] = []
        current = None
        for decoded in ordered_map(decode, tfrecord_format.iter_record_chunks(path, _TFRECORD_CHUNK), self.threads):
            ids = decoded.column(BATCH_COLUMN).to_numpy(zero_copy_only=False)
            previous = np.r_[ids[0] if current is None else current, ids[:-1]]
            start = 0
            for cut in np.flatnonzero(ids != previous):
                if cut > start:
                    pending.append(decoded.slice(start, cut - start))
                yield _combine(pending, wanted)
                pending, start = [], int(cut)
            pending.append(decoded.slice(start))
            current = ids[-1]
        if pending:
            yield _combine(pending, wanted)


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


def _combine(pieces: list[pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatch:
    table = pa.Table.from_batches(pieces).select(schema.names)
    return _one_batch(table)


def to_numpy(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """{column: array}: equal-length list columns -> [B, T, ...] (zero-copy for numbers without nulls),
    scalars -> [B], strings -> object arrays, ragged lists -> object arrays of per-row arrays."""
    return {name: column_to_numpy(batch.column(i)) for i, name in enumerate(batch.schema.names)}


def column_to_numpy(arr: pa.Array) -> np.ndarray:
    if not is_sequence_type(arr.type):
        return arr.to_numpy(zero_copy_only=False)
    dense = _dense(arr)
    if dense is not None:
        return dense
    out = np.empty(len(arr), dtype=object)
    for i in range(len(arr)):
        out[i] = None if not arr[i].is_valid else column_to_numpy(arr[i].values)
    return out


def _dense(arr: pa.Array) -> np.ndarray | None:
    """[N, T, ...] view of a list column whose rows all have T steps and no nulls, else None."""
    if arr.null_count:
        return None
    if pa.types.is_fixed_size_list(arr.type):
        steps = arr.type.list_size
        values = arr.values.slice(arr.offset * steps, len(arr) * steps)
    else:
        offsets = arr.offsets.to_numpy()
        lengths = np.diff(offsets)
        if len(lengths) and (lengths != lengths[0]).any():
            return None
        steps = int(lengths[0]) if len(lengths) else 0
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    inner = column_to_numpy(values)
    if inner.dtype == object and is_sequence_type(values.type):
        return None
    return inner.reshape(len(arr), steps, *inner.shape[1:])


def load(dst: str, columns: Sequence[str] | None = None, shuffle_files: bool = False, seed: int = 0,
         threads: int | None = None) -> Loader:
    """Open a batch-shard output (bucket, segment, balanced stratify) for reading batch by batch.

    Order matters for `segment` output (lanes carry state from batch to batch), so files are
    read in order unless shuffle_files (then in a seeded order; batches within a file stay in order).
    `threads` decode ahead of the training loop (default: min(4, cores)); the batches are the same.
    """
    dst = os.fspath(dst)
    manifest = read_manifest(dst) if os.path.isdir(dst) else None
    dataset = _from_manifest(dst, manifest) if manifest and manifest.get("schema") else open_dataset(dst)
    cols = dataset.check_columns(columns)
    if dataset.format == "tfrecord":
        if not dataset.manifest:
            raise InputError(f"{dst}: TFRecord batches need the {MANIFEST_NAME} batchtool wrote beside them")
        if BATCH_COLUMN not in dataset.schema.names:
            raise SchemaError(f"{dst}: no {BATCH_COLUMN!r} column to find batch boundaries in TFRecord records; "
                              "write Parquet output to read it batch by batch")
    counts = {f.path: f.batches for f in output_files(dst, dataset.manifest)} if dataset.manifest else {}
    parts = [_Part(s.path, _batch_count(s.path, counts, dataset.format)) for s in dataset.shards]
    if shuffle_files:
        order = np.argsort(rng.permutation_keys(seed, "load/files", np.arange(len(parts), dtype=np.uint64)))
        parts = [parts[i] for i in order]
    return Loader(dataset, cols, parts, threads or min(4, default_threads()))


def _from_manifest(dst: str, manifest: dict) -> Dataset:
    """The output's files and schema as its manifest lists them: no footer is parsed until iteration."""
    out = manifest["output"]
    shards = tuple(Shard(i, f.path, f.bytes) for i, f in enumerate(output_files(dst, manifest)))
    missing = [s.path for s in shards if not os.path.isfile(s.path)]
    if missing:
        raise InputError(f"{missing[0]}: listed in {manifest_path(dst)} but missing")
    return Dataset(dst, out["format"], shards, schema_from_json(manifest["schema"]),
                   tfrecord_kind=out.get("tfrecord_kind"), manifest=manifest)


def _batch_count(path: str, manifest_counts: dict[str, int], format: str) -> int:
    """Batches in one file: as the manifest records, else (Parquet) the non-empty row groups of its footer."""
    if path in manifest_counts:
        return manifest_counts[path]
    if format == "tfrecord":
        raise InputError(f"{path}: not listed in the manifest, so its batches are unknown")
    meta = parquet_format.open_file(path).metadata
    return sum(1 for rg in range(meta.num_row_groups) if meta.row_group(rg).num_rows)
