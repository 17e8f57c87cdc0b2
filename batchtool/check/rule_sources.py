"""Where check rules come from: a TOML rules file, or the command's flags; both read through the table reader every
batchtool file goes through (batchtool.core.options.read_table), each problem worded where it came from."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from batchtool.check.rules import (DRIFT_RULES, KINDS, MANIFEST_RULES, WORDS, BatchQuotas, BatchRows, Checksums,
                                   ClassProportions, Crc, Drift, DriftLengths, DriftProportions, LabelRange, Length,
                                   NoNan, NoNulls, PaddingEfficiency, RankBatches, RowCount, Rule, RuleSet, Unique)
from batchtool.core.errors import OptionError, UsageError
from batchtool.core.options import TableError, read_table
from batchtool.core.tomlfile import read_toml


def _field(name: str) -> str:
    """A rules file's keys are the fields' names as they are (`num_classes`)."""
    return name


def load_rules(path: str) -> RuleSet:
    """Read a rules file; any unknown key or wrong type is an error naming the file, the rule and the key."""
    doc = read_toml(path, "rules file")
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
    origin = f"{path}: {label} ({kind})"
    return _build(cls, values, lambda key: f"{origin}, key {key!r}", origin=origin)


R = TypeVar("R")


def _build(cls: type[R], values: Mapping[str, Any], where: Callable[[str], str], *,
           unknown: Callable[[str, Sequence[str]], str] | None = None, sep: str = ": ", **settings: Any) -> R:
    """A rule (or a rules file's top level) from plain values (TOML or flags), read by the reader pipeline files
    go through (batchtool.core.options.read_table), its errors in a rules file's words.

    `where(key)` says where a key came from, `sep` what comes between that and the problem, and
    `unknown(key, allowed)` words an unknown key (default: `where(key): unknown key (expected: kind, ...)`).
    `settings` are fields no file sets (a rule's origin).
    """
    try:
        return read_table(cls, values, name=_field, **settings)
    except TableError as exc:
        if exc.missing:
            raise UsageError(f"{where(exc.key)}: required") from None
        if unknown is not None:
            raise UsageError(unknown(exc.key, exc.allowed)) from None
        raise UsageError(f"{where(exc.key)}: unknown key (expected: {', '.join(['kind', *exc.allowed])})") from None
    except OptionError as exc:
        raise UsageError(f"{where(exc.field)}{sep}{exc.problem}") from None


def rules_from_flags(*, label: str | None = None, num_classes: int | None = None,
                     target: str | Sequence[float] | None = None, tolerance: float | None = None,
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

        given: dict[str, str] = {}  # each flag once, as given (--min-bucket-padding-efficiency sets two keys)
        for key in values:
            given.setdefault(flags[key][0], where(key))
        rules.append(_build(cls, {"name": name, **values}, where,
                            origin=f"rule {name!r} ({', '.join(given.values())})" if given else ""))

    label_flag = ("--label", label)
    drifting = baseline is not None and drift_rules
    if label is not None and num_classes is None and target is None and not drifting:
        raise UsageError(f"--label {label}: says which column --num-classes, --target and --baseline check; "
                         "give one of them")
    if num_classes is not None:
        add(LabelRange, "label_range", {"column": label_flag, "num_classes": ("--num-classes", num_classes)})
    if target is not None:
        shares = target if isinstance(target, str) else ",".join(str(p) for p in target)
        add(ClassProportions, "class_proportions", {"column": label_flag, "target": ("--target", shares),
                                                    "num_classes": ("--num-classes", num_classes),
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
