"""The options language: how an option is declared once (help, value kind, default) and read from the command line or
from a TOML table (pipeline files, check rules), every problem an OptionError naming the field."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from batchtool.core.errors import OptionError, UsageError, key

O = TypeVar("O")
"""An options dataclass."""

class Value:
    """A kind of option value. `parse` takes what TOML gives; `from_text` turns the command line's text
    (for `multiple` kinds, the list of its repeated texts) into that shape first."""

    multiple: ClassVar[bool] = False
    is_flag: ClassVar[bool] = False
    negatable: ClassVar[bool] = False
    """A flag with an off form too: `--NAME/--no-NAME` on the command line, `no-NAME = true` in a pipeline file."""
    metavar: ClassVar[str | None] = "TEXT"

    def __init__(self, *, metavar: str | None = None) -> None:
        """`metavar` names the value in --help where the help text names it (`--max-tokens T`)."""
        if metavar is not None:
            self.metavar = metavar  # type: ignore[misc]

    def from_text(self, field: str, text: Any) -> Any:
        return text

    def parse(self, field: str, value: Any) -> Any:
        raise NotImplementedError


class Flag(Value):
    """On or off: `--flag` on the command line, true/false in a pipeline file."""

    is_flag = True
    metavar = None

    def parse(self, field: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise OptionError(field, f"expected true or false, got {shown(value)}")
        return value


class Number(Value):
    """A number (a TOML integer or float; a string is refused, not converted)."""

    metavar = "FLOAT"

    def from_text(self, field: str, text: Any) -> Any:
        try:
            return float(text)
        except ValueError:
            raise OptionError(field, f"{text!r} is not a number") from None

    def parse(self, field: str, value: Any) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise OptionError(field, f"expected a number, got {shown(value)}")
        return float(value)


class Integer(Value):
    """A whole number (`metavar`: what the help calls it, e.g. "L" when other help texts refer to it)."""

    metavar = "INTEGER"

    def from_text(self, field: str, text: Any) -> Any:
        try:
            return int(text)
        except ValueError:
            raise OptionError(field, f"{text!r} is not an integer") from None

    def parse(self, field: str, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise OptionError(field, f"expected an integer, got {shown(value)}")
        if not -(1 << 63) <= value < 1 << 63:  # every count and size batchtool holds is a 64-bit integer
            raise OptionError(field, "must fit in 64 bits (at most 9223372036854775807)", value=str(value))
        return value


class NumberOrColumn(Value):
    """A constant (a number) or the name of a column holding one per row."""

    metavar = "COL|X"

    def from_text(self, field: str, text: Any) -> Any:
        try:
            return float(text)
        except ValueError:
            return text

    def parse(self, field: str, value: Any) -> float | str:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or value == "":
            raise OptionError(field, f"expected a number or a column name, got {shown(value)}")
        return float(value) if isinstance(value, (int, float)) else value


def shown(value: Any) -> str:
    """A TOML value as a message shows it: its kind and repr."""
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"


class Choice(Value):
    """One of a few words."""

    def __init__(self, choices: Sequence[str]) -> None:
        self.choices = tuple(choices)
        self.metavar = f"[{'|'.join(self.choices)}]"  # type: ignore[misc]

    def parse(self, field: str, value: Any) -> str:
        if value not in self.choices:
            raise OptionError(field, f"expected one of {', '.join(self.choices)}",
                              value=repr(value) if isinstance(value, str) else shown(value))
        return value


class Column(Value):
    """One column name."""

    metavar = "COL"

    def parse(self, field: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise OptionError(field, f"expected a column name, got {shown(value)}")
        return value


def _texts(field: str, value: Any, what: str, empty: str = "an empty name (give NAME or NAME,NAME,...)") -> list[str]:
    """A list of strings, each possibly comma-separated, as one list of non-empty parts."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        raise OptionError(field, f"expected {what}, got {shown(value)}")
    parts = []
    for item in items:
        split = [part.strip() for part in item.split(",")]
        if not all(split):
            raise OptionError(field, f"{item!r} has {empty}")
        parts += split
    return parts


class ColumnList(Value):
    """Column names, in order: COL,COL,... (repeatable) or a TOML list; each named once (with `dedupe`, a name
    given twice counts once instead)."""

    multiple = True
    metavar = "COL[,COL...]"

    def __init__(self, *, dedupe: bool = False, metavar: str | None = None) -> None:
        super().__init__(metavar=metavar)
        self.dedupe = dedupe

    def parse(self, field: str, value: Any) -> tuple[str, ...]:
        names = _texts(field, value, "a non-empty list of column names",
                       "an empty column name (give COL or COL,COL,...)")
        if self.dedupe:
            return tuple(dict.fromkeys(names))
        if len(set(names)) != len(names):
            raise OptionError(field, f"a column is named twice ({', '.join(names)})")
        return tuple(names)


class Pairs(Value):
    """KEY=VALUE pairs, the one kind for every option of them: repeatable on the command line (with `split`, also
    comma-separated: OLD=NEW,OLD=NEW; without, a value may hold commas), a TOML string, list of strings or table
    {KEY = VALUE}. With `names` each pair becomes (key, name), both non-empty (renames, output columns' names);
    without, each is kept as written (`tokens=-1`), for a check that needs the schema (pad values). `twice` and
    `same` are the problems of a key, or a name, given twice (`{}`: all of them), when that is one."""

    multiple = True

    def __init__(self, pair: str, *, names: bool = False, split: bool = False, example: str | None = None,
                 twice: str | None = None, same: str | None = None, metavar: str | None = None) -> None:
        """`pair` says what one is (COL=V: the messages' and, without `metavar`, the help's name for it);
        `example` one that a message about a malformed pair shows."""
        super().__init__(metavar=metavar or pair)
        self.pair, self.names, self.split, self.example = pair, names, split, example
        self.twice, self.same = twice, same

    def parse(self, field: str, value: Any) -> tuple[str, ...] | tuple[tuple[str, str], ...]:
        if isinstance(value, dict):
            if not self.names:
                return tuple(f"{k}={v}" for k, v in value.items())
            if not value or not all(isinstance(v, str) and v for v in value.values()):
                key_word, name_word = self.pair.lower().split("=")
                raise OptionError(field, f'expected a table of {key_word} = "{name_word}" names, got {shown(value)}')
            return self._checked(field, [(str(k), v) for k, v in value.items()])
        if self.split:
            texts = _texts(field, value, f"{self.pair} pairs",
                           f"an empty pair (give {self.pair} or {self.pair},{self.pair},...)")
        else:
            texts = [value] if isinstance(value, str) else value
            if not isinstance(texts, list) or not all(isinstance(v, str) for v in texts):
                raise OptionError(field, f"expected {self.pair} pairs, got {shown(value)}")
        if not self.names:
            return tuple(texts)
        pairs = []
        for text in texts:
            k, sep, v = text.partition("=")
            if not sep or not k.strip() or not v.strip():
                raise OptionError(field, f"expected {self.pair}" + (f", e.g. {self.example}" if self.example else ""),
                                  value=repr(text))
            pairs.append((k.strip(), v.strip()))
        return self._checked(field, pairs)

    def _checked(self, field: str, pairs: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
        for problem, given in ((self.twice, [k for k, _ in pairs]), (self.same, [v for _, v in pairs])):
            if problem is not None and len(set(given)) != len(given):
                raise OptionError(field, problem.format(", ".join(given)))
        return tuple(pairs)


class Wording:
    """How a kind says a value has the wrong type: `expected an integer, got string 'x'` as flags and pipeline
    files say it, or in a file's own words (`verb`, and `names` for the types of the values it shows)."""

    def __init__(self, verb: str = "expected", names: Mapping[type, str] | None = None) -> None:
        self.verb, self.names = verb, names

    def shown(self, value: Any) -> str:
        """A value as a message shows it: its type's name and repr."""
        return shown(value) if self.names is None else f"{self.names.get(type(value), type(value).__name__)} {value!r}"

    def wrong(self, field: str, what: str, value: Any) -> OptionError:
        return OptionError(field, f"{self.verb} {what}, got {self.shown(value)}")


class Typed(Value):
    """A TOML value of one type (str, int, float, bool; an int is a float too), or an array of them (`array`),
    exactly `count` of them if given; arrays are read as tuples. For a file that speaks in TOML's types."""

    NAMES: ClassVar[dict[type, str]] = {str: "string", int: "integer", float: "number", bool: "boolean"}

    def __init__(self, type_: type, *, array: bool = False, count: int | None = None,
                 wording: Wording | None = None) -> None:
        super().__init__(metavar=self.NAMES[type_].upper())
        self.type, self.array, self.count, self.wording = type_, array or count is not None, count, wording or Wording()

    def what(self) -> str:
        name = self.NAMES[self.type]
        if self.array:
            return f"a list of {'' if self.count is None else f'{self.count} '}{name}s"
        return f"an {name}" if name[0] in "aeiou" else f"a {name}"

    def parse(self, field: str, value: Any) -> Any:
        if not self.array:
            if not self._is(value):
                raise self.wording.wrong(field, self.what(), value)
            return float(value) if self.type is float else value
        if (not isinstance(value, (list, tuple)) or not all(self._is(v) for v in value)
                or self.count is not None and len(value) != self.count):
            raise self.wording.wrong(field, self.what(), value)
        return tuple(float(v) if self.type is float else v for v in value)

    def _is(self, value: Any) -> bool:
        if self.type in (int, float) and isinstance(value, bool):
            return False
        return isinstance(value, (int, float) if self.type is float else self.type)


class TextTable(Value):
    """A TOML table of strings {KEY = "VALUE"}, read as (key, value) pairs in order; `what` says what a pair is
    (`column = "type"`)."""

    def __init__(self, what: str, *, wording: Wording | None = None) -> None:
        super().__init__(metavar="TABLE")
        self.what, self.wording = what, wording or Wording()

    def parse(self, field: str, value: Any) -> tuple[tuple[str, str], ...]:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self.wording.wrong(field, f"a table of {self.what}", value)
        return tuple((str(k), v) for k, v in value.items())


@dataclasses.dataclass(frozen=True)
class Option:
    """A field's declaration: its help text and value kind (the flag and key come from the field's name)."""

    help: str
    value: Value
    required: bool = False
    """Must be given even though the dataclass has a default (for callers that build it directly)."""


def option(help: str, value: Value, default: Any = dataclasses.MISSING, *, required: bool = False) -> Any:
    """An options-dataclass field with what its command-line option and pipeline key are generated from."""
    return dataclasses.field(default=default, metadata={"option": Option(help, value, required)})


def fields(options: type) -> list[tuple[dataclasses.Field, Option]]:
    """The declared option fields of an options dataclass, in order."""
    return [(f, f.metadata["option"]) for f in dataclasses.fields(options) if "option" in f.metadata]


def required(f: dataclasses.Field) -> bool:
    return (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
            or f.metadata.get("option", Option("", Value())).required)


def from_texts(options: type, given: Mapping[str, Any]) -> dict[str, Any]:
    """Command-line values (text, tuples of texts, flags) as the values `build` takes."""
    kinds = {f.name: decl.value for f, decl in fields(options)}
    return {name: kinds[name].from_text(name, list(v) if isinstance(v, tuple) else v) for name, v in given.items()}


def build_options(options: type[O], given: Mapping[str, Any], **settings: Any) -> O:
    """The options from {field: raw value} (absent fields take their defaults): every value parsed by its
    kind, then the dataclass's own checks. Every problem is an OptionError naming the field. `settings` are
    fields that are not options of the op (the pipeline's memory for a spilling op), passed as they are."""
    values = dict(settings)
    for f, decl in fields(options):
        if f.name in given:
            values[f.name] = decl.value.parse(f.name, given[f.name])
        elif required(f):
            raise OptionError(f.name, "missing (required)")
    return options(**values)


class TableError(UsageError):
    """A key of a table that its schema does not take (`unknown`, with the keys it does: `allowed`) or a required
    one it lacks (`missing`); the message is in a pipeline file's words, and a file with its own re-words it."""

    def __init__(self, key: str, message: str, *, unknown: bool = False, missing: bool = False,
                 allowed: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.key, self.unknown, self.missing, self.allowed = key, unknown, missing, tuple(allowed)


def suggest(key: str, allowed: Sequence[str], what: str = "keys") -> str:
    """The allowed key (or column: `what` they are) closest to a mistyped one, or all of them."""
    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" ({what}: {', '.join(allowed)})"


def read_table(options: type[O], table: Mapping[str, Any], *, name: Callable[[str], str] = key,
               **settings: Any) -> O:
    """A TOML table read through an option schema, the one reader of every file batchtool reads (pipelines, check
    rules): its keys only (`name(field)` is a field's key; `no-KEY = true` turns a negatable flag off), the required
    ones present (TableError), then `build` (OptionError naming the field). `settings` go to `build`."""
    declared = {name(f.name): f for f, _ in fields(options)}
    flags = {text[2:]: name(field) for field, text in getattr(options, "FLAGS", {}).items()}
    for given in table:
        if given in flags and given not in declared:  # [output] to = ...: the command line's name
            raise TableError(given, f"unknown key {given!r} (did you mean {flags[given]!r}?)", unknown=True,
                             allowed=[flags[given]])
    negated = {f"no-{name(f.name)}": f for f, decl in fields(options) if decl.value.negatable}
    allowed = [*declared, *negated]
    for given in table:
        if given not in allowed:
            raise TableError(given, f"unknown key {given!r}{suggest(given, allowed)}", unknown=True, allowed=allowed)
    for given, f in declared.items():
        if required(f) and given not in table:
            raise TableError(given, f"missing key {given!r}", missing=True)
    values = {declared[k].name: v for k, v in table.items() if k in declared}
    for given, f in negated.items():  # no-pad = true is pad = false
        if given in table:
            if name(f.name) in table:
                raise TableError(given, f"keys {name(f.name)!r} and {given!r} set the same option; give one")
            if not isinstance(table[given], bool):
                raise TableError(given, f"key {given!r}: expected true or false, got {shown(table[given])}")
            values[f.name] = not table[given]
    return build_options(options, values, **settings)


