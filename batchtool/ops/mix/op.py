"""The `mix` op's run: its Operation (its declaration, DECLARED, is the package's)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from batchtool.core import budget, rng
from batchtool.core.errors import InputError, OptionInputError
from batchtool.core.tally import Tally
from batchtool.io.dataset import Chunk
from batchtool.io.padding import BatchPadding, default_pad, parse_pad_values, row_lengths
from batchtool.io.spill import parts_for
from batchtool.io.stats import is_sequence_type
from batchtool.ops import names as own
from batchtool.ops.base import (ColumnError, Context, Depends, Kind, Operation, Pass, Said, Shape, manifest_options,
                                need_columns, who)
from batchtool.ops.copies import Copies
from batchtool.ops.keyed import flush_bytes, range_bytes
from batchtool.ops.mix import DECLARED
from batchtool.ops.mix.options import MixOptions, OUTPUT_COLUMNS, largest_remainder, mixture_totals
from batchtool.ops.mix.padded import padded_cut
from batchtool.ops.mix.schedule import Replan, Schedule, read_schedule
from batchtool.ops.quotas import (Constant, Curve, Documents, QuotaBatches, QuotaLayout, ROWS, Switched, Units,
                                  plan_layout)
from batchtool.ops.regroup import Cut, Exchange, Input, Probe, Runtime, Scatter, Scattered, Stream
from batchtool.ops.rows import FixedBatches, bytes_per_row, estimate_bytes
from batchtool.ops.shuffle import default_batch_rows
from batchtool.ops.stratify.op import OP as STRATIFY, discard_warning
from batchtool.ops.stratify.options import StratifyOptions
from batchtool.ops.stratify.batches import (BATCH_STAGE, ORDER_STAGE, exchange as balanced_batches, record_layout,
                                            selected_rows, selected_size, written_stats)
from batchtool.ops.stratify.plans import Stratification, ThresholdPlan, threshold_plan
from batchtool.ops.stratify.thresholds import find_thresholds

STAGE = "mix"
"""The keyed order of the shuffled mixture."""
COPY_BYTES = 48
"""What one written copy of a row takes besides its data while a map task builds a chunk's selection at once (its
id, the take index, its copy number, its id's hash: 8 bytes each, and their temporaries): the least a copy needs."""
BLOCK = 4096
"""--by tokens or --schedule without --batch-size: the rows (or tokens) of each batch the quotas are dealt in (their
output is batches: the order is what the weights follow)."""
WEIGHTED_OPTIONS = ("by", "length", "schedule", "previous")
"""The options of --by tokens and --schedule, which the manifest of a mix by rows leaves out."""
ORDER_BYTES = 48
"""--by tokens or --schedule: what the driver holds per row while it deals the quotas (its source, order key and
count, 8 bytes each, as gathered and again sorted, and its cumulative count)."""
BATCH_BYTES = 128
"""What --batch-size's layout holds per batch besides 16 bytes per source (its quotas: an array each, then one
array of them all)."""


def _as_stratify(options: MixOptions, target: tuple[float, ...] | str = "uniform") -> StratifyOptions:
    """The stratify that makes this mixture: exact mode over the source column, the weights as its target (--by
    tokens and --schedule: its balanced batches, of BLOCK without --batch-size)."""
    batch_size = options.batch_size or (BLOCK if options.weighted else None)
    return StratifyOptions(label=options.column, target=target, mode="exact", num_classes=len(options.names),
                           replacement=options.replacement, size=None if options.weighted else options.size,
                           batch_size=batch_size, drop_remainder=options.drop_remainder,
                           balanced_batches=batch_size is not None)


@dataclass(frozen=True)
class Mixture(Stratification):
    """mix's plan: the stratification that selects it, and with --pad how its batches are padded."""

    padding: BatchPadding | None = None
    schedule: Schedule | None = None
    previous: Replan | None = None
    length: str | None = None
    """--by tokens: the column whose values (an integer column) or steps (a list column) each row counts."""


def batch_padding(options: MixOptions, schema: pa.Schema) -> BatchPadding | None:
    """--pad: the sequence columns (every list column unless --sequence names them), their pad values and the length
    and mask columns, none of which the input may already hold; None without --pad."""
    if not options.pad:
        return None
    for name in options.sequence:
        if name not in schema.names:
            raise ColumnError("sequence", f"no such column (available: {', '.join(schema.names)})", value=name)
        if not is_sequence_type(schema.field(name).type):
            raise ColumnError("sequence", f"column is {schema.field(name).type}, expected a list (sequence) column",
                              value=name)
    sequences = options.sequence or tuple(f.name for f in schema if is_sequence_type(f.type))
    if not sequences:
        raise ColumnError("pad", f"no list (sequence) column to pad (columns: {', '.join(schema.names)}); leave out "
                          "{pad}")
    values = parse_pad_values(options.pad_value, schema)
    stray = next((name for name in values if name not in sequences), None)
    if stray is not None:
        raise ColumnError("pad_value", f"{stray!r} is not a padded sequence column (sequences: "
                          f"{', '.join(sequences) or 'none'})", value=stray)
    names = own.named(OUTPUT_COLUMNS, options.output_column)
    own.refuse_clashes("mix", {role: names[role] for role in ("length", "mask") if role != "mask" or options.mask},
                       schema.names)
    return BatchPadding(tuple(sequences), {name: values.get(name, default_pad(schema.field(name).type))
                                           for name in sequences}, names["length"],
                        names["mask"] if options.mask else None)


class Mix(Operation[MixOptions, Mixture], declared=DECLARED):
    """mix's definition. Its plan is a stratification of the source column (stratify's exact thresholds for counts
    from the weights); its regrouping is a keyed global order of the selection, or stratify's balanced batches."""

    def output_schema(self, options: MixOptions, schema: pa.Schema) -> pa.Schema:
        need_columns(schema, own.FIELD, [options.column])
        padding = batch_padding(options, schema)
        return schema if padding is None else padding(pa.RecordBatch.from_pylist([], schema=schema)).schema

    def input_columns(self, options: MixOptions, columns: list[str] | None) -> list[str] | None:
        return None if columns is None else list(dict.fromkeys([*columns, options.column]))

    def recorded(self, options: MixOptions, schema: pa.Schema, output: Any) -> dict[str, Any]:
        """The options, those of --by tokens and --schedule only when given (a mix by rows records what it did
        before they existed)."""
        recorded = {**manifest_options(options, output), **own.recorded(options.output_column)}
        return recorded if options.weighted else {k: v for k, v in recorded.items() if k not in WEIGHTED_OPTIONS}

    def first_pass(self, options: MixOptions, schema: pa.Schema) -> Pass | None:
        """Each source's rows: stratify's class counts of the source column; and the rows of each source's largest
        chunk, which the plan's memory check needs."""
        counts = STRATIFY.first_pass(_as_stratify(options), schema)
        assert counts is not None, "exact mode counts"
        return replace(counts, of=functools.partial(_chunk_counts, options.column, counts.of))

    def plan(self, options: MixOptions, context: Context, stats: Tally) -> Mixture:
        """The rows each source gives (exact: floor(M w_i), or --size by largest remainder) and stratify's exact
        plan for them: the thresholds of keyed hashes found in passes over the source column."""
        k = len(options.names)
        counted = stats.counts.get("label_counts", {})
        rows = np.array([counted.get(i, 0) for i in range(k)], dtype=np.int64)
        empty = next((i for i in range(k) if not rows[i]), None)
        if empty is not None:
            raise InputError(f"source {options.names[empty]!r} is empty: it has no rows to mix")
        if options.weighted:
            return _weighted_plan(options, context, rows)
        weights = options.weight_fractions(rows.tolist())
        totals, m = mixture_totals(options, rows, weights)
        _check_memory(options, context.memory, stats, rows, totals)
        target = tuple(float(w) for w in weights)
        plan = threshold_plan(totals, rows, lambda ranks: find_thresholds(
            context.scan, options.column, k, ranks, rows, context.seed, context.locate))
        info = {"column": options.column, "names": list(options.names), "weights": list(target),
                "rows": rows.tolist(), "targets": totals.tolist(),
                "total_m": m.numerator if m.denominator == 1 else round(float(m), 6)}
        return Mixture(_as_stratify(options, target), k, np.array(target), plan, float(totals.sum()), info,
                       context.seed, context.locate, context.memory, context.tasks,
                       padding=batch_padding(options, context.schema))

    def kernel(self, plan: Mixture, chunk: Chunk) -> tuple[Copies, Tally]:
        """The selection of a chunk (what the exchange's map tasks scatter): stratify's copies of each row."""
        return STRATIFY.kernel(plan, chunk)

    def regroup(self, plan: Mixture, input: Input, probe: Probe) -> Exchange | Stream:
        """The selection in a keyed global order (a shuffle's exchange, its rows chosen on the map workers), or with
        --batch-size stratify's balanced batches of it (with --pad, padded)."""
        if plan.options.balanced_batches:
            batches = balanced_batches(self, plan, input, probe)
            assert batches is not None and batches.scatter.prepare is not None, "exact mode selects on the map side"
            if plan.info.get("weighted"):
                batches = replace(batches, scatter=replace(batches.scatter, prepare=functools.partial(
                    _measured, plan, batches.scatter.prepare)), cut=functools.partial(_weighted_cut, self, plan))
            if plan.padding is None:
                return batches
            scatter = replace(batches.scatter, prepare=functools.partial(_checked, plan.padding, plan.locate,
                                                                         batches.scatter.prepare))
            return replace(batches, scatter=scatter, cut=functools.partial(padded_cut, plan.padding, batches.cut))
        first = probe(functools.partial(selected_size, self, plan))
        parts = parts_for(estimate_bytes(input, first, rows=int(plan.expected_rows or 0)),
                          range_bytes(plan.memory, plan.tasks))
        scatter = Scatter(input.schema, (parts,), plan.seed, STAGE, flush_bytes(plan.memory, parts, plan.tasks),
                          functools.partial(_one_group, self, plan))
        return Exchange(scatter, functools.partial(_shuffled, self, plan, default_batch_rows(bytes_per_row(first))))

    def report(self, plan: Mixture, stats: Tally) -> dict[str, Any]:
        """manifest["stats"]: per source its rows, weight, the rows taken (written), those beyond its own rows
        (repeats) and its share of the output; the selection's copies, and the batches' layout."""
        done = STRATIFY.report(plan, stats)
        taken = [int(n) for n in done["class_counts_after"].values()]
        available = [int(n) for n in done["class_counts_before"].values()]
        out = max(1, sum(taken))
        sources = [{"index": i, "name": name, "weight": round(w, 9), "rows": n, "taken": t, "repeats": max(0, t - n),
                    "share": round(t / out, 6)}
                   for i, (name, w, n, t) in enumerate(zip(plan.info["names"], plan.info["weights"], available, taken))]
        tokens = stats.latest.get("tokens")
        if tokens is not None:
            for source, n in zip(sources, tokens):
                source.update(tokens=n, token_share=round(n / max(1, sum(tokens)), 6))
        weighted = {key: plan.info[key] for key in ("by", "schedule", "target") if key in plan.info}
        kept = ("rows_in", "examples_dropped", "examples_duplicated", "copies_per_example", "discarded_fraction",
                "batch_size", "balanced_batches", "final_batch_quotas")
        if weighted:  # every row was selected; a source's stream is dealt whole before any row repeats
            dropped = sum(max(0, n - t) for n, t in zip(available, taken))
            repeated = sum(max(0, t - n) for n, t in zip(available, taken))
            done.update(examples_dropped=dropped, examples_duplicated=repeated,
                        discarded_fraction=round(dropped / max(1, sum(available)), 6))
            done.pop("copies_per_example", None)
        return {"column": plan.info["column"], "total_m": plan.info["total_m"], "sources": sources, **weighted,
                **{key: done[key] for key in kept if key in done}}

    def said(self, stats: dict[str, Any]) -> Said:
        """Every source with its rows, weight and what it gave (so a glob that became many sources shows them), a
        warning for a source whose weight gives it no row, and stratify's when most of the input is discarded; the
        counts per source at the end of the summary."""
        sources = stats.get("sources") or []
        warnings = tuple(f"warning: {who(stats, self.name)}: source {s['name']!r} gets no rows at weight "
                         f"{s['weight']:.6g} (its share of the mixture rounds down to 0)"
                         for s in sources if s["weight"] > 0 and not s["taken"])
        warnings += discard_warning(stats, self.name, "weights nearer the sources' sizes keep more, or --replacement "
                                    "with a larger --size repeats the smaller sources instead")
        note = ("per source " + "/".join(f"{s['taken']:,}" for s in sources),) if sources else ()
        if "tokens_planned" in stats:  # a dry run by tokens: the rows follow the lengths, read as it is made
            planned = stats["tokens_planned"]
            note = ("rows out follow the documents' lengths (counted as the mixture is written)"
                    + ("" if planned is None else f"; {planned:,} tokens planned"),)
        if not sources or "rows" not in sources[0]:
            return Said(warnings, note)
        return Said((*warnings, *source_table(sources)), note)

    def expected(self, plan: Mixture, rows_in: int | None, scan: Any = None) -> tuple[int | None, dict[str, Any]]:
        """Dry run: the rows of each source the plan takes (with --batch-size, those its balanced batches hold; by
        schedule, its quota batches). By tokens the rows follow the documents' lengths, read only as the mixture is
        made: the rows out are not known, the tokens asked for are (--size or the schedule's total)."""
        info: dict[str, Any] = {"rows_in": int(sum(plan.info["rows"]))}
        weighted = bool(plan.info.get("weighted"))
        if weighted and plan.info["by"] == "tokens":
            return None, {**info, "by": "tokens", "tokens_planned": plan.info["end"]}
        taken = np.asarray(plan.info["targets"], dtype=np.int64) if not weighted else None
        layout = _dealt(plan, np.asarray(plan.info["rows"], dtype=np.int64), ROWS) if weighted else None
        if taken is not None and plan.options.batch_size is not None:
            layout = plan_layout(taken.copy(), plan.target, plan.options.batch_size,
                                 partial=not plan.options.drop_remainder, oversample=False)
        if layout is not None:
            taken = layout.per_class
            info["batches"] = layout.batches + bool(sum(layout.partial))
        info["sources"] = [{"name": name, "weight": w, "taken": int(t)}
                           for name, w, t in zip(plan.info["names"], plan.info["weights"], taken.tolist())]
        return int(taken.sum()), info


def _weighted_plan(options: MixOptions, context: Context, rows: np.ndarray) -> Mixture:
    """--by tokens or --schedule: every row of every source selected once, each source's rows in their keyed order;
    the cut then deals them out in quotas that follow the weights (or the schedule's integral) by what each row
    counts (ops.quotas), taking of each source only what its share needs."""
    k = len(options.names)
    schedule = read_schedule(options.schedule, options.names) if options.schedule is not None else None
    if schedule is not None:
        target = schedule.points[0].weights
    else:
        target = tuple(float(w) for w in options.weight_fractions(rows.tolist()))
    end = options.size if options.size is not None else schedule.total if schedule is not None else None
    if options.replacement and end is None:
        raise OptionInputError("replacement", "{replacement} needs {size} (or a schedule's total), the length of "
                               "the mixture", mentions=["size"])
    length = _length_column(options, context.schema) if options.by == "tokens" else None
    info = {"column": options.column, "names": list(options.names), "weights": list(target), "rows": rows.tolist(),
            "total_m": None, "weighted": True, "by": options.by, "end": end, "target": list(target)}
    previous = options.previous
    if previous is not None and (previous.seed, previous.batch_size) != (context.seed, options.batch_size or BLOCK):
        raise OptionInputError("batch_size", f"--continue {previous.dst} was written with --seed {previous.seed} and "
                               f"--batch-size {previous.batch_size}: give the same to keep its batches")
    if schedule is not None:
        info["schedule"] = {"path": schedule.path, "interpolation": schedule.interpolation, "total": schedule.total,
                            "points": [{"at": p.at, "weights": dict(zip(options.names, p.weights))}
                                       for p in schedule.points],
                            "max_repeats": list(schedule.max_repeats), "max_fraction": list(schedule.max_fraction)}
    budget.check_fits("by" if options.by == "tokens" else "schedule", f"each row's source, order key and count, which "
                      f"the quotas are dealt from ({int(rows.sum()):,} rows, {ORDER_BYTES} bytes each)",
                      float(rows.sum()) * ORDER_BYTES, context.memory, "give a larger {memory}",
                      value=options.by if options.by == "tokens" else options.schedule, error=OptionInputError)
    plan = ThresholdPlan((1,) * k, (None,) * k)
    return Mixture(_as_stratify(options, target), k, np.array(target), plan, float(rows.sum()), info, context.seed,
                   context.locate, context.memory, context.tasks, padding=batch_padding(options, context.schema),
                   schedule=schedule, previous=previous, length=length)


def _length_column(options: MixOptions, schema: pa.Schema) -> str:
    """--by tokens: --length (an integer column), else --sequence's first column or the first list column."""
    if options.length is not None:
        if options.length not in schema.names:
            raise ColumnError("length", f"no such column (available: {', '.join(schema.names)})", value=options.length)
        if not pa.types.is_integer(schema.field(options.length).type):
            raise ColumnError("length", f"column is {schema.field(options.length).type}, expected an integer column "
                              "of each row's tokens", value=options.length)
        return options.length
    sequences = options.sequence or tuple(f.name for f in schema if is_sequence_type(f.type))
    if not sequences:
        raise ColumnError("by", f"no list (sequence) column to count tokens in (columns: {', '.join(schema.names)}); "
                          "give {length}", value="tokens")
    return sequences[0]


def _row_counts(plan: Mixture, chunk: Chunk) -> np.ndarray:
    """What each row counts: its tokens (--length's value, or its sequence's steps), else 1. A negative or null
    --length is an error naming the row."""
    if plan.length is None:
        return np.ones(chunk.num_rows, dtype=np.int64)
    column = chunk.data.column(plan.length)
    if is_sequence_type(column.type):
        return row_lengths(column)
    values = column.to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)
                         | (np.nan_to_num(values.astype(np.float64), nan=-1) < 0))
    if len(bad):
        raise InputError(f"{plan.locate(int(chunk.ids[bad[0]]))}: column {plan.length!r}: {column[int(bad[0])]} is "
                         "not a count of tokens (expected an integer >= 0)")
    return values.astype(np.int64)


def _measured(plan: Mixture, prepare: Callable[[Chunk], Any], chunk: Chunk) -> tuple[Chunk, np.ndarray, Any]:
    """A map task's selection with what the weighted cut needs of it: each row's source, its key in its source's
    order (the sorted streams' order) and what it counts."""
    rows, labels, tally = prepare(chunk)
    return rows, labels, (tally, labels, rng.permutation_keys(plan.seed, ORDER_STAGE, rows.ids),
                          _row_counts(plan, rows))


def _weighted_cut(op: Operation, plan: Mixture, scattered: Scattered, runtime: Runtime) -> Cut:
    """--by tokens / --schedule: each source's counts in its stream's order, then the quota batches that follow the
    weights by them (ops.quotas.plan_layout), up to --size (or the schedule's total): a source that runs out before
    it, under its cap, is an error before anything is written."""
    options, k = plan.options, plan.num_classes
    selected = Tally()
    labels, keys, counts = [], [], []
    for tally, label, key, count in scattered.stats:
        selected.merge(tally)
        labels.append(label), keys.append(key), counts.append(count)
    label, key, count = (np.concatenate(x) if x else np.zeros(0, dtype=np.int64) for x in (labels, keys, counts))
    cumulative = []
    for c in range(k):
        mine = label == c
        ordered = count[mine][np.argsort(key[mine], kind="stable")]
        cumulative.append(np.concatenate([[0], np.cumsum(ordered)]).astype(np.int64))
    docs: Documents | Units = Documents(tuple(cumulative), cycle=options.replacement) if plan.length else ROWS
    layout = _dealt(plan, np.array([len(c) - 1 for c in cumulative], dtype=np.int64), docs)
    quotas = np.array(list(layout.sequence()), dtype=np.int64).reshape(-1, k)
    used = quotas.sum(axis=0)
    written = Tally()
    if len(quotas):
        written.add(class_out=used)
    record_layout(layout, written)
    if plan.length:
        written.latest["tokens"] = [int(t) for t in docs.counted(np.zeros(k, dtype=np.int64), used).tolist()]
    batches = QuotaBatches(scattered.groups, quotas, plan.seed, BATCH_STAGE, scattered.schema, options.replacement)
    return Cut(batches, functools.partial(written_stats, op, plan, selected, written))


def _dealt(plan: Mixture, rows: np.ndarray, docs: Documents | Units) -> QuotaLayout:
    """The quota batches of a mix by tokens or schedule, from each source's rows and what its documents count (in
    the order its stream deals them; ROWS: by rows, which the plan alone knows): up to --size (or the schedule's
    total), where a source that runs out before it, under its cap, is an error."""
    options, k = plan.options, plan.num_classes
    schedule = plan.schedule
    available = schedule.caps(rows, options.replacement) if schedule is not None else (
        np.full(k, np.iinfo(np.int64).max // 2) if options.replacement else rows)
    end = plan.info["end"]
    size = options.batch_size
    assert size is not None, "weighted mixes are dealt in batches"
    curve: Curve | None = schedule.curve() if schedule is not None else None
    if plan.previous is not None:
        curve = Switched(plan.previous.curve(), curve or Constant(plan.target), plan.previous.at * size)
    layout = plan_layout(available, plan.target, size, partial=not options.drop_remainder, oversample=False,
                         curve=curve, docs=docs, end=end)
    if end is not None and (layout.batches + 1) * size <= end:
        _ran_out(plan, layout, available, rows, end)
    return layout


def _ran_out(plan: Mixture, layout: QuotaLayout, available: np.ndarray, rows: np.ndarray, end: int) -> None:
    """The error for a source whose documents (under its cap) run out before the mixture's end."""
    used = layout.per_class - np.asarray(layout.partial or np.zeros(len(rows)), dtype=np.int64)
    following = next(itertools.islice(layout.full_quotas(), layout.batches, None))
    i = int(np.argmax(used + following > available))
    capped = available[i] != rows[i]
    has = f"its cap of {int(available[i]):,} rows" if capped else f"its {int(rows[i]):,} rows"
    raise InputError(f"source {plan.info['names'][i]!r} runs out after {layout.batches * layout.batch_size:,} "
                     f"{plan.info['by']} of the {end:,} asked for: its share needs more than {has}; give "
                     "--replacement to repeat it evenly, a larger cap, or a smaller --size (or schedule total)")


def _chunk_counts(column: str, count: Any, context: Context, chunk: Chunk) -> Tally:
    """A chunk's class counts (`count`, stratify's) and its rows as a chunk of its source (a chunk is of one)."""
    tally = count(context, chunk)
    if chunk.num_rows:
        tally.add_values(f"chunk_rows/{chunk.data.column(column)[0].as_py()}", np.array([chunk.num_rows]))
    return tally


def _check_memory(options: MixOptions, memory: int, stats: Tally, rows: np.ndarray, totals: np.ndarray) -> None:
    """Refuse, before any row is selected, a mixture whose making cannot fit --memory, however large --size: a map
    task builds the copies of one chunk at once (COPY_BYTES a copy at least), and --batch-size's layout holds every
    batch's quotas."""
    copies = -(-totals // np.maximum(rows, 1))
    chunk = np.array([stats.high.get(f"chunk_rows/{i}", 0) for i in range(len(rows))], dtype=np.int64)
    i = int(np.argmax(copies * chunk))
    size = "" if options.size is None else f"{options.size:,}"
    budget.check_fits("size", f"the copies of one chunk of source {options.names[i]!r} ({int(chunk[i]):,} rows, each "
                      f"written up to {int(copies[i]):,} times)", float(copies[i] * chunk[i] * COPY_BYTES), memory,
                      "give a smaller {size}", value=size or None, error=OptionInputError)
    if options.batch_size is not None:
        batches = -(-int(totals.sum()) // options.batch_size)
        budget.check_fits("size", f"the layout of {batches:,} batches", batches * (BATCH_BYTES + 16 * len(rows)),
                          memory,
                          "give a smaller {size} or a larger {batch_size}", value=size or None, error=OptionInputError,
                          mentions=["batch_size"])


def source_table(sources: list[dict[str, Any]]) -> list[str]:
    """manifest["stats"]["sources"] as the summary and `batchtool inspect` show it: one aligned row per source."""
    tokens = "tokens" in sources[0]
    cells = [("source", "rows", "weight", "taken", "repeats", "share") + (("tokens", "token share") if tokens else ())]
    cells += [(s["name"], f"{s['rows']:,}", f"{s['weight']:.4g}", f"{s['taken']:,}", f"{s['repeats']:,}",
               f"{100 * s['share']:.2f}%") + ((f"{s['tokens']:,}", f"{100 * s['token_share']:.2f}%") if tokens else ())
              for s in sources]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            for row in cells]


def _checked(padding: BatchPadding, locate: Callable[[int], str], prepare: Callable[[Chunk], Any], chunk: Chunk) -> Any:
    """--pad: a map task's chunk, its sequence columns checked to agree in length row by row (an error names the
    row), then selected (`prepare`, the balanced batches' own)."""
    padding.check(chunk.data, lambda i: locate(int(chunk.ids[i])))
    return prepare(chunk)


def _one_group(op: Operation, plan: Stratification, chunk: Chunk) -> tuple[Chunk, np.ndarray, Tally]:
    """A map task's chunk of the shuffled mixture: the selected rows, all to the one group, and the counts."""
    rows, _, tally = selected_rows(op, plan, chunk)
    return rows, np.zeros(rows.num_rows, dtype=np.int64), tally


def _shuffled(op: Operation, plan: Stratification, batch_rows: int, scattered: Scattered, runtime: Runtime) -> Cut:
    """The mixture in its keyed order, cut into row groups as a global shuffle cuts them."""
    selected = Tally()
    for tally in scattered.stats:
        selected.merge(tally)
    return Cut(FixedBatches(scattered.groups[0], scattered.schema, batch_rows, int(scattered.rows.sum())),
               functools.partial(op.report, plan, selected))


OP = Mix()

__all__ = ["OP", "OUTPUT_COLUMNS", "STAGE", "Mix", "MixOptions", "Mixture", "batch_padding",
           "largest_remainder", "mixture_totals", "source_table"]
