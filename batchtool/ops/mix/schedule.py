"""mix's --schedule: weights as a piecewise-linear or stepwise function of what has been handed out (rows or
tokens), read from a small TOML file, and their integral, which the quota batches follow (ops.quotas.Curve)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchtool.core.errors import UsageError
from batchtool.core.tomlfile import read_toml
from batchtool.io.manifest_reader import read_manifest
from batchtool.ops.quotas import Constant, Curve

INTERPOLATIONS = ("linear", "step")
KEYS = {"interpolation", "point", "total", "source"}
CAP_KEYS = {"max-repeats", "max-fraction"}


@dataclass(frozen=True)
class Point:
    """The weights from `at` on (normalised to sum to 1 at each point)."""

    at: int
    weights: tuple[float, ...]


@dataclass(frozen=True)
class Schedule:
    """Points of (position, weights) in source order, how weights go between them, an optional total, and per
    source caps on how much of it may be used (`max_repeats` times its rows, or `max_fraction` of them)."""

    path: str
    points: tuple[Point, ...]
    interpolation: str = "linear"
    total: int | None = None
    max_repeats: tuple[float | None, ...] = ()
    max_fraction: tuple[float | None, ...] = ()

    def curve(self) -> ScheduleCurve:
        return ScheduleCurve(self)

    def caps(self, rows: np.ndarray, replacement: bool) -> np.ndarray:
        """The documents each source may give: its rows once (with --replacement, any number of times), at most
        max-repeats times its rows and max-fraction of them."""
        caps = []
        for i, n in enumerate(rows.tolist()):
            cap = math.inf if replacement else n
            repeats = self.max_repeats[i] if self.max_repeats else None
            fraction = self.max_fraction[i] if self.max_fraction else None
            if repeats is not None:
                cap = min(cap, math.floor(n * repeats))
            if fraction is not None:
                cap = min(cap, math.floor(n * fraction))
            caps.append(cap)
        return np.array([min(c, np.iinfo(np.int64).max // 2) for c in caps], dtype=np.int64)


@dataclass(frozen=True)
class ScheduleCurve:
    """A schedule's integral: each source's cumulative target at a position (ops.quotas.Curve)."""

    schedule: Schedule

    def at(self, position: int) -> np.ndarray:
        """The integral of each source's weight from 0 to `position`: the first point's weights before it, the
        last's after it, between points linear (the trapezoid, exact) or stepwise."""
        points = self.schedule.points
        total = min(position, points[0].at) * np.asarray(points[0].weights)
        for left, right in zip(points, points[1:]):
            if position <= left.at:
                break
            end = min(position, right.at)
            ends = np.asarray(left.weights) if self.schedule.interpolation == "step" else self.weights(end)
            total = total + (end - left.at) * (np.asarray(left.weights) + ends) / 2
        if position > points[-1].at:
            total = total + (position - points[-1].at) * np.asarray(points[-1].weights)
        return total

    def weights(self, position: float) -> np.ndarray:
        """The weights in effect at a position."""
        points = self.schedule.points
        if position <= points[0].at:
            return np.asarray(points[0].weights)
        for left, right in zip(points, points[1:]):
            if position <= right.at:
                if self.schedule.interpolation == "step":
                    return np.asarray(left.weights if position < right.at else right.weights)
                f = (position - left.at) / (right.at - left.at)
                return (1 - f) * np.asarray(left.weights) + f * np.asarray(right.weights)
        return np.asarray(points[-1].weights)

    def over(self, position: int, size: int) -> np.ndarray:
        return self.at(position + size) - self.at(position)


@dataclass(frozen=True)
class Replan:
    """mix --continue DST --at STEP: DST's plan (its weights or schedule, as its manifest records them), kept for
    its first STEP batches; the new options' plan follows from there."""

    dst: str
    at: int
    seed: int
    batch_size: int
    batches: int
    """DST's batches (STEP may be at most this)."""
    target: tuple[float, ...]
    schedule: dict[str, Any] | None = None

    def curve(self) -> Curve:
        """DST's curve: its constant target, or its schedule rebuilt from the recorded (normalised) points."""
        if self.schedule is None:
            return Constant(np.asarray(self.target))
        points = tuple(Point(p["at"], tuple(p["weights"].values())) for p in self.schedule["points"])
        return Schedule(self.schedule["path"], points, self.schedule["interpolation"]).curve()


def replan_from(dst: str, at: int, names: tuple[str, ...], by: str) -> Replan:
    """The plan of DST, a mix by --schedule or --by tokens of the same sources (by name) and --by: one UsageError
    otherwise."""
    manifest = read_manifest(dst)
    stats = (manifest or {}).get("stats") or {}
    options = (manifest or {}).get("options") or {}
    if manifest is None or manifest.get("command") != "mix" or "target" not in stats:
        raise UsageError(f"--continue {dst}: not the output of a batchtool mix with --schedule or --by tokens")
    if tuple(options.get("names") or ()) != names:
        raise UsageError(f"--continue {dst}: its sources are {', '.join(options.get('names') or ())}, not "
                         f"{', '.join(names)}")
    if options.get("by") != by:
        raise UsageError(f"--continue {dst}: it was mixed --by {options.get('by')}, not --by {by}")
    batches, remainder = int(stats.get("balanced_batches", 0)), sum(stats.get("final_batch_quotas") or ())
    full = batches - bool(remainder)
    if at < 0 or at > full:
        cut = " (and its last, which its end cut short: a batch of a plan that ended there)" if remainder else ""
        raise UsageError(f"--at {at}: {dst} has {full:,} full batches{cut}; continue at one of 0..{full:,}")
    return Replan(dst, at, int(manifest.get("seed") or 0), int(stats["batch_size"]),
                  int(stats["balanced_batches"]), tuple(stats["target"]), stats.get("schedule"))


def _error(path: str, key: str, message: str) -> UsageError:
    return UsageError(f"{path}: {key}: {message}")


def _number(path: str, key: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or (positive and value <= 0):
        raise _error(path, key, f"expected a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def read_schedule(path: str, names: tuple[str, ...]) -> Schedule:
    """The schedule in `path` for sources `names`: one UsageError naming the file and key for anything wrong."""
    doc = read_toml(path, "schedule file")
    unknown = sorted(set(doc) - KEYS)
    if unknown:
        raise _error(path, unknown[0], f"unknown key (a schedule has {', '.join(sorted(KEYS))})")
    interpolation = doc.get("interpolation", "linear")
    if interpolation not in INTERPOLATIONS:
        raise _error(path, "interpolation", f"expected one of {', '.join(INTERPOLATIONS)}, got {interpolation!r}")
    total = doc.get("total")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 1):
        raise _error(path, "total", f"expected an integer >= 1, got {total!r}")
    raw = doc.get("point")
    if not isinstance(raw, list) or not raw or not all(isinstance(p, dict) for p in raw):
        raise _error(path, "point", "expected [[point]] tables, each with at = N and weights = { NAME = W, ... }")
    points = []
    for n, table in enumerate(raw, 1):
        where = f"point {n}"
        extra = sorted(set(table) - {"at", "weights"})
        if extra:
            raise _error(path, f"{where}.{extra[0]}", "unknown key (a point has at and weights)")
        at = table.get("at")
        if isinstance(at, bool) or not isinstance(at, int) or at < 0:
            raise _error(path, f"{where}.at", f"expected an integer >= 0, got {at!r}")
        if points and at <= points[-1].at:
            raise _error(path, f"{where}.at", f"{at} is not after the previous point's {points[-1].at}")
        weights = table.get("weights")
        if not isinstance(weights, dict):
            raise _error(path, f"{where}.weights", "expected a table { NAME = W, ... }")
        stray = next((k for k in weights if k not in names), None)
        if stray is not None:
            raise _error(path, f"{where}.weights.{stray}", f"no source is named {stray!r} (sources: "
                         f"{', '.join(names)})")
        values = [_number(path, f"{where}.weights.{name}", weights.get(name, 0)) for name in names]
        if not sum(values):
            raise _error(path, f"{where}.weights", "every weight is 0: give one source a weight")
        points.append(Point(at, tuple(v / sum(values) for v in values)))
    repeats, fractions = _caps(path, doc.get("source", {}), names)
    return Schedule(path, tuple(points), interpolation, total, repeats, fractions)


def _caps(path: str, table: Any, names: tuple[str, ...]) -> tuple[tuple[float | None, ...], tuple[float | None, ...]]:
    """The caps of the schedule file's source tables: max-repeats and max-fraction per source."""
    if not isinstance(table, dict):
        raise _error(path, "source", "expected [source.NAME] tables")
    repeats: list[float | None] = [None] * len(names)
    fractions: list[float | None] = [None] * len(names)
    for name, caps in table.items():
        if name not in names:
            raise _error(path, f"source.{name}", f"no source is named {name!r} (sources: {', '.join(names)})")
        if not isinstance(caps, dict):
            raise _error(path, f"source.{name}", "expected a table with max-repeats or max-fraction")
        extra = sorted(set(caps) - CAP_KEYS)
        if extra:
            raise _error(path, f"source.{name}.{extra[0]}", f"unknown key (caps are {', '.join(sorted(CAP_KEYS))})")
        i = names.index(name)
        if "max-repeats" in caps:
            repeats[i] = _number(path, f"source.{name}.max-repeats", caps["max-repeats"], positive=True)
        if "max-fraction" in caps:
            fractions[i] = _number(path, f"source.{name}.max-fraction", caps["max-fraction"], positive=True)
    return tuple(repeats), tuple(fractions)


__all__ = ["INTERPOLATIONS", "Point", "Replan", "Schedule", "ScheduleCurve", "read_schedule", "replan_from"]
