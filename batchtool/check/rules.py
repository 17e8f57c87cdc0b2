"""Check rules: what `batchtool check` verifies, each a frozen config whose keys are option fields (read from a rules
file or built from flags by batchtool.check.rule_sources)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from batchtool.core.errors import OptionError, UsageError
from batchtool.ops.targets import Target, TargetSpec, check_target
from batchtool.core.options import TextTable, Typed, Wording, option

WORDS = Wording("must be", {str: "string", bool: "boolean", int: "integer", float: "float", list: "array",
                            dict: "table"})
"""How a rules file says a value has the wrong type: `must be an integer, got string 'long'`, in TOML's names."""
TEXT, INTEGER, NUMBER, BOOLEAN = (Typed(t, wording=WORDS) for t in (str, int, float, bool))
COLUMNS = Typed(str, array=True, wording=WORDS)
BOUNDS = Typed(int, count=2, wording=WORDS)


@dataclass(frozen=True)
class Rule:
    """Base of every rule: a unique name (shown in the report) and the kind that says what is checked.

    Its keys are option fields (batchtool.core.options.option) read by the schema reader every batchtool file goes through;
    a bad value is an OptionError naming the key."""

    name: str = option("The rule's name in the report (default: its kind); unique.", TEXT)
    origin: str = field(default="", kw_only=True, compare=False, repr=False)
    """Where the rule was given, as its errors name it: `rules.toml: rule #3 'labels' (label_range)`, or the flags
    that made it."""
    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise OptionError("name", "must be a non-empty string")

    @property
    def label(self) -> str:
        """The rule as an error names it: where it was given, else by its name."""
        return self.origin or f"rule {self.name!r}"

    def reads(self) -> tuple[str, ...]:
        """Data columns the streaming pass must read for this rule (none: metadata or manifest only)."""
        return ()


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise OptionError(key, message)


def _check_min_max(low: int | None, high: int | None) -> None:
    """Optional counts `min` <= `max`, neither negative."""
    for key, value in (("min", low), ("max", high)):
        _require(value is None or value >= 0, key, f"must be >= 0, got {value}")
    _require(low is None or high is None or low <= high, "max", f"must be >= min ({low}), got {high}")


@dataclass(frozen=True)
class Schema(Rule):
    """Required columns and their Arrow types (e.g. int64, string, list<int64>); `exact` forbids others."""

    kind: ClassVar[str] = "schema"
    columns: tuple[tuple[str, str], ...] = option("Required columns and their Arrow types.",
                                                  TextTable('column = "type"', wording=WORDS))
    exact: bool = option("Forbid other columns.", BOOLEAN, False)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(len(self.columns) > 0, "columns", "must list at least one column")


@dataclass(frozen=True)
class ColumnsRule(Rule):
    """A rule over a list of columns (at least `min_columns` of them), which is what it reads."""

    columns: tuple[str, ...] = option("The columns checked.", COLUMNS)
    min_columns: ClassVar[int] = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(len(self.columns) >= self.min_columns, "columns",
                 "must list at least one column" if self.min_columns == 1
                 else f"must list at least {self.min_columns} columns")

    def reads(self) -> tuple[str, ...]:
        return self.columns


@dataclass(frozen=True)
class NoNulls(ColumnsRule):
    kind: ClassVar[str] = "no_nulls"


@dataclass(frozen=True)
class NoNan(ColumnsRule):
    """No NaN in float columns, including every element of list-of-float columns."""

    kind: ClassVar[str] = "no_nan"


@dataclass(frozen=True)
class LabelRange(Rule):
    """Every label in [0, num_classes) (a null label is out of range), as stratify requires."""

    kind: ClassVar[str] = "label_range"
    num_classes: int = option("Labels are in [0, num_classes).", INTEGER)
    column: str = option("The label column.", TEXT, "label")

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.num_classes >= 1, "num_classes", f"must be at least 1, got {self.num_classes}")

    def reads(self) -> tuple[str, ...]:
        return (self.column,)


@dataclass(frozen=True)
class ClassProportions(Rule):
    """Each class's share of the (non-null) labels within `tolerance` of its target: an absolute
    difference, or with `relative` a fraction of the target. The target is read and checked as stratify's
    --target: a list, or a string of shares (fractions such as 1/3 are exact), 'uniform' or CLASS=PROB pairs."""

    kind: ClassVar[str] = "class_proportions"
    target: Target = option("Each class's share: a list in class order, or a string as stratify's --target takes "
                            "(P0,P1,... with fractions such as 1/3, 'uniform', or CLASS=PROB pairs).", TargetSpec())
    tolerance: float = option("How far a share may be from its target.", NUMBER, 0.01)
    relative: bool = option("The tolerance is a fraction of the target.", BOOLEAN, False)
    column: str = option("The label column.", TEXT, "label")
    num_classes: int | None = option("The classes are [0, num_classes) (default: as many as a target list gives; "
                                     "for 'uniform' or pairs, up to the largest label seen).", INTEGER, None)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_target(self.target)
        _require(self.tolerance >= 0, "tolerance", f"must be >= 0, got {self.tolerance}")
        n = self.num_classes
        _require(n is None or n >= 1, "num_classes", f"must be at least 1, got {n}")
        _require(n is None or not isinstance(self.target, tuple) or len(self.target) == n, "num_classes",
                 f"must be the number of target proportions ({len(self.target)}), got {n}")
        _require(n is None or not isinstance(self.target, dict) or max(self.target) < n, "target",
                 f"names class {max(self.target) if isinstance(self.target, dict) else 0}, not below num_classes {n}")

    def reads(self) -> tuple[str, ...]:
        return (self.column,)


@dataclass(frozen=True)
class MinClassRows(Rule):
    """At least `min_rows` rows in every class: each of [0, num_classes) if given, else each class seen."""

    kind: ClassVar[str] = "min_class_rows"
    min_rows: int = option("Rows every class needs.", INTEGER)
    num_classes: int | None = option("The classes are [0, num_classes) (default: those seen).", INTEGER, None)
    column: str = option("The label column.", TEXT, "label")

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.min_rows >= 1, "min_rows", f"must be at least 1, got {self.min_rows}")
        _require(self.num_classes is None or self.num_classes >= 1, "num_classes",
                 f"must be at least 1, got {self.num_classes}")

    def reads(self) -> tuple[str, ...]:
        return (self.column,)


@dataclass(frozen=True)
class Length(Rule):
    """Bounds on a length: every row within [min, max], and the p50/p90/p99 quantiles within [low, high].

    `column` is an integer column or a sequence column whose steps are counted (default: the first list column).
    """

    kind: ClassVar[str] = "length"
    column: str | None = option("The length or sequence column (default: the first list column).", TEXT, None)
    min: int | None = option("Shortest length allowed.", INTEGER, None)
    max: int | None = option("Longest length allowed.", INTEGER, None)
    p50: tuple[int, int] | None = option("[low, high] of the median length.", BOUNDS, None)
    p90: tuple[int, int] | None = option("[low, high] of the 90th percentile length.", BOUNDS, None)
    p99: tuple[int, int] | None = option("[low, high] of the 99th percentile length.", BOUNDS, None)

    QUANTILES: ClassVar[tuple[tuple[str, float], ...]] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(any(v is not None for v in (self.min, self.max, self.p50, self.p90, self.p99)), "min",
                 "a length rule needs at least one of min, max, p50, p90, p99")
        _check_min_max(self.min, self.max)
        for key, _ in self.QUANTILES:
            bounds = getattr(self, key)
            _require(bounds is None or 0 <= bounds[0] <= bounds[1], key,
                     f"must be [low, high] with 0 <= low <= high, got {list(bounds or ())}")

    def reads(self) -> tuple[str, ...]:
        return (self.column,) if self.column else ()


@dataclass(frozen=True)
class SameLength(ColumnsRule):
    """Sequence columns that must have the same number of steps in every row (e.g. tokens and frames)."""

    kind: ClassVar[str] = "same_length"
    min_columns: ClassVar[int] = 2


@dataclass(frozen=True)
class Unique(ColumnsRule):
    """No two rows share a key (the values of `columns` together)."""

    kind: ClassVar[str] = "unique"


@dataclass(frozen=True)
class NoDuplicateRows(Rule):
    """No row equal to an earlier one in `columns` (default: every column)."""

    kind: ClassVar[str] = "no_duplicate_rows"
    columns: tuple[str, ...] | None = option("The columns compared (default: every column).", COLUMNS, None)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.columns is None or len(self.columns) > 0, "columns", "must list at least one column")

    def reads(self) -> tuple[str, ...]:
        return self.columns or ()


@dataclass(frozen=True)
class Count(Rule):
    """Base of the rules bounding a count of rows by `min` and `max`, at least one of them given."""

    min: int | None = option("Fewest allowed.", INTEGER, None)
    max: int | None = option("Most allowed.", INTEGER, None)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.min is not None or self.max is not None, "min", f"a {self.kind} rule needs min or max")
        _check_min_max(self.min, self.max)


@dataclass(frozen=True)
class RowCount(Count):
    kind: ClassVar[str] = "row_count"


@dataclass(frozen=True)
class PaddingEfficiency(Rule):
    """Real / padded elements at least `min`, as recorded in a bucket or segment output's manifest;
    with `per_bucket`, in every bucket of a bucket output."""

    kind: ClassVar[str] = "padding_efficiency"
    stat: ClassVar[str] = "padding_efficiency"
    """The manifest statistic the rule bounds, and the commands that record it."""
    written_by: ClassVar[str] = "bucket and segment"
    min: float = option("The lowest efficiency allowed, in (0, 1].", NUMBER)
    per_bucket: bool = option("In every bucket of a bucket output.", BOOLEAN, False)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(0 < self.min <= 1, "min", f"must be in (0, 1], got {self.min}")


@dataclass(frozen=True)
class MaxBatchCost(Rule):
    """Every batch's cost (rows x a row's cost at its padded lengths, the budget bucket cut it by) at most `max`,
    as a two-length bucket output's manifest records it per cell."""

    kind: ClassVar[str] = "max_batch_cost"
    max: float = option("The highest batch cost allowed (e.g. bucket's --max-tokens).", NUMBER)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(math.isfinite(self.max) and self.max >= 0, "max", f"must be >= 0, got {self.max}")


@dataclass(frozen=True)
class PackingEfficiency(PaddingEfficiency):
    """Real steps / (rows x max length) at least `min`, as recorded in a pack output's manifest."""

    kind: ClassVar[str] = "packing_efficiency"
    stat: ClassVar[str] = "packing_efficiency"
    written_by: ClassVar[str] = "pack"


@dataclass(frozen=True)
class RankCost(Rule):
    """The worst step's max/mean rank cost at most `max`, as recorded in a `pack --world-size` output's manifest."""

    kind: ClassVar[str] = "rank_cost_max_over_mean"
    stat: ClassVar[str] = "rank_cost_max_over_mean"
    written_by: ClassVar[str] = "pack --world-size"
    max: float = option("The highest max/mean rank cost allowed at any step, at least 1.", NUMBER)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(math.isfinite(self.max) and self.max >= 1, "max", f"must be a number >= 1, got {self.max}")


@dataclass(frozen=True)
class Checksums(Rule):
    """Every output file of a batchtool DST has the size and sha256 its manifest records."""

    kind: ClassVar[str] = "checksums"


@dataclass(frozen=True)
class Crc(Rule):
    """Every record's length and data CRCs are valid (a format whose records carry checksums)."""

    kind: ClassVar[str] = "crc"


@dataclass(frozen=True)
class ManifestRows(Rule):
    """Every output file of a batchtool DST holds the rows its manifest records (and they add up to its total)."""

    kind: ClassVar[str] = "manifest_rows"


@dataclass(frozen=True)
class ManifestBatches(Rule):
    """Every output file of a batchtool DST holds the batches its manifest records."""

    kind: ClassVar[str] = "manifest_batches"


@dataclass(frozen=True)
class ManifestSchema(Rule):
    """Every output file of a batchtool DST has the schema its manifest records."""

    kind: ClassVar[str] = "manifest_schema"


MANIFEST_RULES: tuple[type[Rule], ...] = (Checksums, ManifestRows, ManifestBatches, ManifestSchema)
"""What `check DST` verifies of a batchtool output when no rule is given (and what --manifest adds)."""


@dataclass(frozen=True)
class BatchRows(Count):
    """Rows of every batch (as batchtool.load yields them) within [min, max]."""

    kind: ClassVar[str] = "batch_rows"


@dataclass(frozen=True)
class BatchQuotas(Rule):
    """Every batch of a `stratify --balanced-batches` output holds exactly the class quotas its manifest implies."""

    kind: ClassVar[str] = "batch_quotas"


@dataclass(frozen=True)
class RankBatches(Rule):
    """Every training rank of a rank-sharded output gets the same number of batches (skipped without ranks)."""

    kind: ClassVar[str] = "rank_batches"
    column: str = option("The rank column.", TEXT, "rank")


@dataclass(frozen=True)
class Drift(Rule):
    """Base of the rules comparing SRC with a baseline dataset: a statistic within `tolerance` of the baseline's.

    `--tolerance KEY=X` sets `tolerance` of the drift rule `drift_KEY` that --baseline adds.
    """

    tolerance: float = option("How far from the baseline's the statistic may be.", NUMBER, 0.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(math.isfinite(self.tolerance) and self.tolerance >= 0, "tolerance",
                 f"must be a number >= 0, got {self.tolerance}")

    @classmethod
    def tolerance_key(cls) -> str:
        return cls.kind.removeprefix("drift_")


@dataclass(frozen=True)
class DriftRows(Drift):
    """Row count within `tolerance` of the baseline's, as a ratio: |rows / baseline rows - 1| <= tolerance."""

    kind: ClassVar[str] = "drift_rows"
    tolerance: float = option("|rows / baseline rows - 1| at most.", NUMBER, 0.1)


@dataclass(frozen=True)
class DriftProportions(Drift):
    """Each class's share of the labels within `tolerance` (absolute) of its share in the baseline.

    `column` defaults to `label` when SRC has such an integer column (else the rule is skipped).
    """

    kind: ClassVar[str] = "drift_proportions"
    tolerance: float = option("|share - baseline share| at most, per class.", NUMBER, 0.02)
    column: str | None = option("The label column (default: label).", TEXT, None)

    def reads(self) -> tuple[str, ...]:
        return (self.column,) if self.column else ()


@dataclass(frozen=True)
class DriftLengths(Drift):
    """Length quantiles p50, p90 and p99 each within `tolerance` of the baseline's, relative to it.

    `column` is an integer column or a sequence column whose steps are counted (default: the first list column).
    """

    kind: ClassVar[str] = "drift_lengths"
    tolerance: float = option("Each quantile's distance from the baseline's, relative to it.", NUMBER, 0.1)
    column: str | None = option("The length or sequence column (default: the first list column).", TEXT, None)

    def reads(self) -> tuple[str, ...]:
        return (self.column,) if self.column else ()


@dataclass(frozen=True)
class DriftNulls(Drift):
    """Each column's share of null values within `tolerance` (absolute) of the baseline's.

    `columns` defaults to every column SRC and the baseline share.
    """

    kind: ClassVar[str] = "drift_nulls"
    tolerance: float = option("|null share - baseline null share| at most, per column.", NUMBER, 0.01)
    columns: tuple[str, ...] | None = option("The columns compared (default: those both share).", COLUMNS, None)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.columns is None or len(self.columns) > 0, "columns", "must list at least one column")

    def reads(self) -> tuple[str, ...]:
        return self.columns or ()


DRIFT_RULES: tuple[type[Drift], ...] = (DriftRows, DriftProportions, DriftLengths, DriftNulls)
"""The drift rules --baseline adds, keyed for --tolerance by their kind without `drift_`."""

KINDS: dict[str, type[Rule]] = {cls.kind: cls for cls in (
    Schema, NoNulls, NoNan, LabelRange, ClassProportions, MinClassRows, Length, SameLength, Unique,
    NoDuplicateRows, RowCount, PaddingEfficiency, MaxBatchCost, PackingEfficiency, RankCost, Checksums, Crc,
    ManifestRows, ManifestBatches, ManifestSchema,
    BatchRows, BatchQuotas, RankBatches, *DRIFT_RULES)}


@dataclass(frozen=True)
class RuleSet:
    """A rules file: the rules in order, plus report settings the flags may override (its top-level keys)."""

    rules: tuple[Rule, ...] = ()
    key: str | None = option("The key column offenders are named by.", TEXT, None)
    max_offenders: int | None = option("Offenders listed per rule.", INTEGER, None)
    baseline: str | None = option("The dataset, batchtool output or manifest the drift rules compare SRC with.",
                                  TEXT, None)

    def __post_init__(self) -> None:
        _require(self.max_offenders is None or self.max_offenders >= 0, "max_offenders",
                 f"must be >= 0, got {self.max_offenders}")
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise UsageError(f"two rules are named {rule.name!r}; rule names must be unique")
            seen.add(rule.name)

    def __add__(self, other: RuleSet) -> RuleSet:
        """Both sets of rules; `other`'s settings win where given."""
        return RuleSet(self.rules + other.rules, other.key or self.key,
                       self.max_offenders if other.max_offenders is None else other.max_offenders,
                       other.baseline or self.baseline)

    @property
    def drift(self) -> tuple[Drift, ...]:
        return tuple(r for r in self.rules if isinstance(r, Drift))
