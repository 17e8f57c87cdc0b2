"""What bucket reports: the rows and padding of every bucket as its batches are formed, the manifest's statistics
made from them, and the lines its command prints about boundaries chosen and classes balanced."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchtool.ops.boundaries import efficiency, expected_efficiency, quantile_boundaries
from batchtool.ops.bucket.grid import Grid
from batchtool.ops.bucket.plan import Balance, BucketPlan, batchable_counts


@dataclass
class BucketCounts:
    """What was written and dropped, per bucket; filled by the one thread that scatters and forms batches."""

    examples: np.ndarray
    batches: np.ndarray
    real: np.ndarray
    padded: np.ndarray
    cost: np.ndarray
    """Two --length: the largest batch cost per cell."""
    rows_in: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: {"keep": 0, "oversize": 0, "remainder": 0})
    balance: Balance | None = None
    shares: list[np.ndarray] = field(default_factory=list)
    """--balance: (smallest, largest) share of each class over the full batches written."""

    @classmethod
    def zeros(cls, num_buckets: int) -> BucketCounts:
        return cls(*(np.zeros(num_buckets, dtype=np.int64) for _ in range(4)), np.zeros(num_buckets))

    def bucket_rows(self, plan: BucketPlan) -> list[dict[str, Any]]:
        rows = []
        for b in range(len(self.examples)):
            row: dict[str, Any] = {"bucket": b}
            if plan.boundaries is not None:
                edges = (0, *plan.boundaries, None)
                row["lengths"] = [edges[b], edges[b + 1]]
            if plan.grid is not None:
                row.update(cell=list(plan.grid.position(b)), lengths=plan.grid.edges(b))
            row.update(examples=int(self.examples[b]), batches=int(self.batches[b]), real_elements=int(self.real[b]),
                       padded_elements=int(self.padded[b]),
                       padding_efficiency=efficiency(int(self.real[b]), int(self.padded[b])))
            if plan.grid is not None:
                row["max_batch_cost"] = _number(self.cost[b])
            if self.balance is not None:
                row.update(self.balance_row(b))
            rows.append(row)
        return rows

    def balance_row(self, b: int) -> dict[str, Any]:
        """--balance: one bucket's rows per class in and out, dropped and repeated, and its batch size."""
        assert self.balance is not None
        available, written = self.balance.available[b], self.balance.written[b]
        layout = self.balance.layouts[b]
        return {"batch_rows": layout.batch_size, "balanced_batches": layout.batches,
                "partial_batch_quotas": [int(q) for q in layout.partial] if sum(layout.partial) else None,
                "class_rows_in": available.tolist(), "class_rows_out": written.tolist(),
                "class_dropped": np.maximum(available - written, 0).tolist(),
                "class_repeated": np.maximum(written - available, 0).tolist()}

    def balance_summary(self) -> dict[str, Any]:
        """manifest["stats"]["balance"]: the target, class totals and the class shares over batches."""
        assert self.balance is not None
        bal = self.balance
        written, available = bal.written.sum(axis=0), bal.available.sum(axis=0)
        low, high = self.shares or [np.zeros(bal.num_classes)] * 2
        return {"label": bal.label, "num_classes": bal.num_classes, "target": bal.target.tolist(),
                "oversample": bal.oversample, "class_rows_in": available.tolist(), "class_rows_out": written.tolist(),
                "examples_repeated": int(np.maximum(bal.written - bal.available, 0).sum()),
                "batch_share_min": [round(float(v), 6) for v in low],
                "batch_share_max": [round(float(v), 6) for v in high]}


def bucket_stats(plan: BucketPlan, counts: BucketCounts) -> dict[str, Any]:
    """manifest["stats"]: boundaries, per-bucket table, overall padding efficiency, what was dropped."""
    real, padded = int(counts.real.sum()), int(counts.padded.sum())
    out: dict[str, Any] = {
        "rows_in": counts.rows_in,
        "lengths_in": plan.first.stats.length_summary(),
        "boundaries": list(plan.boundaries) if plan.boundaries is not None else None,
        "num_buckets": plan.num_buckets,
        "batches": int(counts.batches.sum()),
        "real_elements": real,
        "padded_elements": padded,
        "padding_efficiency": efficiency(real, padded),
        "examples_dropped": dict(counts.dropped),
        "buckets": counts.bucket_rows(plan),
    }
    if counts.balance is not None:
        out["balance"] = counts.balance_summary()
    if plan.grid is not None:
        out.update(_grid_stats(plan, plan.grid, counts))
        return out
    if plan.options.auto_buckets is not None:
        out["auto_buckets"] = auto_bucket_report(batchable_counts(plan.first.stats, plan.options), plan.boundaries,
                                                 plan.options.auto_buckets)
    return out


def _grid_stats(plan: BucketPlan, grid: Grid, counts: BucketCounts) -> dict[str, Any]:
    """Two --length: the grid's boundaries (the first length's, then the second's in each first-length bucket)
    and cells per first-length bucket, the largest batch cost and the budget, and what the grid was chosen by
    (every row padded to its buckets' longest lengths) next to what the batches padded."""
    limit = grid.budget
    real = int(grid.cell_steps().sum())
    return {"boundaries": [list(grid.first), [list(b) for b in grid.second]], "grid": grid.shape,
            "max_batch_cost": _number(counts.cost.max(initial=0)),
            "cost": {"model": "coefficients" if limit.coefficients else limit.cost,
                     "coefficients": list(limit.coefficients) if limit.coefficients else None,
                     "max_tokens": limit.max_tokens},
            "auto_buckets": {"k": plan.options.auto_buckets,
                             "expected_padding_efficiency": efficiency(real, grid.bound())}}


def _number(value: float) -> int | float:
    """A cost as the manifest records it: an integer when it is one."""
    return int(value) if float(value).is_integer() else round(float(value), 6)


def auto_bucket_report(length_counts: np.ndarray, boundaries: Sequence[int], k: int) -> dict[str, Any]:
    """The chosen boundaries' expected efficiency (every example padded to its bucket's longest), next to
    k equal-count quantile buckets'."""
    quantiles = quantile_boundaries(length_counts, k)
    return {"k": k, "expected_padding_efficiency": expected_efficiency(length_counts, boundaries),
            "quantile_boundaries": list(quantiles),
            "quantile_expected_padding_efficiency": expected_efficiency(length_counts, quantiles)}


def summary_lines(stats: dict[str, Any]) -> list[str]:
    """The command's lines before its report: the boundaries --auto-buckets chose, and with --balance a warning
    when it dropped most rows and what it balanced."""
    lines = []
    auto = stats.get("auto_buckets")
    if auto and "grid" in stats:
        first, second = stats["boundaries"]
        edges = "; ".join(",".join(map(str, b)) or "-" for b in second)
        lines.append(f"auto-buckets: {sum(stats['grid'])} cells, first length {','.join(map(str, first)) or '-'}, "
                     f"second length per first-length bucket {edges} (-: not cut); expected padding efficiency "
                     f"{percent(auto['expected_padding_efficiency'])}; largest batch cost {stats['max_batch_cost']:,}")
    elif auto:
        lines.append(f"auto-buckets: boundaries {','.join(map(str, stats['boundaries'])) or '(one bucket)'}; "
                     f"expected padding efficiency {percent(auto['expected_padding_efficiency'])} "
                     f"({auto['k']} quantile buckets: {percent(auto['quantile_expected_padding_efficiency'])})")
    if "balance" in stats:
        unbalanced = stats["examples_dropped"]["unbalanced"]
        if unbalanced > stats["rows_in"] / 2:
            lines.append(f"warning: --balance dropped {unbalanced / stats['rows_in']:.1%} of the examples "
                         f"({unbalanced:,} of {stats['rows_in']:,}: no balanced batch could take them); "
                         "--oversample repeats rarer classes instead")
        lines.append(balance_line(stats["balance"]))
    return lines


def balance_line(balance: dict[str, Any]) -> str:
    """--balance: rows per class in and out, and each class's smallest and largest share of a batch."""
    shares = ", ".join(f"{c}: {percent(lo)}-{percent(hi)}" for c, (lo, hi) in
                       enumerate(zip(balance["batch_share_min"], balance["batch_share_max"])))
    rows = ", ".join(f"{c}: {i:,}->{o:,}" for c, (i, o) in
                     enumerate(zip(balance["class_rows_in"], balance["class_rows_out"])))
    repeated = f"; {balance['examples_repeated']:,} repeated" if balance["examples_repeated"] else ""
    return f"balanced by {balance['label']}: rows per class {rows}{repeated}; share of each batch {shares}"


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
