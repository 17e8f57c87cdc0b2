"""The statistics `check` reads from a manifest (SRC's own or a --baseline's), each value validated where it is read.

The manifest reader checks what every consumer needs (counts of the output, the schema, file paths); a stats
entry is only known to be a JSON value. So each value a rule uses is taken through one of these typed getters,
and a malformed one is an InputError naming the manifest file and the key path (`stats.class_counts_after.3`),
never a traceback and never a count of -100 taken as a share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from batchtool.core.errors import BatchtoolError, InputError
from batchtool.io.dataset import Dataset
from batchtool.io.manifest import MANIFEST_NAME, manifest_path

T = TypeVar("T")

MAX_COUNT = 2 ** 63
"""Counts are non-negative integers below this, as the manifest's own output counts."""


def json_shown(value: Any) -> str:
    """A JSON value as an error shows it (long ones cut)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{type(value).__name__} {text[:40]}..."


@dataclass(frozen=True)
class Recorded:
    """One mapping of a manifest's stats (the command's; for `run`, its last stage's over the run's), with where it
    sits in the file: `prefix` is its key path (`stats`, `stats.stages[2]`)."""

    path: str
    """The manifest file, for errors."""
    values: Mapping[str, Any]
    prefix: str
    under: Recorded | None = None
    """Looked up when a key is not in `values` (the run's own stats under its last stage's)."""

    @staticmethod
    def of(manifest: Mapping[str, Any], path: str) -> Recorded:
        """The stats that describe a batchtool output: the command's, or for `run` those of its last stage
        (whose batches, buckets and classes are what DST holds), over the run's own."""
        stats = manifest.get("stats")
        top = Recorded(path, stats if isinstance(stats, Mapping) else {}, "stats")
        stages = top.values.get("stages")
        if manifest.get("command") != "run" or not isinstance(stages, list) or not stages:
            return top
        last = f"stats.stages[{len(stages) - 1}]"
        if not isinstance(stages[-1], Mapping):
            raise top.wrong(last, stages[-1], "an object")
        return Recorded(path, stages[-1], last, top)

    def wrong(self, key_path: str, value: Any, expected: str) -> InputError:
        return InputError(f"{self.path}: {key_path} is {json_shown(value)}, expected {expected}")

    def find(self, key: str) -> tuple[Any, str] | None:
        """The value of `key` and its key path, or None when it is not recorded (absent or null)."""
        for layer in self._layers():
            if layer.values.get(key) is not None:
                return layer.values[key], f"{layer.prefix}.{key}"
        return None

    def _layers(self) -> Iterator[Recorded]:
        layer: Recorded | None = self
        while layer is not None:
            yield layer
            layer = layer.under

    def _read(self, key: str, read: Callable[[Any, str], T]) -> T | None:
        """`key`'s value as `read(value, key path)` validates it, or None when it is not recorded."""
        found = self.find(key)
        return None if found is None else read(*found)

    def _each(self, read: Callable[[Any, str], T]) -> Callable[[Any, str], list[T]]:
        """`read` of every item of a list."""
        return lambda value, at: [read(v, where) for v, where in self.items_at(value, at)]

    def has(self, key: str) -> bool:
        return self.find(key) is not None

    def count(self, key: str) -> int | None:
        return self._read(key, self.count_at)

    def share(self, key: str) -> float | None:
        return self._read(key, self.share_at)

    def text(self, key: str) -> str | None:
        return self._read(key, self._text_at)

    def _text_at(self, value: Any, at: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.wrong(at, value, "a non-empty string")
        return value

    def class_counts(self, key: str) -> dict[int, int] | None:
        """An object of counts keyed by class: {"0": 17, "3": 2} as {0: 17, 3: 2}."""
        return self._read(key, self._class_counts_at)

    def _class_counts_at(self, value: Any, at: str) -> dict[int, int]:
        if not isinstance(value, Mapping):
            raise self.wrong(at, value, "an object of class counts")
        out = {}
        for name, count in value.items():
            if not (isinstance(name, str) and name.isdigit() and name.isascii()):
                raise self.wrong(f"{at}.{name}", name, "a class: a non-negative integer key")
            out[int(name)] = self.count_at(count, f"{at}.{name}")
        return out

    def counts(self, key: str) -> list[int] | None:
        return self._read(key, self._each(self.count_at))

    def shares(self, key: str) -> list[float] | None:
        return self._read(key, self._each(self.share_at))

    def range(self, key: str) -> tuple[int, int | None] | None:
        """[low, high) edges: two counts, the high one null when unbounded."""
        return self._read(key, self.range_at)

    def ranges(self, key: str) -> list[tuple[int, int | None]] | None:
        """[low, high) edges per dimension (a two-length bucket cell's lengths)."""
        return self._read(key, self._each(self.range_at))

    def number(self, key: str) -> float | None:
        """A non-negative finite number (a batch cost)."""
        return self._read(key, self._number_at)

    def _number_at(self, value: Any, at: str) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value)
                                                                               and value >= 0):
            raise self.wrong(at, value, "a non-negative number")
        return float(value)

    def range_at(self, value: Any, at: str) -> tuple[int, int | None]:
        if not isinstance(value, list) or len(value) != 2:
            raise self.wrong(at, value, "[low, high] (high null when unbounded)")
        low = self.count_at(value[0], f"{at}[0]")
        return low, None if value[1] is None else self.count_at(value[1], f"{at}[1]")

    def objects(self, key: str) -> list[Recorded] | None:
        """A list of objects, each readable with these getters."""
        return self._read(key, self._each(self._object_at))

    def _object_at(self, value: Any, at: str) -> Recorded:
        if not isinstance(value, Mapping):
            raise self.wrong(at, value, "an object")
        return Recorded(self.path, value, at)

    def items_at(self, value: Any, at: str) -> list[tuple[Any, str]]:
        if not isinstance(value, list):
            raise self.wrong(at, value, "a list")
        return [(v, f"{at}[{i}]") for i, v in enumerate(value)]

    def count_at(self, value: Any, at: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_COUNT:
            raise self.wrong(at, value, "a non-negative integer")
        return value

    def share_at(self, value: Any, at: str) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value)
                                                                               and 0 <= value <= 1):
            raise self.wrong(at, value, "a number in [0, 1]")
        return float(value)


def recorded_stat(who: str, dataset: Dataset, key: str, writer: str,
                  error: type[BatchtoolError] = InputError) -> tuple[Recorded, Any, str]:
    """SRC's manifest stats, the value of `key` there and its key path, for a rule (`who`) that reads what `writer`
    records: an `error` where SRC has no manifest or its manifest does not record it (a UsageError, which stops the
    check, for a rule that only makes sense on that writer's output)."""
    manifest = dataset.manifest
    if manifest is None:
        raise error(f"{who}: {dataset.src} has no batchtool manifest ({MANIFEST_NAME}) to read stats.{key} "
                         f"from (check the output directory of {writer.replace(' and ', ' or ')})")
    recorded = Recorded.of(manifest, manifest_path(dataset.src))
    found = recorded.find(key)
    if found is None:
        raise error(f"{who}: {manifest_path(dataset.src)} records no stats.{key} (written by "
                         f"{manifest.get('command')!r}; {writer} output records it)")
    return recorded, *found


__all__ = ["MAX_COUNT", "Recorded", "json_shown", "recorded_stat"]
