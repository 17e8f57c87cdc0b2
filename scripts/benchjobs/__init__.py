"""Benchmark jobs, one module per concern; each defines `jobs(ctx) -> list[Job]` (see scripts/bench.py)."""
