"""Target class proportions, shared by the ops that balance classes (stratify, bucket --balance) and check's
class_proportions rule: parsed from --target, checked as `tf.contrib.training.stratified_sample` checks them, made a
vector per class."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Union

from batchtool.core.errors import OptionError, OptionInputError
from batchtool.core.options import Value
from batchtool.core.options import shown as shown_value

if TYPE_CHECKING:  # arrays are imported where the functions run: options declared from here make --help
    import numpy as np

PROB_TOLERANCE = 1e-6
"""How far from 1 a list of probabilities may sum (`tf.contrib.training.stratified_sample`'s tolerance)."""


Target = Union[str, tuple[float, ...], dict[int, float]]
"""Target class proportions: uniform, one per class, or CLASS=PROB pairs (others 0)."""


def _probability(text: str) -> float | None:
    """'0.25', or an exact fraction '1/3' (so that thirds sum to one); None if it is neither."""
    numerator, slash, denominator = text.partition("/")
    try:
        return float(numerator) / float(denominator) if slash else float(text)
    except (ValueError, ZeroDivisionError):
        return None


def parse_probs(text: str, field: str) -> tuple[float, ...]:
    """'0.5,0.3,0.2' -> (0.5, 0.3, 0.2); '1/3,2/3' -> (0.333..., 0.666...)."""
    probs = tuple(_probability(p) for p in text.split(",") if p.strip())
    if None in probs:
        raise OptionError(field, "expected comma-separated probabilities, e.g. 0.5,0.3,0.2 or 1/3,1/3,1/3",
                          value=repr(text))
    return probs  # type: ignore[return-value]


def parse_target(text: str) -> Target:
    """--target: 'uniform', 'P0,P1,...' or 'class=prob' pairs such as '0=0.5,3=0.5' (unnamed classes get 0)."""
    text = text.strip()
    if text.lower() == "uniform":
        return "uniform"
    if "=" not in text:
        return parse_probs(text, "target")
    pairs: dict[int, float] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = item.partition("=")
        try:
            cls = int(name)
        except ValueError:
            cls = None
        prob = _probability(value)
        if not sep or cls is None or prob is None or cls < 0 or cls in pairs:
            raise OptionError("target", f"{item!r} is not a new CLASS=PROB pair with CLASS an integer >= 0",
                              value=repr(text))
        pairs[cls] = prob
    return pairs


def check_probs(values: Iterable[float], name: str) -> None:
    """`stratified_sample`'s checks: probabilities >= 0 that sum to one within PROB_TOLERANCE (field `name`)."""
    values = list(values)
    shown = ",".join(f"{v:g}" for v in values)
    if not values:
        raise OptionError(name, "no probabilities given")
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v >= 0):
            raise OptionError(name, f"probabilities must be >= 0 (value {i} is {v:g})", value=shown)
    total = math.fsum(values)
    if abs(total - 1.0) > PROB_TOLERANCE:
        raise OptionError(name, f"probabilities sum to {total:.9g}, expected 1 (tolerance {PROB_TOLERANCE:g}); "
                          "fractions such as 1/3 are exact", value=shown)


def check_target(target: Target, name: str = "target") -> None:
    """A target's checks, as `stratified_sample` makes them: 'uniform', or probabilities that check_probs takes."""
    if isinstance(target, str):
        if target != "uniform":
            raise OptionError(name, "expected 'uniform', P0,P1,... or CLASS=PROB pairs", value=repr(target))
        return
    check_probs(target.values() if isinstance(target, dict) else target, name)


def _probs_text(field: str, value: Any) -> str:
    """A pipeline file's probabilities as the command line's text: a list of numbers, or a string."""
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in value):
        return ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise OptionError(field, f"expected a list of probabilities or a string, got {shown_value(value)}")
    return value


class TargetSpec(Value):
    """--target: 'uniform', P0,P1,... or CLASS=PROB pairs; in a pipeline file also a list or a table."""

    metavar = "SPEC"

    def parse(self, field: str, value: Any) -> Target:
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        return parse_target(_probs_text(field, value))


class Probs(Value):
    """P0,P1,...: class proportions (a list of numbers in a pipeline file)."""

    metavar = "P0,P1,..."

    def parse(self, field: str, value: Any) -> tuple[float, ...]:
        return parse_probs(_probs_text(field, value), field)


def target_vector(target: Target, num_classes: int) -> np.ndarray:
    """Target proportions per class, normalised to sum to exactly 1 (after the tolerance check)."""
    import numpy as np

    if isinstance(target, str):
        t = np.full(num_classes, 1.0 / num_classes)
    elif isinstance(target, dict):
        t = np.zeros(num_classes)
        for cls, prob in target.items():
            t[cls] = prob
    else:
        t = np.asarray(target, dtype=np.float64)
    return t / t.sum()


def check_zero_classes(init_probs: np.ndarray, target: np.ndarray, counted: str | None = None) -> None:
    """`stratified_sample`'s error: a class with zero initial probability cannot reach a non-zero target.
    `counted` says where the probabilities were counted (None: --init-probs gives them)."""
    import numpy as np

    for i in np.flatnonzero((init_probs <= 0) & (target > 0)):
        raise (OptionError if counted is None else OptionInputError)(
            "target", f"class {i} has initial probability 0 ({counted or '{init_probs}'}) but {{target}} gives it "
            f"{target[i]:g}: a class with no examples cannot be sampled", mentions=("init_probs",))


