"""Check rules: what `batchtool check` verifies, as frozen configs read from a TOML file or built from flags."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

from batchtool.errors import InputError, OptionError, UsageError
from batchtool.options import TableError, TextTable, Typed, Wording, option, read_table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

WORDS = Wording("must be", {str: "string", bool: "boolean", int: "integer", float: "float", list: "array",
                            dict: "table"})
"""How a rules file says a value has the wrong type: `must be an integer, got string 'long'`, in TOML's names."""
TEXT, INTEGER, NUMBER, BOOLEAN = (Typed(t, wording=WORDS) for t in (str, int, float, bool))
COLUMNS = Typed(str, array=True, wording=WORDS)
BOUNDS = Typed(int, count=2, wording=WORDS)


@dataclass(frozen=True)
class Rule:
    """Base of every rule: a unique name (shown in the report) and the kind that says what is checked.

    Its keys are option fields (batchtool.options.option) read by the schema reader every batchtool file goes through;
    a bad value is an OptionError naming the key."""

    name: str = option("The rule's name in the report (default: its kind); unique.", TEXT)
    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise OptionError("name", "must be a non-empty string")

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
    difference, or with `relative` a fraction of the target."""

    kind: ClassVar[str] = "class_proportions"
    target: tuple[float, ...] = option("Each class's share, in class order.", Typed(float, array=True, wording=WORDS))
    tolerance: float = option("How far a share may be from its target.", NUMBER, 0.01)
    relative: bool = option("The tolerance is a fraction of the target.", BOOLEAN, False)
    column: str = option("The label column.", TEXT, "label")

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(len(self.target) > 0, "target", "must list one proportion per class")
        _require(all(0 <= p <= 1 for p in self.target), "target", f"proportions must be in [0, 1], got "
                 f"{list(self.target)}")
        _require(math.isclose(sum(self.target), 1.0, abs_tol=1e-6), "target",
                 f"proportions must sum to 1, got {sum(self.target):.6g}")
        _require(self.tolerance >= 0, "tolerance", f"must be >= 0, got {self.tolerance}")

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
class RowCount(Rule):
    kind: ClassVar[str] = "row_count"
    min: int | None = option("Fewest allowed.", INTEGER, None)
    max: int | None = option("Most allowed.", INTEGER, None)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.min is not None or self.max is not None, "min", "a row_count rule needs min or max")
        _check_min_max(self.min, self.max)


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
class PackingEfficiency(PaddingEfficiency):
    """Real steps / (rows x max length) at least `min`, as recorded in a pack output's manifest."""

    kind: ClassVar[str] = "packing_efficiency"
    stat: ClassVar[str] = "packing_efficiency"
    written_by: ClassVar[str] = "pack"


@dataclass(frozen=True)
class Checksums(Rule):
    """Every output file of a batchtool DST has the size and sha256 its manifest records."""

    kind: ClassVar[str] = "checksums"


@dataclass(frozen=True)
class Crc(Rule):
    """Every TFRecord record's length and data CRCs are valid."""

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
class BatchRows(Rule):
    """Rows of every batch (as batchtool.load yields them) within [min, max]."""

    kind: ClassVar[str] = "batch_rows"
    min: int | None = option("Fewest allowed.", INTEGER, None)
    max: int | None = option("Most allowed.", INTEGER, None)

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.min is not None or self.max is not None, "min", "a batch_rows rule needs min or max")
        _check_min_max(self.min, self.max)


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
    NoDuplicateRows, RowCount, PaddingEfficiency, PackingEfficiency, Checksums, Crc, ManifestRows, ManifestBatches, ManifestSchema,
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


def _field(name: str) -> str:
    """A rules file's keys are the fields' names as they are (`num_classes`)."""
    return name


def load_rules(path: str) -> RuleSet:
    """Read a rules file; any unknown key or wrong type is an error naming the file, the rule and the key."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the rules file ({exc.strerror or exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc})") from exc
    top = _build(RuleSet, {k: v for k, v in doc.items() if k != "rules"},
                 lambda key: f"{path}: top-level key {key!r}", unknown=lambda key, allowed: (
                     f"{path}: unknown top-level key {key!r} (expected: {', '.join(['rules', *allowed])})"),
                 sep=" ")
    tables = doc.get("rules", [])
    if not isinstance(tables, list):
        raise UsageError(f"{path}: top-level key 'rules' must be an array, got {WORDS.shown(tables)}")
    if not all(isinstance(t, dict) for t in tables):
        raise UsageError(f"{path}: 'rules' must be an array of tables ([[rules]] sections)")
    if not tables:
        raise UsageError(f"{path}: no rules (add [[rules]] sections)")
    rules = tuple(_rule_from_table(path, i, table) for i, table in enumerate(tables))
    if "baseline" in doc and not any(isinstance(r, Drift) for r in rules):
        raise UsageError(f"{path}: top-level key 'baseline' is set but no rule compares with it (add drift_* rules: "
                         f"{', '.join(cls.kind for cls in DRIFT_RULES)})")
    try:
        return replace(top, rules=rules)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _rule_from_table(path: str, index: int, table: dict[str, Any]) -> Rule:
    kind = table.get("kind")
    name = table.get("name", kind)
    label = f"rule {name!r}" if isinstance(name, str) else f"rule #{index + 1}"
    if not isinstance(kind, str) or kind not in KINDS:
        given = "nothing" if kind is None else WORDS.shown(kind)
        raise UsageError(f"{path}: {label}: key 'kind' must be one of {', '.join(KINDS)}, got {given}")
    cls = KINDS[kind]
    values = {k: v for k, v in table.items() if k != "kind"}
    values.setdefault("name", kind)
    return _build(cls, values, lambda key: f"{path}: {label} ({kind}), key {key!r}")


R = TypeVar("R")


def _build(cls: type[R], values: Mapping[str, Any], where: Callable[[str], str], *,
           unknown: Callable[[str, Sequence[str]], str] | None = None, sep: str = ": ") -> R:
    """A rule (or a rules file's top level) from plain values (TOML or flags), read by the reader pipeline files
    go through (batchtool.options.read_table), its errors in a rules file's words.

    `where(key)` says where a key came from, `sep` what comes between that and the problem, and
    `unknown(key, allowed)` words an unknown key (default: `where(key): unknown key (expected: kind, ...)`).
    """
    try:
        return read_table(cls, values, name=_field)
    except TableError as exc:
        if exc.missing:
            raise UsageError(f"{where(exc.key)}: required") from None
        if unknown is not None:
            raise UsageError(unknown(exc.key, exc.allowed)) from None
        raise UsageError(f"{where(exc.key)}: unknown key (expected: {', '.join(['kind', *exc.allowed])})") from None
    except OptionError as exc:
        raise UsageError(f"{where(exc.field)}{sep}{exc.problem}") from None


def rules_from_flags(*, label: str | None = None, num_classes: int | None = None,
                     target: Sequence[float] | None = None, tolerance: float | None = None,
                     min_rows: int | None = None, max_rows: int | None = None,
                     unique: Sequence[Sequence[str]] = (), no_nulls: Sequence[str] = (), no_nan: Sequence[str] = (),
                     length: str | None = None, min_length: int | None = None, max_length: int | None = None,
                     checksums: bool = False, crc: bool = False, manifest: bool = False,
                     min_padding_efficiency: float | None = None, min_bucket_padding_efficiency: float | None = None,
                     min_batch_rows: int | None = None, max_batch_rows: int | None = None,
                     batch_quotas: bool = False, rank_batches: bool = False, baseline: str | None = None,
                     drift_tolerances: Mapping[str, float] | None = None, drift_rules: bool = True) -> RuleSet:
    """The common rules as flags; each becomes the same rule a rules file would give, named after its kind.

    `baseline` adds one rule per drift kind (tolerances keyed as in --tolerance KEY=X), unless
    `drift_rules` is false because a rules file brings its own; it is their baseline either way.
    """
    rules: list[Rule] = []
    drift_tolerances = dict(drift_tolerances or {})

    def add(cls: type[Rule], name: str, flags: dict[str, tuple[str, Any]]) -> None:
        """`flags` maps each key to (flag, value); a flag ending in '=' (--tolerance KEY=) takes its value unspaced."""
        values = {key: value for key, (_, value) in flags.items() if value is not None}

        def where(key: str) -> str:
            if key not in flags:
                return f"rule {name!r}, key {key!r}"
            flag, value = flags[key]
            return flag + ("" if flag.endswith("=") else " ") + _flag_value(value)

        rules.append(_build(cls, {"name": name, **values}, where))

    label_flag = ("--label", label)
    drifting = baseline is not None and drift_rules
    if label is not None and num_classes is None and target is None and not drifting:
        raise UsageError(f"--label {label}: says which column --num-classes, --target and --baseline check; "
                         "give one of them")
    if num_classes is not None:
        add(LabelRange, "label_range", {"column": label_flag, "num_classes": ("--num-classes", num_classes)})
    if target is not None:
        add(ClassProportions, "class_proportions", {"column": label_flag, "target": ("--target", tuple(target)),
                                                    "tolerance": ("--tolerance", tolerance)})
    elif tolerance is not None:
        raise UsageError(f"--tolerance {tolerance}: applies to --target, which is not given "
                         "(for --baseline give KEY=X, e.g. --tolerance proportions=0.02)")
    if min_rows is not None or max_rows is not None:
        add(RowCount, "row_count", {"min": ("--min-rows", min_rows), "max": ("--max-rows", max_rows)})
    for columns in unique:
        add(Unique, "unique:" + ",".join(columns), {"columns": ("--unique", tuple(columns))})
    if no_nulls:
        add(NoNulls, "no_nulls", {"columns": ("--no-nulls", tuple(no_nulls))})
    if no_nan:
        add(NoNan, "no_nan", {"columns": ("--no-nan", tuple(no_nan))})
    if min_length is not None or max_length is not None:
        add(Length, "length", {"column": ("--length", length), "min": ("--min-length", min_length),
                               "max": ("--max-length", max_length)})
    elif length is not None and not drifting:
        raise UsageError(f"--length {length}: says which column --min-length/--max-length and --baseline check; "
                         "give one of them")
    if checksums or manifest:
        rules.append(Checksums("checksums"))
    if manifest:
        rules += [cls(cls.kind) for cls in MANIFEST_RULES if cls is not Checksums]
    if crc:
        rules.append(Crc("crc"))
    if min_padding_efficiency is not None:
        add(PaddingEfficiency, "padding_efficiency", {"min": ("--min-padding-efficiency", min_padding_efficiency)})
    if min_bucket_padding_efficiency is not None:
        add(PaddingEfficiency, "padding_efficiency:buckets",
            {"min": ("--min-bucket-padding-efficiency", min_bucket_padding_efficiency),
             "per_bucket": ("--min-bucket-padding-efficiency", True)})
    if min_batch_rows is not None or max_batch_rows is not None:
        add(BatchRows, "batch_rows", {"min": ("--min-batch-rows", min_batch_rows),
                                      "max": ("--max-batch-rows", max_batch_rows)})
    if batch_quotas:
        rules.append(BatchQuotas("batch_quotas"))
    if rank_batches:
        rules.append(RankBatches("rank_batches"))
    for key, value in drift_tolerances.items():
        flag = f"--tolerance {key}={value:g}"
        if key not in {cls.tolerance_key() for cls in DRIFT_RULES}:
            raise UsageError(f"{flag}: unknown key (expected one of: "
                             f"{', '.join(cls.tolerance_key() for cls in DRIFT_RULES)}, or a number for --target)")
        if baseline is None:
            raise UsageError(f"{flag}: applies to --baseline, which is not given")
        if not drift_rules:
            raise UsageError(f"{flag}: the rules file has its own drift rules; set their tolerance there")
    if drifting:
        for cls in DRIFT_RULES:
            key = cls.tolerance_key()
            values: dict[str, tuple[str, Any]] = {"tolerance": (f"--tolerance {key}=", drift_tolerances.get(key))}
            if cls is DriftProportions:
                values["column"] = label_flag
            elif cls is DriftLengths:
                values["column"] = ("--length", length)
            add(cls, cls.kind, values)
    return RuleSet(tuple(rules), baseline=baseline)


def _flag_value(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)
