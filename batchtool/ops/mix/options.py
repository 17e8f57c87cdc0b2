"""mix's options: the sources' names and weights (or a temperature), the mixture's size, its batches; and the
mixture's exact per-source counts from them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Union

from batchtool.core.errors import OptionError, OptionInputError
from batchtool.io.mix_source import SOURCE
from batchtool.ops import names as own
from batchtool.core.options import Choice, Column, ColumnList, Flag, Integer, Number, Pairs, Value, option, shown

if TYPE_CHECKING:  # arrays are imported where the functions run: options declared from here make --help
    import numpy as np

    from batchtool.ops.mix.schedule import Replan

OUTPUT_COLUMNS = (SOURCE, "length", "mask")
"""mix's own columns: each row's source, by index (the manifest names them); with --pad, as bucket writes them, each
row's real steps and (--mask) the mask of them."""

BY = ("rows", "tokens")
"""What --by apportions."""

Weights = Union[tuple[float, ...], tuple[tuple[str, float], ...]]
"""Weights in source order, or (NAME, W) pairs."""


class Names(Value):
    """NAME,NAME,...: one per source, in order (a list in a pipeline file)."""

    metavar = "NAME[,NAME...]"

    def parse(self, field: str, value: Any) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            raise OptionError(field, f"expected names, NAME,NAME,... or a list, got {shown(value)}")
        names = tuple(v.strip() for v in items)
        if not all(names):
            raise OptionError(field, "an empty name (give NAME,NAME,...)", value=repr(value))
        return names


class WeightsSpec(Value):
    """W1,W2,... in source order, or NAME=W pairs (a list of numbers, a string or a table in a pipeline file)."""

    metavar = "W1,W2,...|NAME=W,..."

    def parse(self, field: str, value: Any) -> Weights:
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return tuple(float(v) for v in value)
        if not isinstance(value, str):
            raise OptionError(field, f"expected weights, W1,W2,... or NAME=W,..., got {shown(value)}")
        items = [item.strip() for item in value.split(",") if item.strip()]
        try:
            if not any("=" in item for item in items):
                return tuple(float(item) for item in items)
            pairs = []
            for item in items:
                name, sep, weight = item.partition("=")
                if not sep or not name.strip():
                    raise ValueError
                pairs.append((name.strip(), float(weight)))
            return tuple(pairs)
        except ValueError:
            raise OptionError(field, "expected weights in source order (0.7,0.3) or NAME=W pairs (en=0.7,de=0.3)",
                              value=repr(value)) from None


class ScheduleFile(Value):
    """The path of a schedule file (read when the mixture is planned: ops.mix.schedule)."""

    metavar = "FILE.toml"

    def parse(self, field: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise OptionError(field, f"expected the path of a schedule file, got {shown(value)}")
        return value


@dataclass(frozen=True)
class MixOptions:
    """What `mix` computes, given its sources' names (one per SRC, in order)."""

    names: tuple[str, ...] = option("The sources' names, in order (default: each SRC's last path component).",
                                    Names(), ())
    weights: Weights | None = option(
        "Each source's weight: W1,W2,... in source order, or NAME=W pairs (unnamed sources get 0); relative, "
        "they need not sum to 1.", WeightsSpec(), None)
    temperature: float | None = option(
        "Instead of --weights: source i weighs n_i^(1/T), n_i its rows (1: in proportion to size; larger: flatter, "
        "as multilingual training's temperature sampling; toward 0: the largest source gets all the weight, shared "
        "by sources tied for largest).", Number(metavar="T"), None)
    replacement: bool = option("With --size: repeat the rows of a source smaller than its share, evenly (every row "
                               "k or k+1 times).", Flag(), False)
    size: int | None = option("Rows of the mixture (default: the largest that uses no row twice, exactly "
                              "floor(M*w_i) of source i, M = min_i n_i/w_i).", Integer(metavar="N"), None)
    batch_size: int | None = option("Write batches of this many rows, each with its share of every source (floor "
                                    "or ceil of B*w_i), batch after batch within one row of the weights.",
                                    Integer(metavar="B"), None)
    drop_remainder: bool = option("Drop the final batch if it is smaller than --batch-size.", Flag(), False)
    pad: bool = option("With --batch-size: pad the sequence (list) columns of every batch to its longest row and add "
                       "a 'length' column of each row's real steps, as bucket writes them, so batchtool.load hands "
                       "out [B, T, ...] arrays (without it, ragged lists).", Flag(), False)
    sequence: tuple[str, ...] = option("With --pad: a sequence (list) column to pad; repeat for several, which must "
                                       "agree in length (default: every list column).", ColumnList(dedupe=True), ())
    pad_value: tuple[str, ...] = option("With --pad: pad value of a sequence column (default 0, '' for strings); "
                                        "repeatable.", Pairs("COL=V"), ())
    mask: bool = option("With --pad: add a 'mask' list<bool> column, true on real steps.", Flag(), False)
    by: str = option("What the weights apportion: rows, or tokens (each row counting its --length, else the steps of "
                     "its sequence column); with tokens, --size and --batch-size count tokens, and every source's "
                     "tokens stay within one of its documents of its share, batch after batch.",
                     Choice(BY), "rows")
    length: str | None = option("With --by tokens: an integer column of each row's tokens (default: the steps of the "
                                "first list column, or of --sequence).", Column(), None)
    schedule: str | None = option("Instead of --weights: a TOML file of weights as a piecewise-linear or stepwise "
                                  "function of the rows (or --by tokens) handed out, with optional per-source caps "
                                  "(max-repeats, max-fraction); batch after batch every source stays within one of its documents "
                                  "of the integral of its weight.", ScheduleFile(), None)
    output_column: tuple[tuple[str, str], ...] = own.output_column(OUTPUT_COLUMNS)
    previous: Replan | None = None
    """mix --continue DST --at STEP: DST's plan, kept for its first STEP batches (the command's flags, read from
    DST's manifest; recorded in the new manifest with the step)."""

    def __post_init__(self) -> None:
        if len(self.names) < 2:
            raise OptionError("names", f"{len(self.names)} source(s): mix takes at least two")
        twice = next((n for n in self.names if self.names.count(n) > 1), None)
        if twice is not None:
            raise OptionError("names", f"two sources are named {twice!r}; give each its own name with {{names}}")
        given = [name for name in ("weights", "temperature", "schedule") if getattr(self, name) is not None]
        if len(given) != 1:
            raise OptionError("weights", "give one of {weights}, {temperature} or {schedule}" + (
                f", not {{{given[0]}}} and {{{given[1]}}}" if len(given) > 1 else ""),
                              mentions=["temperature", "schedule"])
        if self.weights is not None:
            self._check_weights(self.weights)
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature > 0):
            raise OptionError("temperature", "must be a finite number > 0", value=f"{self.temperature:g}")
        if self.size is not None and self.size < 1:
            raise OptionError("size", "must be at least 1", value=str(self.size))
        if self.length is not None and self.by != "tokens":
            raise OptionError("length", "{length} goes with {by} tokens", mentions=["by"])
        if self.replacement and self.size is None and self.schedule is None:
            raise OptionError("replacement", "{replacement} needs {size}, the rows of the mixture", mentions=["size"])
        if self.batch_size is not None and self.batch_size < 1:
            raise OptionError("batch_size", "must be at least 1", value=str(self.batch_size))
        if self.drop_remainder and self.batch_size is None:
            raise OptionError("drop_remainder", "{drop_remainder} needs {batch_size}", mentions=["batch_size"])
        if self.pad and self.batch_size is None:
            raise OptionError("pad", "{pad} needs {batch_size}: only batches are padded to their longest row",
                              mentions=["batch_size"])
        for name, given in (("sequence", self.sequence), ("pad_value", self.pad_value), ("mask", self.mask)):
            if given and not self.pad:
                raise OptionError(name, f"{{{name}}} goes with {{pad}}", mentions=["pad"])
        own.check_names(OUTPUT_COLUMNS, self.output_column)

    def _check_weights(self, weights: Weights) -> None:
        shown_weights = ",".join(f"{w}" if isinstance(w, float) else f"{w[0]}={w[1]:g}" for w in weights)
        values = [w if isinstance(w, float) else w[1] for w in weights]
        if weights and not isinstance(weights[0], float):
            given = [name for name, _ in weights]  # type: ignore[misc]
            unknown = next((n for n in given if n not in self.names), None)
            if unknown is not None:
                raise OptionError("weights", f"no source is named {unknown!r} (sources: {', '.join(self.names)})",
                                  value=shown_weights)
            if len(set(given)) != len(given):
                raise OptionError("weights", "a source is given two weights", value=shown_weights)
        elif len(weights) != len(self.names):
            raise OptionError("weights", f"{len(weights)} weights for {len(self.names)} sources "
                              f"({', '.join(self.names)})", value=shown_weights)
        bad = next((v for v in values if not (math.isfinite(v) and v >= 0)), None)
        if bad is not None:
            raise OptionError("weights", f"weights must be finite and >= 0 (got {bad:g})", value=shown_weights)
        if not any(values):
            raise OptionError("weights", "every weight is 0: give one source a weight", value=shown_weights)

    @property
    def weighted(self) -> bool:
        """Quotas from each document's count or a schedule (ops.quotas.Documents, Curve) rather than the threshold
        selection: --by tokens or --schedule."""
        return self.by == "tokens" or self.schedule is not None

    @property
    def column(self) -> str:
        """The name of the source column."""
        return own.named(OUTPUT_COLUMNS, self.output_column)[SOURCE]

    def weight_fractions(self, rows: Sequence[int]) -> list[Fraction]:
        """Each source's weight as an exact fraction, normalised to sum to 1: the decimals as written (so 0.3 is
        3/10, never a float just below it), or n_i^(1/T) from the rows of each source."""
        if self.temperature is not None:
            raw = [Fraction(w) for w in temperature_weights(rows, self.temperature)]
        elif self.weights and not isinstance(self.weights[0], float):
            named = dict(self.weights)  # type: ignore[arg-type]
            raw = [Fraction(repr(float(named.get(name, 0.0)))) for name in self.names]
        else:
            raw = [Fraction(repr(float(w))) for w in self.weights or ()]  # type: ignore[arg-type]
        total = sum(raw)
        return [r / total for r in raw]


def temperature_weights(rows: Sequence[int], temperature: float) -> list[float]:
    """n_i^(1/T) for each source's rows n_i: as floats where the largest fits one (so T=1 gives the rows
    themselves, exactly), else (T near 0, where it overflows) relative to the largest source, (n_i/n_max)^(1/T), in
    log space: its limit as T goes to 0, all the weight on the largest source (shared by ties)."""
    exponent = 1.0 / temperature
    try:
        raw = [float(n) ** exponent for n in rows]
    except OverflowError:
        raw = []
    if raw and all(math.isfinite(w) for w in raw):
        return raw
    top = math.log(max(rows))
    return [math.exp((math.log(n) - top) / temperature) for n in rows]


def largest_remainder(total: int, weights: Sequence[Fraction]) -> list[int]:
    """`total` split by the weights: floor(total * w_i), plus one for the largest remainders (ties to the lower index),
    so the counts sum to `total`."""
    exact = [total * w for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:total - sum(counts)]:
        counts[i] += 1
    return counts


def mixture_totals(options: MixOptions, rows: np.ndarray, weights: Sequence[Fraction]) -> tuple[np.ndarray, Fraction]:
    """Rows of each source in the mixture and M, the largest mixture that uses no row twice (min_i n_i / w_i over
    the sources with a weight): floor(M * w_i) each, or --size split by largest remainder (beyond M only with
    --replacement, and no row more than MAX_RATE times)."""
    import numpy as np

    from batchtool.ops.copies import MAX_RATE

    m = min(Fraction(int(n)) / w for n, w in zip(rows.tolist(), weights) if w > 0)
    if options.size is None:
        return np.array([math.floor(m * w) for w in weights], dtype=np.int64), m
    if options.size > m and not options.replacement:
        raise OptionInputError("size", f"without {{replacement}} the sources allow at most {math.floor(m):,} rows at "
                               "these weights (" + ", ".join(f"{name} {int(n):,} rows" for name, n in
                                                             zip(options.names, rows.tolist())) + ")",
                               value=f"{options.size:,}", mentions=["replacement"])
    totals = np.array(largest_remainder(options.size, weights), dtype=np.int64)
    copies = totals / np.maximum(rows, 1)
    i = int(np.argmax(copies))
    if copies[i] > MAX_RATE:
        raise OptionInputError("size", f"source {options.names[i]!r} has {int(rows[i]):,} rows, each would be written "
                               f"about {copies[i]:.4g} times, more than {MAX_RATE:.10g} copies of one row; give a "
                               "smaller {size}", value=f"{options.size:,}")
    return totals, m


__all__ = ["BY", "MixOptions", "Names", "OUTPUT_COLUMNS", "ScheduleFile", "Weights", "WeightsSpec", "largest_remainder",
           "mixture_totals", "temperature_weights"]
