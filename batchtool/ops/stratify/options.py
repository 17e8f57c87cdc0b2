"""stratify's options: the schema its command and pipeline keys are generated from, with the checks of
probabilities and of the number of classes that `tf.contrib.training.stratified_sample` makes."""

from __future__ import annotations

from dataclasses import dataclass

from batchtool.ops.base import OptionError

from batchtool.core.options import Choice, Column, Flag, Integer, option
from batchtool.ops.labels import MAX_CLASSES
from batchtool.ops.targets import Probs, Target, TargetSpec, check_probs, check_target

MODES = ("exact", "bernoulli", "online")


@dataclass(frozen=True)
class StratifyOptions:
    """What `stratify` computes."""

    label: str = option("Integer class column (values in [0, classes)).", Column(), "label")
    target: Target = option("Target proportions: P0,P1,... (numbers or exact fractions such as 1/3) or 'uniform' "
                            "or CLASS=PROB pairs (others get 0).", TargetSpec(), "uniform", required=True)
    mode: str = option("exact: floor(M*t_i) examples per class, M = min_i n_i/t_i (n_i: examples); bernoulli: "
                       "per-example acceptance as tf.contrib.training.stratified_sample; "
                       "online: class distribution estimated as the data streams.", Choice(MODES), "exact")
    init_probs: tuple[float, ...] | None = option(
        "Known class proportions of SRC (--mode bernoulli; default: counted in a first pass).", Probs(), None)
    num_classes: int | None = option("Number of classes (default: from --target, or the largest label + 1).",
                                     Integer(), None)
    replacement: bool = option("Upsample small classes instead of discarding large ones.", Flag(), False)
    size: int | None = option("Output examples (--replacement: default the input size; exact: at most M).",
                              Integer(), None)
    batch_size: int | None = option("Write batches (row groups) of this many rows.", Integer(), None)
    drop_remainder: bool = option("Drop the final batch if it is smaller than --batch-size.", Flag(), False)
    balanced_batches: bool = option("Every batch holds its exact share of each class, rows shuffled, batches in "
                                    "random order.", Flag(), False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionError("mode", f"expected one of {', '.join(MODES)}", value=repr(self.mode))
        check_target(self.target)
        if self.init_probs is not None:
            if self.mode != "bernoulli":
                raise OptionError("init_probs", f"{{init_probs}} applies to {{mode}} bernoulli ({{mode}} {self.mode} "
                                  + ("counts the classes first)" if self.mode == "exact" else "estimates them)"),
                                  mentions=["mode"])
            check_probs(self.init_probs, "init_probs")
        if self.num_classes is not None and self.num_classes < 1:
            raise OptionError("num_classes", "must be at least 1", value=str(self.num_classes))
        self._check_class_counts()
        if self.replacement and self.mode == "online":
            raise OptionError("replacement", "{replacement} needs the class counts: use {mode} exact or bernoulli",
                              mentions=["mode"])
        if self.mode == "online":
            self.known_classes()
        if self.replacement and self.init_probs is not None:
            raise OptionError("init_probs", "{replacement} counts the classes itself; drop {init_probs}",
                              mentions=["replacement"])
        if self.size is not None and (self.size < 1 or (self.mode != "exact" and not self.replacement)):
            raise OptionError("size", "must be >= 1, with {mode} exact or {replacement}", value=str(self.size),
                              mentions=["mode", "replacement"])
        if self.batch_size is not None and self.batch_size < 1:
            raise OptionError("batch_size", "must be at least 1", value=str(self.batch_size))
        if (self.balanced_batches or self.drop_remainder) and self.batch_size is None:
            name = "balanced_batches" if self.balanced_batches else "drop_remainder"
            raise OptionError(name, f"{{{name}}} needs {{batch_size}}", mentions=["batch_size"])

    def _check_class_counts(self) -> None:
        """--target list, --num-classes and --init-probs must agree on the number of classes, at most MAX_CLASSES."""
        named = max(self.target) + 1 if isinstance(self.target, dict) and self.target else 0
        for name, n in (("num_classes", self.num_classes or 0), ("target", named)):
            if n > MAX_CLASSES:
                raise OptionError(name, f"{n:,} classes; at most {MAX_CLASSES:,} (every chunk counts its labels "
                                  "per class)")
        sizes = {name: n for name, n in (
            ("target", len(self.target) if isinstance(self.target, tuple) else None),
            ("num_classes", self.num_classes),
            ("init_probs", len(self.init_probs) if self.init_probs is not None else None)) if n is not None}
        if len(set(sizes.values())) > 1:
            raise OptionError(next(iter(sizes)), "the number of classes disagrees: "
                              + ", ".join(f"{{{name}}} gives {n}" for name, n in sizes.items()), mentions=list(sizes))
        if isinstance(self.target, dict) and sizes and max(self.target) >= min(sizes.values()):
            raise OptionError("target", f"{{target}} names class {max(self.target)} but there are only "
                              f"{min(sizes.values())} classes (0..{min(sizes.values()) - 1})")

    def known_classes(self) -> int | None:
        """The number of classes if the options fix it (else the counting pass finds it)."""
        if isinstance(self.target, tuple):
            return len(self.target)
        if self.num_classes is not None:
            return self.num_classes
        if self.init_probs is not None:
            return len(self.init_probs)
        if self.mode == "online" and isinstance(self.target, dict):
            return max(self.target) + 1
        if self.mode == "online":
            raise OptionError("target", "{target} uniform with {mode} online needs {num_classes} "
                              "(there is no counting pass to find the classes)", mentions=["mode", "num_classes"])
        return None

    @property
    def needs_counts(self) -> bool:
        return self.mode == "exact" or (self.mode == "bernoulli" and self.init_probs is None)


__all__ = ["MODES", "StratifyOptions"]
