"""`inspect`: what a dataset holds (schema, shards, rows, labels, lengths), as a dict or drawn for a terminal."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow.compute as pc

from batchtool.io import stats as stats_mod
from batchtool.io.dataset import Chunk, Dataset, ReadReport
from batchtool.core.errors import SchemaError
from batchtool.exec.engines import executor as run_executor
from batchtool.ops.mix import source_table
from batchtool.ops.base import OutputRows
from batchtool.ops.written import written_by, written_names
from batchtool.io.formats import column_types
from batchtool.io.formats.declared import RECORDED_OPTIONS
from batchtool.core.budget import human_bytes
from batchtool.io.inputs import open_dataset
from batchtool.core.run_settings import RunSettings
from batchtool.io.manifest import manifest_path
from batchtool.core.runner import Executor

_BAR_WIDTH = 40
_HIST_BINS = 16


def inspect(src: str, *, label: str | None = None, length: str | None = None, format: str | None = None,
            skip_corrupt: bool = False, run: RunSettings = RunSettings()) -> dict[str, Any]:
    """Read SRC once (only the label and length columns) and describe it.

    On batchtool batch output the numbers are the examples', not the padding's: bucket output's
    lengths are its `length` column (the real lengths), and segment output's labels and lengths are
    those of the original examples (first segments' `total_length`), with its segments, lanes and
    empty slots counted apart. The pass runs on the run's executor.
    """
    with run_executor(run) as executor:
        dataset = open_dataset(src, format=format, skip_corrupt=skip_corrupt, max_record_bytes=run.max_record_bytes,
                               memory=run.memory, executor=executor)
        return _described(dataset, src, label, length, executor)


def _described(dataset: Dataset, src: str, label: str | None, length: str | None,
               executor: Executor) -> dict[str, Any]:
    label = label or stats_mod.default_label(dataset.schema)
    writer = written_by(dataset.manifest)
    rows = writer.rows
    own = written_names(dataset.manifest, manifest_path(src))
    report = ReadReport()
    segment_columns = {own.get("key"), own.get("sequence"), own.get("total_length")}
    if length is None and rows is OutputRows.SEGMENTS and segment_columns <= set(dataset.schema.names):
        st, segments = segment_stats(dataset, label, own, executor, report)
        result = describe(dataset, st, label, own["total_length"], report)
        result["length"]["column"] = f"{own['total_length']} (of the examples)"
        ranks = writer.options.get("world_size")  # free-form in a manifest: shown only when it makes sense
        result["segments"] = {**segments, "ranks": ranks if isinstance(ranks, int) and ranks >= 1 else 1}
        return result
    packed_columns = {own.get("length"), own.get("cu_seqlens")}
    if length is None and rows is OutputRows.PACKED and packed_columns <= set(dataset.schema.names):
        rows_stats, examples = packed_stats(dataset, own, executor, report)
        result = describe(dataset, rows_stats, None, own["length"], report)
        result["length"]["column"] = f"{own['length']}: real steps of each row"
        result["example_length"] = {"column": f"{example_offsets(dataset, own)}: steps of each example",
                                    **examples.length_summary(), "histogram": histogram(examples.length_counts)}
        return result
    if length is None and rows is OutputRows.PADDED:
        length = own["length"] if own["length"] in dataset.schema.names else None
    length = length or stats_mod.default_length(dataset.schema)
    dataset.check_columns([c for c in (label, length) if c])
    st = stats_mod.collect(dataset, label=label, length=length, executor=executor, report=report) \
        if label or length else counted(dataset, report)
    return describe(dataset, st, label, length, report)


def counted(dataset: Dataset, report: ReadReport) -> stats_mod.DatasetStats:
    """Rows per shard as the format counts them without reading data (footers, IPC metadata; a stream
    of records: every record framed and CRC-checked), when inspect has no column to read."""
    rows = {shard.index: dataset.spec.count_rows(dataset, shard, report) for shard in dataset.shards}
    return stats_mod.DatasetStats(rows=sum(rows.values()), shard_rows=rows)


def segment_stats(dataset: Dataset, label: str | None, own: Mapping[str, str], executor: Executor,
                  report: ReadReport) -> tuple[stats_mod.DatasetStats, dict[str, int]]:
    """Segment output in one pass: rows and shards of all rows, labels and lengths of the examples
    (first segments), and the counts of segments, examples, lanes and empty slots. `own`: the names of
    segment's columns (key, sequence, total_length, lane) in this output."""
    key, sequence, total, lane = own["key"], own["sequence"], own["total_length"], own["lane"]
    columns = list(dict.fromkeys([key, sequence, total, lane, *([label] if label else [])]))
    columns = [c for c in columns if c in dataset.schema.names]
    dataset.check_columns(columns)

    def one(chunk: Chunk) -> tuple[stats_mod.DatasetStats, dict[str, int]]:
        real = pc.not_equal(chunk.data.column(key), "").to_numpy(zero_copy_only=False)
        first = real & (chunk.data.column(sequence).to_numpy(zero_copy_only=False) == 0)
        st = stats_mod.chunk_stats(chunk.filter(first), label, total)
        st.rows, st.shard_rows = chunk.num_rows, stats_mod.chunk_stats(chunk, None, None).shard_rows
        lanes = chunk.data.column(lane).to_numpy(zero_copy_only=False) if lane in columns else np.zeros(0)
        return st, {"segments": int(real.sum()), "examples": int(first.sum()), "empty_slots": int((~real).sum()),
                    "lanes": int(lanes.max()) + 1 if len(lanes) else 0}

    total_stats, counts = stats_mod.DatasetStats(), {"segments": 0, "examples": 0, "empty_slots": 0, "lanes": 0}
    for st, part in executor.map(lambda task: one(task()), dataset.tasks(columns, report)):
        total_stats.merge(st)
        counts = {k: max(v, part[k]) if k == "lanes" else v + part[k] for k, v in counts.items()}
    return total_stats, counts


def example_offsets(dataset: Dataset, own: Mapping[str, str]) -> str:
    """The column of pack output whose offsets give its examples' real steps: cu_seqlens_unpadded where pack wrote it
    (--segment-multiple, whose cu_seqlens count each piece's padding too), else cu_seqlens."""
    unpadded = own.get("cu_seqlens_unpadded")
    return unpadded if unpadded in dataset.schema.names else own["cu_seqlens"]


def packed_stats(dataset: Dataset, own: Mapping[str, str], executor: Executor,
                 report: ReadReport) -> tuple[stats_mod.DatasetStats, stats_mod.DatasetStats]:
    """Pack output in one pass over its `length` and its examples' offsets (named as in `own`; example_offsets):
    the rows with their real steps (not the padded length every sequence column has), and the examples with theirs
    (the offsets' differences, only a row's first `num_examples` of them: with --max-segments the offsets end in
    repeats, empty segments that are no examples). An example's steps must lie within its row's, which bound the
    histogram (checked like any length)."""
    length, cu, count = own["length"], example_offsets(dataset, own), own.get("num_examples")
    counted = count in dataset.schema.names
    limit = stats_mod.histogram_limit(dataset)

    def one(chunk: Chunk) -> tuple[stats_mod.DatasetStats, stats_mod.DatasetStats]:
        rows = stats_mod.chunk_stats(chunk, None, length, histogram=limit)
        row_steps = stats_mod.lengths_of(chunk.data, length)
        offsets = chunk.data.column(cu)
        values = pc.fill_null(offsets.flatten(), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        parent = pc.list_parent_indices(offsets).to_numpy(zero_copy_only=False)
        within = parent[1:] == parent[:-1]
        if counted:
            examples = stats_mod.lengths_of(chunk.data, count)
            index = np.arange(len(parent)) - np.searchsorted(parent, parent)  # each offset's place in its row
            within &= index[:-1] < examples[parent[:-1]]
        steps, row = np.diff(values)[within], parent[1:][within]
        bad = np.flatnonzero((steps < 0) | (steps > row_steps[row]))
        if len(bad):
            i = int(bad[0])
            raise SchemaError(f"{chunk.where(int(row[i]))}, column {cu!r}: an example of {int(steps[i]):,} steps in "
                              f"a row of {int(row_steps[row[i]]):,} (column {length!r}): not offsets as pack writes")
        return rows, stats_mod.DatasetStats(length_counts=np.bincount(steps) if len(steps)
                                            else np.zeros(0, dtype=np.int64))

    total_rows, total_examples = stats_mod.DatasetStats(), stats_mod.DatasetStats()
    columns = [length, cu, *([count] if counted else [])]
    for rows, examples in executor.map(lambda task: one(task()), dataset.tasks(columns, report)):
        total_rows.merge(rows)
        total_examples.merge(examples)
    return total_rows, total_examples


def describe(dataset: Dataset, st: stats_mod.DatasetStats, label: str | None, length: str | None,
             report: ReadReport) -> dict[str, Any]:
    result: dict[str, Any] = {
        "src": dataset.src,
        "format": dataset.format,
        **dataset.spec.recorded(dataset),
        "rows": st.rows,
        "bytes": dataset.total_bytes,
        "schema": [{"name": f.name, "type": column_types.shown_type(f)} for f in dataset.schema],
        "shards": [{"path": s.path, "bytes": s.size, "rows": st.shard_rows.get(s.index, 0)}
                   for s in dataset.shards],
    }
    if label:
        result["label"] = {"column": label, "nulls": st.label_nulls,
                           "counts": {str(k): v for k, v in sorted(st.label_counts.items(), key=_sort_key)}}
    if length:
        result["length"] = {"column": length, **st.length_summary(),
                            "histogram": histogram(st.length_counts)}
    if report.corrupt_records:
        result["corrupt_records_skipped"] = report.corrupt_records
    if dataset.manifest:
        result["manifest"] = manifest_summary(dataset.manifest)
    return result


def _sort_key(item: tuple) -> tuple:
    key = item[0]
    return (0, key, "") if isinstance(key, (int, float)) else (1, 0, str(key))


def histogram(counts: np.ndarray, bins: int = _HIST_BINS) -> list[dict]:
    """Equal-width bins over [min, max] of an exact length histogram."""
    nonzero = np.nonzero(counts)[0]
    if not len(nonzero):
        return []
    lo, hi = int(nonzero[0]), int(nonzero[-1]) + 1
    width = max(1, -(-(hi - lo) // bins))
    edges = list(range(lo, hi, width)) + [hi]
    return [{"from": a, "to": b - 1, "count": int(counts[a:b].sum())} for a, b in zip(edges, edges[1:])]


def manifest_summary(manifest: dict) -> dict:
    """The parts of a DST's manifest worth showing next to the data."""
    out = manifest.get("output", {})
    return {"command": manifest.get("command"), "batchtool_version": manifest.get("batchtool_version"),
            "seed": manifest.get("seed"), "options": manifest.get("options"),
            "rows": out.get("rows"), "batches": out.get("batches"), "stats": manifest.get("stats", {}),
            **({"padded_on_load": True} if "padding" in out else {})}


def render(result: dict[str, Any]) -> str:
    """The terminal view: aligned tables and bar charts."""
    lines = [f"{result['src']}  ({result['format']}"
             + "".join(f", {result[k]}" for k in RECORDED_OPTIONS if result.get(k))
             + f", {len(result['shards'])} shard(s), {human_bytes(result['bytes'])}, {result['rows']:,} rows)"]
    lines.append("")
    lines.append("schema")
    width = max(len(c["name"]) for c in result["schema"]) if result["schema"] else 0
    lines += [f"  {c['name']:<{width}}  {c['type']}" for c in result["schema"]]
    lines.append("")
    lines.append("shards")
    for s in result["shards"][:20]:
        lines.append(f"  {os.path.basename(s['path'])}  {s['rows']:>10,} rows  {human_bytes(s['bytes']):>9}")
    if len(result["shards"]) > 20:
        lines.append(f"  ... {len(result['shards']) - 20} more")
    if "segments" in result:
        lines += ["", render_segments(result["segments"])]
    if "label" in result:
        lines += ["", *render_labels(result["label"])]
    if "length" in result:
        lines += ["", *render_lengths(result["length"])]
    if "example_length" in result:
        lines += ["", *render_lengths(result["example_length"])]
    if result.get("corrupt_records_skipped"):
        lines += ["", f"corrupt records skipped: {result['corrupt_records_skipped']}"]
    if "manifest" in result:
        lines += ["", *render_manifest(result["manifest"])]
    return "\n".join(lines)


def render_segments(segments: dict) -> str:
    """Segment output's own counts, which its row count mixes together."""
    empty = 100 * segments["empty_slots"] / max(segments["segments"] + segments["empty_slots"], 1)
    ranks = f" x {segments['ranks']} ranks" if segments["ranks"] > 1 else ""
    return (f"segment output: {segments['segments']:,} segments of {segments['examples']:,} examples in "
            f"{segments['lanes']:,} lanes{ranks}; {segments['empty_slots']:,} empty slots ({empty:.2f}%)"
            "; labels and lengths below are the examples'")


def render_labels(label: dict) -> list[str]:
    counts = label["counts"]
    rows = sum(counts.values()) + label["nulls"]  # the rows (or examples) counted
    lines = [f"label distribution ({label['column']}, {len(counts)} classes"
             + (f", {label['nulls']} null" if label["nulls"] else "") + ")"]
    peak = max(counts.values(), default=0)
    width = max((len(k) for k in counts), default=1)
    for k, v in counts.items():
        lines.append(f"  {k:>{width}}  {v:>10,}  {100 * v / max(rows, 1):6.2f}%  {block_bar(v, peak)}")
    return lines


def render_lengths(length: dict) -> list[str]:
    if not length.get("count"):
        return [f"lengths ({length['column']}): no rows"]
    lines = [f"lengths ({length['column']}): min {length['min']}  p50 {length['p50']}  p90 {length['p90']}  "
             f"p99 {length['p99']}  max {length['max']}  mean {length['mean']}"]
    peak = max(b["count"] for b in length["histogram"])
    width = len(str(length["max"]))
    for b in length["histogram"]:
        lines.append(f"  {b['from']:>{width}}-{b['to']:<{width}}  {b['count']:>10,}  {block_bar(b['count'], peak)}")
    return lines


def render_manifest(summary: dict) -> list[str]:
    lines = [f"written by batchtool {summary['batchtool_version']}: {summary['command']}"
             + (f" (seed {summary['seed']})" if summary.get("seed") is not None else "")]
    if summary.get("batches") is not None:
        lines.append(f"  {summary['rows']:,} rows in {summary['batches']:,} batches")
    if summary.get("padded_on_load"):
        lines.append("  stored unpadded (bucket --padding on-load): batchtool.load pads each batch as it reads it")
    stats = summary.get("stats", {})
    for stage in stats.get("stages", []):  # run: each stage's rows, then the last stage's own numbers
        if isinstance(stage, dict):
            lines.append(f"  stage {stage.get('stage')} {stage.get('op')}: {readable('rows_in', stage.get('rows_in'))} "
                         f"rows in, {readable('rows_out', stage.get('rows_out'))} out")
    for key, value in stats.items():
        if isinstance(value, (int, float, str)):
            lines.append(f"  {key}: {readable(key, value)}")
    last = stats["stages"][-1] if isinstance(stats.get("stages"), list) and stats["stages"] else stats
    for key, render, what in (("buckets", render_buckets, "a per-bucket table as bucket writes it"),
                              ("examples_per_row", render_packing, "a packing summary as pack writes it"),
                              ("sources", render_sources, "a per-source table as mix writes it")):
        if isinstance(last, dict) and last.get(key):
            try:
                lines += render(last)
            except (KeyError, TypeError, ValueError, AttributeError):  # stats are free-form: show what is there
                lines.append(f"  stats.{key}: not {what}")
    return lines


def render_sources(stats: dict) -> list[str]:
    """A mix's sources: rows available and taken, repeats, weight and share of each."""
    return [f"  {line}" for line in source_table(stats["sources"])]


def render_packing(stats: dict) -> list[str]:
    """pack's rows against the lower bound, its efficiency, and a histogram of examples per row."""
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.2f}%"

    optimal = "proven optimal" if stats.get("proven_optimal") else f"lower bound {stats['rows_lower_bound']:,}"
    lines = ["", "packing (efficiency = real steps / (rows x max length))",
             f"  {stats['rows']:,} rows of at most {stats['max_length']:,} steps ({optimal}): efficiency "
             f"{pct(stats['packing_efficiency'])}, at most {pct(stats.get('packing_efficiency_bound'))}",
             f"  plan: {stats['method']}"]
    dropped, split = stats.get("examples_dropped", {}).get("long"), stats.get("examples_split")
    if dropped or split:
        lines.append(f"  long examples: {split or 0:,} split into pieces, {dropped or 0:,} dropped")
    if stats.get("segment_padding_steps") is not None:
        lines.append(f"  padding inside pieces (--segment-multiple): {stats['segment_padding_steps']:,} steps")
    per_row = {int(k): v for k, v in stats["examples_per_row"].items()}
    counts = np.zeros(max(per_row) + 1, dtype=np.int64)
    counts[list(per_row)] = list(per_row.values())
    bins = histogram(counts)
    peak = max(b["count"] for b in bins)
    width = len(str(max(per_row)))
    lines.append("  examples per row")
    lines += [f"  {b['from']:>{width}}-{b['to']:<{width}}  {b['count']:>10,}  {block_bar(b['count'], peak)}"
              for b in bins]
    return lines


def readable(key: str, value: Any) -> str:
    """A manifest number as a person reads it: thousands separators, fractions as percentages."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "?" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if key.endswith(("efficiency", "efficiency_bound", "fraction")):
        return f"{100 * value:.2f}%"
    return f"{value:,.6g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Right-aligned columns, two spaces in."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in (header, *rows)]


def _span(lo: Any, hi: Any) -> str:
    return f"[{lo}, {'inf' if hi is None else hi})"


def render_grid(stats: dict) -> list[str]:
    """bucket over two lengths: each cell's length ranges, rows, batches, elements, efficiency and largest batch
    cost, then the grid drawn as one line per first-length bucket with its cells' second lengths, rows and
    efficiency."""
    cells = stats["buckets"]
    rows = [(f"{r['cell'][0]},{r['cell'][1]}", _span(*r["lengths"][0]), _span(*r["lengths"][1]), f"{r['examples']:,}",
             f"{r['batches']:,}", f"{r['real_elements']:,}", f"{r['padded_elements']:,}", _pct(r["padding_efficiency"]),
             f"{r['max_batch_cost']:,}") for r in cells]
    rows.append(("all", "", "", f"{sum(r['examples'] for r in cells):,}", f"{stats.get('batches', 0):,}",
                 f"{stats.get('real_elements', 0):,}", f"{stats.get('padded_elements', 0):,}",
                 _pct(stats.get("padding_efficiency")), f"{stats.get('max_batch_cost', 0):,}"))
    cost = stats.get("cost") or {}
    budget = f", budget {cost['max_tokens']:,} ({cost['model']})" if cost.get("max_tokens") else ""
    lines = ["", f"cells ({len(cells)} over two lengths in {len(stats['grid'])} first-length buckets; padding "
             f"efficiency = real / padded elements of both; largest batch cost{budget})"]
    lines += _table(("cell", "first", "second", "examples", "batches", "real", "padded", "efficiency", "max cost"),
                    rows)
    stripes: dict[int, list[dict]] = {}
    for r in cells:
        stripes.setdefault(r["cell"][0], []).append(r)
    drawn = [(_span(*row[0]["lengths"][0]), *(f"{_span(*r['lengths'][1])} {r['examples']:,} "
                                              f"({_pct(r['padding_efficiency'])})" for r in row))
             for row in stripes.values()]
    width = max(len(r) for r in drawn)
    lines += ["", "  rows (efficiency) per cell: a line per first-length bucket, its second-length buckets across"]
    lines += _table(("first", *("second" for _ in range(width - 1))), [(*r, *("",) * (width - len(r))) for r in drawn])
    lines += _dropped(stats)
    auto = stats.get("auto_buckets")
    if auto:
        lines.append(f"  auto-buckets {auto['k']}: expected efficiency {_pct(auto['expected_padding_efficiency'])} "
                     "(every row padded to its buckets' longest lengths)")
    return lines


def render_buckets(stats: dict) -> list[str]:
    """bucket's per-bucket table: length range, examples, batches, elements and padding efficiency."""
    if "grid" in stats:
        return render_grid(stats)

    def span(row: dict) -> str:
        lo, hi = row.get("lengths") or (None, None)
        return _span(lo, hi) if lo is not None else str(row["bucket"])

    rows = [(str(r["bucket"]), span(r), f"{r['examples']:,}", f"{r['batches']:,}", f"{r['real_elements']:,}",
             f"{r['padded_elements']:,}", _pct(r["padding_efficiency"])) for r in stats["buckets"]]
    rows.append(("all", "", f"{sum(r['examples'] for r in stats['buckets']):,}", f"{stats.get('batches', 0):,}",
                 f"{stats.get('real_elements', 0):,}", f"{stats.get('padded_elements', 0):,}",
                 _pct(stats.get("padding_efficiency"))))
    lines = ["", "buckets (padding efficiency = real / padded elements)"]
    lines += _table(("bucket", "lengths", "examples", "batches", "real", "padded", "efficiency"), rows)
    lines += _dropped(stats)
    auto = stats.get("auto_buckets")
    if auto:
        lines.append(f"  auto-buckets {auto['k']}: expected efficiency {_pct(auto['expected_padding_efficiency'])} "
                     f"(equal-count quantiles: {_pct(auto['quantile_expected_padding_efficiency'])})")
    return lines


def _dropped(stats: dict) -> list[str]:
    """bucket's line of rows dropped, by reason (none when nothing was)."""
    dropped = {k: v for k, v in stats.get("examples_dropped", {}).items() if v}
    return ["  dropped: " + ", ".join(f"{v:,} {k}" for k, v in dropped.items())] if dropped else []


def block_bar(value: float, peak: float) -> str:
    """A horizontal bar with eighth-block resolution."""
    if peak <= 0:
        return ""
    eighths = int(round(_BAR_WIDTH * 8 * value / peak))
    return "█" * (eighths // 8) + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[eighths % 8]
